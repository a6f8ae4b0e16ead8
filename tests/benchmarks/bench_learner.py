"""Benchmark 5: learner throughput of one StableDRL step at the ~1.5B shape (Qwen2-1.5B dims, Dream
family: bidirectional Qwen2 with an untied head, 1.78B parameters; ``--shape llada-8b`` for LLaDA-8B,
``--layers`` to keep fewer), DeepSpeed ZeRO-2 and ZeRO-3,
bf16, sdpa, activation checkpointing on and off, on 1 or more GPUs (one process per GPU, the
project's ``LearnerEngine`` over ``stabledrl.learner.group.init_learner_group``).

One step = ``groups_per_step`` groups of G samples per rank [prompt 128 | completion 256], in
micro-batches of ``--micro-batch-groups`` k groups (k = 1: 4 micro-batches of G; k = 2: 2 of 2G;
k = 4: one of 4G; a k that does not divide groups_per_step rounds the step up to a multiple of k,
e.g. k = 3: 6 groups in 2 micro-batches of 3G; a comma list runs each k on the same engine,
smallest first, parts suffixed ``_mb<k>``; bigger micro-batches feed bigger matrix products and pay
the per-micro-batch costs (Python, ZeRO hooks, gradient copies) less often, for memory: a k that
runs out of it is recorded and the larger ones are skipped); the loss re-estimates log-likelihoods
with ``elbo_mc`` (2 Monte-Carlo masks, both in one forward of 2G rows, per-masked-token mean as
released) and applies ``stabledrl`` (C = 5) against behaviour estimates given with the batch;
backward; clip; AdamW.

Model FLOPs per micro-batch: F = one forward of 2G rows x 384 tokens (Linear layers, the head over
the scored positions: 128 of the 256 completion positions in expectation, as the scoring pass runs
the head there only; attention 384 x 384), training = 3F (forward + backward); with
checkpointing the hardware also recomputes the forward (4F: reported as HFU, not MFU).
MFU = model FLOPs / step seconds / (ranks x peak), against the card's measured matmul rate and
against the nominal 989 TFLOP/s (H100 SXM / H200 bf16 dense). ZeRO-3 runs also time gathering the
full weights from the shards (``named_parameters_for_push``: the learner side of a weight push).

Stage ``3t`` is ZeRO-3 with settings tuned for a model that fits (an experiment: the project's
defaults are in learner/zero.py): overlap_comm, stage3_prefetch_bucket_size 2e8 elements (about
4 layers ahead instead of less than one), stage3_param_persistence_threshold 1e6 (the small
projections stay gathered), stage3_max_live_parameters / max_reuse_distance 1e9.
The optimizer is the project's (learner/zero.build_optimizer: torch AdamW under DeepSpeed ZeRO,
``fused=True`` on CUDA, measured against foreach as stage ``2f``): it steps on DeepSpeed's flat
fp32 partitions (one tensor per parameter group). Stage ``2t`` is a benchmark-only experiment on
top of ZeRO-2 (the project's defaults stay in learner/): ``overlap_comm`` (gradient bucket copies
on a side stream, overlapped with the backward). Stage ``2c`` is ZeRO-2 with DeepSpeed's bf16 test of
every gradient tensor for inf/NaN before the step, which the project leaves out (learner/zero.py):
each setting's ``optimizer_s_mean`` is the seconds of DeepSpeed's step.
``--compile off,on`` times every setting eager, then again with ``learner.compile`` (the norms, the
attention's rotation and the gated activation fused, learner/fused.py) on the same engine, parts
suffixed ``_compiled``; ``norms`` (before ``on``: ``--compile norms,on``) fuses the norms and the
activation but rotates eagerly, parts suffixed ``_compiled_norms``: the before of the rotation's fusion.
``--profile STAGE`` runs torch.profiler over one more step of that stage's first setting: wall vs
GPU-busy time per step, the top kernels and host ops (what explains the rest of the step). Stages
``2o`` and ``3o`` offload to the CPU as ``learner.deepspeed.offload_optimizer: cpu`` does (``3o``
with ``offload_params: cpu`` too): the same step with the optimizer on the host.

d1's learner (``--estimator mean_field --lora 128 --group-size 6 --groups-per-step 2``, LLaDA-8B): one
forward per row with the completion masked (15% of the prompt too), GRPO's token loss, LoRA r 128
on LLaDA's q/k/v_proj and up_proj (alpha 64, dropout 0.05); model FLOPs 2F (the frozen base takes
no weight gradients), the head over the whole completion. ``--micro-batch-groups 1,2`` times
d1's 6-row forwards against 12-row ones (``learner.micro_batches_per_forward``), and
``--checkpointing on,16,off`` every layer checkpointed, the first 16 (``model.checkpointed_layers``),
none.

TraDo / SDAR (``--estimator staircase``, with ``--shape sdar-8b --layers 11`` the system benchmark's
learner): each micro-batch of G rows is one staircase forward over ``[prompt | clean | noisy]``
(P + 2C tokens; TraDo's masking range 0.1-0.9, one draw), prompts left-padded to random lengths in
[P/2, P]. ``--staircase-attention sdpa,flex`` runs the same engine with the dense boolean mask
through sdpa, then with the flex BlockMask (``model.staircase_attention``), parts suffixed
``_sdpa`` / ``_flex``: the before and after of one run. Their MFU is given twice: by the job's
formula (``mfu_job_formula``: 6 x parameters x the real prompt and completion tokens, what
perf/mfu logs) and over the tokens the staircase forward feeds (``mfu_vs_measured_matmul``: P + 2C
per row, attention over half the keys).

    python tests/benchmarks/bench_learner.py --world 1 --peak-from matmul.json --out learner1.json
    python tests/benchmarks/bench_learner.py --world 2 --peak-from matmul.json --out learner2.json
    python tests/benchmarks/bench_learner.py --tiny --world 2 --out learner2.json   # CPU, gloo
    python tests/benchmarks/bench_learner.py --shape llada-8b --stages 2 --estimator mean_field --lora 128 \
        --group-size 6 --groups-per-step 2 --micro-batch-groups 1,2 --checkpointing on,16,8,off --compile on
    python tests/benchmarks/bench_learner.py --shape sdar-8b --layers 11 --estimator staircase \
        --staircase-attention sdpa,flex --stages 3 --checkpointing on --gen 512 --peak-from matmul.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import benchlib as bl
import torch


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--world", type=int, default=1, help="learner ranks (one GPU each)")
    ap.add_argument("--stages", default="2,3", help="comma list of 2, 3, 3t (ZeRO-3 tuned), "
                    "2t (ZeRO-2 + overlap_comm), 2c (ZeRO-2 + DeepSpeed's per-tensor overflow test), 2o / 3o "
                    "(CPU offload); see above")
    ap.add_argument("--profile", default=None, help="profile one step of this stage's first setting (e.g. 2t)")
    ap.add_argument("--micro-batch-groups", default="1", help="comma list of groups per micro-batch")
    ap.add_argument("--checkpointing", default="on,off", help="activation checkpointing settings, in order: on, off, "
                    "or N (the first N decoder layers checkpointed, model.checkpointed_layers)")
    ap.add_argument("--compile", default="off", help="learner.compile settings, in order: off, on, off,on, "
                    "norms,on or off,norms,on (norms: the rotation eager) "
                    "(the same engine: on fuses its norms and activation in place, after the off settings)")
    ap.add_argument("--group-size", type=int, default=8, help="G: samples per group = per micro-batch")
    ap.add_argument("--groups-per-step", type=int, default=4, help="micro-batches per rank per step")
    ap.add_argument("--prompt", type=int, default=None, help="default 128; 16 tiny")
    ap.add_argument("--gen", type=int, default=None, help="default 256; 32 tiny")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per setting (after one warm-up step)")
    ap.add_argument("--shape", default=None, help="benchlib SHAPES name (default qwen2-1.5b; tiny-qwen2 with --tiny, "
                    "tiny-sdar with --tiny and --estimator staircase; llada-8b: the 8B ZeRO-3 learner across ranks)")
    ap.add_argument("--layers", type=int, default=None, help="keep this many layers of the shape")
    ap.add_argument("--estimator", choices=("elbo_mc", "staircase", "mean_field"), default="elbo_mc",
                    help="elbo_mc: 2 masks of a full-attention family; staircase: block diffusion (TraDo); "
                    "mean_field: d1's learner (one forward, the completion masked, GRPO's token loss)")
    ap.add_argument("--lora", type=int, default=0, help="LoRA rank (0: full training); d1's adapters: alpha = r/2, "
                    "dropout 0.05, LLaDA's q/k/v_proj and up_proj (llada shapes) or q/k/v/up_proj")
    ap.add_argument("--staircase-attention", default="sdpa",
                    help="comma list of model.staircase_attention settings to run (staircase only): sdpa, flex")
    ap.add_argument("--peak-from", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)  # child mode
    ap.add_argument("--addr", default="127.0.0.1", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.shape is None:
        staircase = a.estimator == "staircase"
        a.shape = ("tiny-sdar" if staircase else "tiny-qwen2") if a.tiny else ("sdar-8b" if staircase else "qwen2-1.5b")
    if a.shape not in bl.SHAPES or a.tiny != a.shape.startswith("tiny-"):
        ap.error(f"--shape {a.shape!r}: one of {', '.join(s for s in bl.SHAPES if s.startswith('tiny-') == a.tiny)}")
    a.prompt = a.prompt or (16 if a.tiny else 128)
    a.gen = a.gen or (32 if a.tiny else 256)
    return a


# ---- the parent: one process per rank, a fresh set of processes per ZeRO stage ------------------
def launch(a: argparse.Namespace) -> int:
    """Each stage runs in processes of its own: a DeepSpeed engine is never torn down and rebuilt
    in one process (whatever it leaves behind cannot inflate the next stage's memory)."""
    res = bl.Result(f"learner_{a.world}gpu", a.out, vars(a), echo=False, probe=False)
    worst = 0
    for stage in a.stages.split(","):
        part_file = Path(a.out or f"/tmp/bench_learner_{os.getpid()}.json").with_suffix(f".zero{stage}.json")
        part_file.unlink(missing_ok=True)
        listeners, (port,) = bl.rendezvous_ports(1)
        codes = bl.launch_ranks(__file__, lambda r: [*sys.argv[1:], "--stages", stage, "--rank", str(r), "--port",
                                                      str(port), "--out", str(part_file) if r == 0 else ""], a.world,
                                listeners)
        worst = max(worst, *codes)
        try:
            data = json.loads(part_file.read_text())
        except (OSError, ValueError):
            data = {}
        res.data["environment"] = data.get("environment") or res.data["environment"]
        for name, values in (data.get("parts") or {}).items():
            res.put(name, values)
        for name, text in (data.get("errors") or {}).items():
            res.data["errors"][name] = text
        if any(codes):
            res.data["errors"][f"zero{stage}_ranks"] = f"rank exit codes {codes}"
        res.write()
        part_file.unlink(missing_ok=True)
    return worst


# ---- one rank ----------------------------------------------------------------------------------
def micro_batches(a: argparse.Namespace, rank: int, vocab: int, groups: int | None = None) -> list[dict]:
    """``groups`` (default ``groups_per_step``) groups of G random (prompt, completion) pairs per
    rank, with behaviour estimates and advantages; the step's global counts are attached to each."""
    from stabledrl.common.types import SequenceBatch

    groups = groups or a.groups_per_step
    g = torch.Generator().manual_seed(1000 + rank)
    n_groups = groups * a.world
    out = []
    for i in range(groups):
        rows = a.group_size
        ids = torch.randint(4, vocab, (rows, a.prompt + a.gen), generator=g)  # no special ids: no EOS
        prompt_mask = torch.ones(rows, a.prompt, dtype=torch.bool)
        if a.estimator == "staircase":  # left-padded prompts of lengths in [P/2, P], as a job's batches are
            pad = torch.randint(0, a.prompt // 2 + 1, (rows,), generator=g)
            prompt_mask = torch.arange(a.prompt)[None] >= pad[:, None]
            ids[:, : a.prompt] = torch.where(prompt_mask, ids[:, : a.prompt], 0)
        batch = SequenceBatch(input_ids=ids, prompt_mask=prompt_mask,
                              completion_mask=torch.ones(rows, a.gen, dtype=torch.bool))
        rewards = torch.rand(rows, generator=g)
        out.append({
            "batch": batch, "seeds": torch.randint(0, 2**62, (rows,), generator=g),
            "behaviour_logp": -torch.log(torch.tensor(float(vocab))) + 0.1 * torch.randn(rows, generator=g),
            "advantages": (rewards - rewards.mean()) / (rewards.std() + 1e-6),
            "group_index": torch.full((rows,), rank * groups + i),
            "counts": (float(n_groups), float(n_groups * rows), float(n_groups * rows * a.gen)),
        })
    return out


def merge(mbs: list[dict], k: int) -> list[dict]:
    """Micro-batches of ``k`` groups each (rows concatenated; the step's global counts unchanged)."""
    from stabledrl.common.types import SequenceBatch

    out = []
    for i in range(0, len(mbs), k):
        part = mbs[i : i + k]
        batch = SequenceBatch(input_ids=torch.cat([m["batch"].input_ids for m in part]),
                              prompt_mask=torch.cat([m["batch"].prompt_mask for m in part]),
                              completion_mask=torch.cat([m["batch"].completion_mask for m in part]))
        merged = {
            key: torch.cat([m[key] for m in part]) for key in ("seeds", "behaviour_logp", "advantages", "group_index")
        }
        out.append({"batch": batch, **merged, "counts": part[0]["counts"]})
    return out


def rows_per_group(a: argparse.Namespace) -> int:
    """Rows one group feeds a forward: its G samples twice (2 masks) for elbo_mc, once for staircase
    and mean_field."""
    return 2 * a.group_size if a.estimator == "elbo_mc" else a.group_size


def edited_deepspeed_config(edit):
    """stabledrl.learner.engine.deepspeed_config with ``edit(config)`` applied to what it returns: a
    benchmark stage's departure from the project's DeepSpeed settings (which stay in learner/)."""
    import stabledrl.learner.engine

    base = stabledrl.learner.engine.deepspeed_config

    def config(*args, **kwargs) -> dict:
        out = base(*args, **kwargs)
        edit(out)
        return out

    return config


def tuned_zero3(cfg):
    """(LearnerConfig, deepspeed_config wrapper) of stage ``3t`` (see the module docstring)."""
    cfg = cfg.model_copy(update={"deepspeed": cfg.deepspeed.model_copy(update={
        "prefetch_bucket_size": 200_000_000, "param_persistence_threshold": 1_000_000})})
    return cfg, edited_deepspeed_config(lambda out: out["zero_optimization"].update(
        overlap_comm=True, stage3_max_live_parameters=1_000_000_000, stage3_max_reuse_distance=1_000_000_000))


# the other stages' departures: ``2t`` ZeRO's overlap_comm; ``2c`` DeepSpeed's own bf16 test of every gradient
# tensor for inf/NaN before the step turned back on (the before of its removal)
STAGE_EDITS = {"2t": lambda out: out["zero_optimization"].update(overlap_comm=True),
               "2c": lambda out: out["bf16"].update(check_grad_overflow=True)}


def stabledrl_loss_fn(est_cfg, loss_cfg):
    from stabledrl.common.estimators import estimate
    from stabledrl.learner.losses import LossInputs, compute_loss

    def loss_fn(model, mb: dict):
        ll = estimate(model, mb["batch"], mb["seeds"], est_cfg)  # [G] differentiable, 2 masks in one forward
        dev = ll.sequence.device
        groups, samples, tokens = mb["counts"]
        inputs = LossInputs(
            logp=ll.sequence, behaviour_logp=mb["behaviour_logp"].to(dev), advantages=mb["advantages"].to(dev),
            group_index=mb["group_index"].to(dev), completion_length=mb["batch"].completion_mask.sum(1).to(dev),
            num_groups=groups, num_samples=samples, num_tokens=tokens,
        )
        # the engine's own train/loss, grad_norm and skipped count are what the benchmark reports;
        # the loss's statistics (row means the engine would need weighted into shares) stay out
        return compute_loss(inputs, loss_cfg).loss, {}

    return loss_fn


def grpo_loss_fn(est_cfg, loss_cfg):
    """d1's learner loss: GRPO over the mean-field token log-likelihoods, against behaviour values
    near them (the first of d1's μ iterations has ratios near 1; the cost does not depend on it)."""
    from stabledrl.common.estimators import estimate
    from stabledrl.learner.losses import LossInputs, compute_loss

    def loss_fn(model, mb: dict):
        ll = estimate(model, mb["batch"], mb["seeds"], est_cfg)
        dev = ll.sequence.device
        groups, samples, tokens = mb["counts"]
        token = ll.token.detach()
        noise = 0.05 * torch.randn(token.shape, generator=torch.Generator().manual_seed(7)).to(dev)
        inputs = LossInputs(
            logp=ll.sequence, behaviour_logp=ll.sequence.detach(), advantages=mb["advantages"].to(dev),
            group_index=mb["group_index"].to(dev), completion_length=mb["batch"].completion_mask.sum(1).to(dev),
            num_groups=groups, num_samples=samples, num_tokens=tokens, token_logp=ll.token,
            token_mask=ll.token_mask.to(dev), behaviour_token_logp=token + noise.to(token.dtype),
        )
        return compute_loss(inputs, loss_cfg).loss, {}

    return loss_fn


def set_checkpointing(module: torch.nn.Module, setting: str) -> None:
    """on / off, or N: the first N decoder layers checkpointed (model.checkpointed_layers)."""
    from stabledrl.common.models.loading import checkpoint_first_layers

    for m in module.modules():
        if hasattr(m, "gradient_checkpointing_enable"):
            if setting == "off":
                m.gradient_checkpointing_disable()
            else:
                m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                if setting != "on":
                    checkpoint_first_layers(m, int(setting))
            return
    raise RuntimeError("no transformers model with gradient checkpointing inside the policy")


def timed_step(engine, mbs, loss_fn, dev, metrics: dict) -> float:
    """Seconds of one train_step, the slowest rank's (all ranks start together); ``metrics`` gets
    the step's metrics (a skipped step would be cheaper: the result says if any was)."""
    import torch.distributed as dist

    bl.sync(dev)
    dist.barrier()
    t0 = time.perf_counter()
    metrics.update(engine.train_step(mbs, loss_fn))
    bl.sync(dev)
    secs = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=engine.device)
    dist.all_reduce(secs, op=dist.ReduceOp.MAX)
    return float(secs)


def rank_main(a: argparse.Namespace) -> None:
    """One rank of one ZeRO stage (``a.stages`` holds a single stage here)."""
    from stabledrl.learner.group import init_learner_group, local_device

    rank, stage = a.rank, a.stages
    res = bl.Result(f"learner_{a.world}gpu", a.out if rank == 0 else None, vars(a), echo=rank == 0)
    try:
        bl.adopt_listeners(a.addr)
        init_learner_group(a.addr, a.port, rank, a.world, timeout_s=300)
        run_stage(a, res, rank, stage, local_device())
    except Exception as exc:  # recorded with its message, then the rank exits at once: the launcher stops the others
        res.error(f"zero{stage}", exc)  # written to the rank's file, with the traceback printed
        sys.stdout.flush()
        sys.stderr.flush()
        # not `raise`: a rank out of memory in the middle of a step leaves the others' collectives
        # pending, and the interpreter's exit then waits on NCCL's watchdog (300 s, 4 GPUs held idle)
        os._exit(1)
    bl.finish_rank()


def run_stage(a: argparse.Namespace, res: bl.Result, rank: int, stage_name: str, dev: torch.device) -> None:
    from stabledrl.common.config.estimator import ElboMCConfig, MeanFieldConfig, StaircaseConfig
    from stabledrl.common.config.learner import DeepSpeedConfig, LearnerConfig, LoraConfig, OptimizerConfig
    from stabledrl.common.config.loss import GrpoLossConfig, StableDrlLossConfig
    from stabledrl.learner.engine import LearnerEngine

    peak = bl.read_peak_tflops(a.peak_from)
    staircase = a.estimator == "staircase"
    est_cfg = StaircaseConfig(t_min=0.1, t_max=0.9, num_draws=1) if staircase else \
        ElboMCConfig(num_draws=2, weighting="mean", masks="independent")
    loss_fn = stabledrl_loss_fn(est_cfg, StableDrlLossConfig())
    if a.estimator == "mean_field":  # d1: 15% of the prompt masked, GRPO without the KL (no reference here)
        loss_fn = grpo_loss_fn(MeanFieldConfig(prompt_mask_prob=0.15), GrpoLossConfig(kl_beta=0.0, level="token"))
    layers = {"num_hidden_layers": a.layers} if a.layers else {}
    policy, build_s = bl.timed(lambda: bl.build_policy(a.shape, dev, bl.compute_dtype(dev), **layers), dev)
    if staircase and not policy.is_block_diffusion:
        raise ValueError(f"--estimator staircase needs a block-diffusion shape, got {a.shape}")
    sc = bl.count_shape(policy)
    stage = int(stage_name.rstrip("toc"))
    offload = {"offload_optimizer": "cpu", "offload_params": "cpu" if stage == 3 else "none"} \
        if stage_name.endswith("o") else {}
    lora = None
    if a.lora:
        llada = a.shape.startswith(("llada", "tiny-llada"))
        lora = LoraConfig(rank=a.lora, alpha=a.lora / 2, dropout=0.05, module_names="llada" if llada else "project",
                          target_modules=["q_proj", "k_proj", "v_proj", "up_proj"])
    cfg = LearnerConfig(num_ranks=a.world, optimizer=OptimizerConfig(lr=1e-6), lora=lora,
                        deepspeed=DeepSpeedConfig(zero_stage=stage, gradient_checkpointing=False, **offload))
    if stage_name == "3t":
        import stabledrl.learner.engine

        cfg, stabledrl.learner.engine.deepspeed_config = tuned_zero3(cfg)
    elif stage_name in STAGE_EDITS:
        import stabledrl.learner.engine

        stabledrl.learner.engine.deepspeed_config = edited_deepspeed_config(STAGE_EDITS[stage_name])
    engine, init_s = bl.timed(lambda: LearnerEngine(policy, cfg), dev)
    # the LM head runs at the scored (masked) positions only (common/estimators/scoring.py): half the
    # completion in expectation, the masking level being uniform
    if staircase:  # F of one group: one staircase forward of G rows over P + 2C tokens
        length = a.prompt + 2 * a.gen
        flops = bl.forward_flops(sc, rows=a.group_size, query_len=length, key_len=length / 2,
                                 logit_positions=a.gen // 2)
    elif a.estimator == "mean_field":  # F of one group: G rows, the head over the whole (masked) completion
        flops = bl.forward_flops(sc, rows=a.group_size, query_len=a.prompt + a.gen, key_len=a.prompt + a.gen,
                                 logit_positions=a.gen)
    else:  # F of one group (2 masks x G rows)
        flops = bl.forward_flops(sc, rows=2 * a.group_size, query_len=a.prompt + a.gen, key_len=a.prompt + a.gen,
                                 logit_positions=a.gen // 2)
    sizes = sorted(int(k) for k in a.micro_batch_groups.split(","))
    kernels = a.staircase_attention.split(",") if staircase else [None]
    # each checkpointing setting with every kernel before the next setting (a run that fails for
    # memory without checkpointing comes after the comparison it would otherwise disturb)
    compiles = a.compile.split(",")
    if compiles not in (["off"], ["on"], ["off", "on"], ["norms", "on"], ["off", "norms", "on"]):
        raise ValueError(f"--compile takes off, on, off,on, norms,on or off,norms,on, got {a.compile!r}")
    settings = [(c, ckpt, kernel) for c in compiles for ckpt in a.checkpointing.split(",") for kernel in kernels]
    fused = False  # learner.compile applied to the engine's module (in place)
    for comp, ckpt, kernel in settings:
        if comp in ("norms", "on"):
            from stabledrl.learner.fused import fuse_elementwise

            fused = bool(fuse_elementwise(engine.module))  # again for "on": the rotation wrapped anew
            if comp == "norms":
                eager_rotation(engine.module)
        set_staircase_attention(policy, kernel)
        for k in sizes:
            name = f"zero{stage_name}_ckpt_{ckpt}" + (f"_mb{k}" if len(sizes) > 1 else "")
            name += (f"_{kernel}" if kernel else "") + {"off": "", "norms": "_compiled_norms", "on": "_compiled"}[comp]
            n_groups = -(-a.groups_per_step // k) * k  # a multiple of k: equal micro-batches
            mbs = merge(micro_batches(a, rank, policy.vocab_size, n_groups), k)
            with res.part(name, dev):
                try:
                    run_setting(a, res, name, engine, mbs, loss_fn, dev, ckpt=ckpt, k=k, n_groups=n_groups, flops=flops,
                                sc=sc, peak=peak, build_s=build_s, init_s=init_s, stage_name=stage_name,
                                fused=fused)
                    if kernel:
                        values = res.data["parts"][name]
                        res.put(name, {**values, **job_formula_mfu(a, mbs, sc, values, peak),
                                       "staircase_attention": kernel})
                except torch.OutOfMemoryError as exc:  # bigger micro-batches would not fit either
                    if a.world > 1:  # the other ranks wait in a collective: fail the stage instead
                        raise
                    total = torch.cuda.get_device_properties(dev).total_memory / 2**30 if dev.type == "cuda" else None
                    res.put(name, {"out_of_memory": True, "micro_batch_rows": rows_per_group(a) * k,
                                   "device_memory_gib": total, "message": str(exc)[:300]})
                    bl.log(f"{name}: out of memory at {rows_per_group(a) * k} rows; larger micro-batches skipped")
                    torch.cuda.empty_cache()
                    break
            if a.profile == stage_name and k == sizes[0]:
                with res.part(f"zero{stage_name}_profile", dev):
                    res.put(f"zero{stage_name}_profile", profile_step(engine, mbs, loss_fn, dev, k * rows_per_group(a)))
    if stage == 3:
        with res.part("zero3_gather", dev):
            bl.sync(dev)
            t0 = time.perf_counter()
            gathered = sum(t.numel() for _, t in engine.named_parameters_for_push())
            bl.sync(dev)
            res.put("zero3_gather", {"seconds": time.perf_counter() - t0, "params_on_rank0": gathered,
                                     "bucket_mb": cfg.deepspeed.gather_bucket_mb})


def run_setting(a, res, name, engine, mbs, loss_fn, dev, *, ckpt, k, n_groups, flops, sc, peak, build_s, init_s,
                stage_name, fused) -> None:
    """One (checkpointing, micro-batch size) setting: a warm-up step, ``a.steps`` timed steps."""
    set_checkpointing(engine.module, ckpt)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    last: dict = {}
    warm = timed_step(engine, mbs, loss_fn, dev, last)
    optimizer_s = engine.optimizer_s
    secs = [timed_step(engine, mbs, loss_fn, dev, last) for _ in range(a.steps)]
    optimizer_s = (engine.optimizer_s - optimizer_s) / a.steps  # DeepSpeed's step: norm, clip, AdamW, bf16 copy
    step_s = bl.median(secs)
    # training = forward + backward: 3F, or 2F with the base frozen (LoRA: no weight gradients but the
    # adapters', which are r/width of them); checkpointing adds the recompute of its layers' forward
    train = 2 if a.lora else 3
    recompute = {"on": 1.0, "off": 0.0}[ckpt] if ckpt in ("on", "off") else int(ckpt) / sc.layers
    model_flops = train * flops * n_groups * a.world
    hardware_flops = (train + recompute) * flops * n_groups * a.world
    per_card = model_flops / step_s / a.world / 1e12
    res.put(name, {
        "world": a.world, "zero_stage": stage_name, "checkpointing": ckpt, "params": sc.total,
        "micro_batch_rows": rows_per_group(a) * k, "micro_batches_per_rank": len(mbs),
        "groups_per_step_per_rank": n_groups,
        "dtype": str(engine.dtype), "build_s": build_s, "deepspeed_init_s": init_s,
        "warmup_step_s": warm, "step_s": secs, "step_s_median": step_s, "optimizer_s_mean": optimizer_s,
        "samples_per_s": a.group_size * n_groups * a.world / step_s,
        "sequence_tokens_per_s": a.group_size * n_groups * a.world * (a.prompt + a.gen) / step_s,
        "model_tflop_per_step": model_flops / 1e12, "model_tflops_per_card": per_card,
        "mfu_vs_measured_matmul": per_card / peak if peak else None,
        "mfu_vs_nominal_989": per_card / bl.NOMINAL_H100_BF16_TFLOPS if dev.type == "cuda" else None,
        "hfu_vs_measured_matmul": hardware_flops / step_s / a.world / 1e12 / peak if peak else None,
        "peak_memory_gib": bl.peak_memory_gib(dev),
        "skipped_steps_total": last.get("train/skipped_total"), "loss": last.get("train/loss"),
        "grad_norm": last.get("train/grad_norm"),
        "deepspeed_zero": _zero_settings(engine),
        "offload": {k: getattr(engine.cfg.deepspeed, k) for k in ("offload_optimizer", "offload_params")},
        "adamw": {key: engine.optimizer.defaults.get(key) for key in ("fused", "foreach")},
        "learner_compile": fused,
        "lora_rank": a.lora or None, "estimator": a.estimator,
        "note": "mean_field: each sequence fed once, the head over the whole completion; LoRA: model FLOPs 2F "
                "(no base weight gradients)" if a.estimator == "mean_field" else
                "each sequence is fed twice per step (2 masked views); model FLOPs count both, the LM head at "
                "half the completion (the scored positions in expectation)",
    })


def eager_rotation(model) -> None:
    """Undo learner/fused.py's rotation on ``model`` (each attention module back to its class's forward),
    keeping its fused norms and activation."""
    from stabledrl.learner.fused import ATTENTIONS

    for module in model.modules():
        if type(module).__name__ in ATTENTIONS and "forward" in vars(module):
            del module.forward


def set_staircase_attention(policy, kernel) -> None:
    """model.staircase_attention on a live policy: flex installs the flex staircase path, sdpa
    puts the stock sdpa back (the same engine and weights run both)."""
    from stabledrl.common.models.flex_staircase import use_flex_staircase

    if kernel == "flex":
        use_flex_staircase(policy)
    elif kernel in ("sdpa", None):
        policy.model.config._attn_implementation = "sdpa"
    else:
        raise ValueError(f"--staircase-attention takes sdpa or flex, got {kernel!r}")


def job_formula_mfu(a, mbs, sc, values: dict, peak) -> dict:
    """perf/mfu as the job logs it (coordinator/decisions/step_metrics.py): 6 x parameters x the real prompt
    and completion tokens, per staircase draw (one here), over the step time; and the note."""
    tokens = sum(int(m["batch"].prompt_mask.sum()) + int(m["batch"].completion_mask.sum()) for m in mbs) * a.world
    per_card = 6.0 * sc.total * tokens / values["step_s_median"] / a.world / 1e12
    return {"real_tokens_per_step": tokens, "job_formula_tflops_per_card": per_card,
            "mfu_job_formula": per_card / peak if peak else None,
            "note": "one staircase forward per row over P + 2C tokens (the clean completion beside its noised copy); "
                    "mfu_vs_measured_matmul counts every token fed, mfu_job_formula only prompt + completion"}


def profile_step(engine, mbs, loss_fn, dev, rows: int) -> dict:
    """torch.profiler over one more train_step: wall vs GPU-busy time, top kernels, top host ops."""
    table = bl.profile_run(lambda: engine.train_step(mbs, loss_fn), dev, forwards=1)
    table = {k.replace("_per_forward", "_per_step"): v for k, v in table.items() if k != "forwards_profiled"}
    return {"micro_batch_rows": rows, "micro_batches": len(mbs), **table}


def _zero_settings(engine) -> dict:
    """The zero_optimization settings DeepSpeed actually ran with (the record says what was tuned)."""
    try:
        zero = engine.engine.config["zero_optimization"]
        return {k: zero[k] for k in sorted(zero) if not isinstance(zero[k], dict)}
    except Exception:  # noqa: BLE001 - a DeepSpeed release without the raw config: nothing to add
        return {}


def main() -> None:
    a = parse()
    if a.rank is None:
        sys.exit(launch(a))
    rank_main(a)


if __name__ == "__main__":
    main()
