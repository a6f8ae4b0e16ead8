"""Benchmark 4: block-diffusion sampling (SDAR-8B ~ Qwen3-8B shape, random weights, bf16) with the
exact KV cache: batch 128, block 4, prompt 128, gen 256 (target >= 3,000 tokens/s on one H100).

Whole generations through the real engine (``stabledrl.rollout.sampling.generate``, cache "prefix" = the
exact cache), ``stop_at_eos=False`` so every row decodes all 256 positions:

speed       the eager sampler (the default), steps = 256 (one token per step: 4 steps per block)
            and 128 (two per step; --quick: 256 only); tokens/s = B * 256 / wall seconds; achieved
            FLOP/s from the tokens each forward feeds.
graphed     the sampler's CUDA-graph path (``SamplerConfig.cuda_graph``, rollout/sampling/graphs.py:
            the in-block step from static buffers over all T slots behind the block-causal mask,
            GQA folded into the query, one graph per shape) at the same steps, through one
            ``StepGraphs`` pool kept across generations as ``TorchRolloutEngine`` keeps it: the
            first generation of the shape (its capture included) and the next one (replays only:
            an engine's steady state); tokens/s and speed-up over the eager run at equal steps.
compiled    the graphed path with ``SamplerConfig.compile`` (both static steps through torch.compile
            before their capture: the elementwise work between the matmuls fused), one token per
            step: the first generation (compiling and capturing both shapes: its seconds include
            the compile) and the next one (replays only); speed-up over eager and over the graphed
            path's steady state; token agreement with the uncompiled graphed path (temperature 0,
            bf16: reported, rounding differs) is in exactness (fp32, 4 layers). Then the same two
            generations with the counter-based draw (``sampler.noise_source: counter``: every row's
            uniforms computed inside the fused token choice instead of 128 per-row generator draws)
            on the same static steps: ``<gen>_counter_{first,again}``, speed-up over the generators'.
split       where a graphed generation's wall time goes (one token per step, after a generation
            that captured the shape): each call of the logits (the prefill, the entering step, the
            in-block step: a graph replay each but the prefill) and of the decode step between them
            (token choice with per-row generators, float64 noise by default), timed one by one
            with the device synchronised around each: ms per call of each kind, and the share of
            the generation's time each takes (the synchronisation adds a little to every call).
split_compiled  the same with ``SamplerConfig.compile`` (compiled static steps, the fused token choice), after
            a generation that compiled and captured them.
split_counter  split_compiled with the counter-based draw.
decode      the token choice alone (``choose_tokens``) on the decode's shape [B, block, vocab] of random
            bf16 logits, per-row generators: ms per call (CUDA events) for float64 and float32 noise,
            eager and fused (``sampler.compile``); and with the counter-based draw (``counter_*``).
profile     torch.profiler over 8 forwards (2 blocks: their entering steps and in-block steps, with
            the decode steps between them) of an eager one-token-per-step generation: wall vs
            device-busy ms per forward, kernels launched, the top-20 kernels and the top host ops.
            Wall far above device-busy time means the forward is bound by the host (Python and
            launches of ~3,000 aten ops per forward at this depth), not by the GPU.
graph_profile  the same table over a whole short graphed generation (after one that captured its
            shape): 4 blocks, 16 forwards, 12 of them replays. Whether kernels launched by a graph
            replay are listed depends on the profiler: the record says how many kernels it saw.
replay_profile  each static step of a graphed one-token-per-step generation replayed on its own, after
            a generation that captured them: the in-block step [current block] and the entering step
            [previous | current]: ms per replay (CUDA events, --replay-reps replays), the matmul
            floor of its FLOPs at the measured rate, and torch.profiler's kernels of those replays
            by category (matmul, attention, elementwise, reduce, copy / cast, compiled) and the top
            kernels: where a replay's time goes beyond its matrix products. Not in --quick.
replay_profile_compiled  the same with ``SamplerConfig.compile`` (the static steps compiled before
            their capture; the first generation compiles both shapes: minutes at 36 layers).
exactness   the cached path against the reference path without cache (whole canvas, block-causal
            mask, every step), temperature 0: (a) in fp32 on a model of the same widths and
            vocabulary but 4 layers (fp32 kernels round alike whatever the shape: must be 100%
            identical), for the eager cached path and the graphed path; (b) eager cached on the
            bf16 8B model (random weights give nearly flat logits, so the bf16 rounding of different
            kernel shapes flips argmaxes: reported, not a defect; not in --quick).
gqa_fold    the eager one-token-per-step generation with grouped-query attention folded into the
            query length (common/models/gqa_fold.py; the graphed path always folds) instead of
            transformers' repeat_kv copy of the KV cache; not in --quick (the first run measured
            0.95x: eager steps are bound by the host): tokens/s, speed-up, token agreement.
On a CPU (--tiny) the graphed path runs its static steps uncaptured: it checks the code path and
the tokens, not the speed.

    python tests/benchmarks/bench_block_diffusion.py --peak-from matmul.json --out bd.json
    python tests/benchmarks/bench_block_diffusion.py --tiny --out bd.json
"""
from __future__ import annotations

import argparse

import benchlib as bl
import torch

from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.models.gqa_fold import folded_attention
from stabledrl.rollout.sampling import StepGraphs, generate

PARTS = ("speed", "graphed", "compiled", "split", "split_compiled", "split_counter", "decode", "profile",
         "graph_profile", "replay_profile", "replay_profile_compiled", "exactness", "gqa_fold")
QUICK_PARTS = ("speed", "graphed", "compiled", "split", "graph_profile", "exactness")


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--batch", type=int, default=None, help="rows (default 128; 8 with --tiny)")
    ap.add_argument("--prompt", type=int, default=None, help="default 128; 16 with --tiny")
    ap.add_argument("--gen", type=int, default=None, help="default 256; 32 with --tiny")
    ap.add_argument("--block", type=int, default=4, help="the policy's block size (SDAR / TraDo: 4)")
    ap.add_argument(
        "--steps", default=None, help="comma list of steps per generation (default gen, gen/2; --quick: gen)"
    )
    ap.add_argument("--temperature", type=float, default=0.9)
    ap.add_argument("--replay-reps", type=int, default=8, help="replays of each static step (replay_profile)")
    ap.add_argument("--norms", choices=("model", "fused"), default="model",
                    help="fused: every RMSNorm through torch's fused rms_norm kernel (a measurement of what "
                         "the norms' separate kernels cost; the model's own arithmetic otherwise)")
    ap.add_argument("--exact-batch", type=int, default=4)
    ap.add_argument(
        "--exact-gen", type=int, default=None, help="gen_length of the exactness runs (default 64; 16 tiny)"
    )
    ap.add_argument("--exact-layers", type=int, default=4, help="layers of the fp32 exactness model")
    ap.add_argument("--quick", action="store_true", help=f"parts {QUICK_PARTS} only, fp32 exactness only")
    ap.add_argument("--parts", default=None, help=f"comma list of {PARTS} (default all; --quick: {QUICK_PARTS})")
    ap.add_argument("--peak-from", default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    a.shape = "tiny-sdar" if a.tiny else "sdar-8b"
    a.batch = a.batch or (8 if a.tiny else 128)
    a.prompt = a.prompt or (16 if a.tiny else 128)
    a.gen = a.gen or (32 if a.tiny else 256)
    a.exact_gen = a.exact_gen or (16 if a.tiny else 64)
    a.steps = [int(s) for s in a.steps.split(",")] if a.steps else ([a.gen] if a.quick else [a.gen, a.gen // 2])
    a.parts = a.parts or ",".join(QUICK_PARTS if a.quick else PARTS)
    return a


def main() -> None:
    a = parse()
    dev = bl.device()
    res = bl.Result("block_diffusion", a.out, vars(a))
    peak = bl.read_peak_tflops(a.peak_from)
    try:
        policy, build_s = bl.timed(
            lambda: bl.build_policy(a.shape, dev, bl.compute_dtype(dev), block_size=a.block), dev
        )
    except Exception as exc:  # nothing can run without the model
        res.error("model", exc)
        raise
    sc = bl.count_shape(policy)
    if a.norms == "fused":
        res.put("norms", {"fused": fused_norms(policy)})
    res.put("model", {"shape": a.shape, "params": sc.total, "build_s": build_s, "block_size": policy.block_size,
                      "measured_matmul_tflops": peak})
    prompts = bl.random_prompts(a.batch, a.prompt, policy.vocab_size, seed=2)
    seeds = torch.arange(a.batch)

    def cfg(**kw) -> SamplerConfig:
        base = dict(gen_length=a.gen, block_length=None, steps=a.gen, temperature=a.temperature, cache="prefix",
                    stop_at_eos=False, max_batch_size=a.batch)
        return SamplerConfig(**{**base, **kw})

    def run(c: SamplerConfig, rows: int, graphs: StepGraphs | None = None):
        return bl.timed(lambda: generate(policy, prompts[:rows], seeds[:rows], c, graphs), dev)

    def speed_row(out, secs: float, steps: int) -> dict:
        tflops = generation_flops(sc, a, steps, out.num_forwards) / secs / 1e12
        return {"forwards": out.num_forwards, "seconds": secs, "tokens_per_s": a.batch * a.gen / secs,
                "tokens_per_step_per_row": a.gen / steps, "achieved_tflops": tflops,
                "pct_of_measured_matmul": 100 * tflops / peak if peak else None,
                "ms_per_forward": 1e3 * secs / out.num_forwards}

    parts = a.parts.split(",")
    short = dict(gen_length=4 * a.block, steps=4 * a.block)  # warm-ups and profiles: 4 blocks, 16 forwards
    eager: dict = {}  # steps -> the eager path's speed row
    graphed: dict = {}  # "<steps>_<first|again>" -> the graphed path's speed row

    def graphed_row(c: SamplerConfig, steps: int, graphs: StepGraphs) -> dict:
        """One generation on a kept pool of static steps: its speed, the pool's counts, and the
        speed-up over the eager run at the same steps."""
        out, secs = run(c, a.batch, graphs)
        row = {**speed_row(out, secs, steps), "captures": graphs.captures, "replays": graphs.replays}
        if steps in eager:
            row["speedup_vs_eager"] = eager[steps]["seconds"] / secs
        return row

    if "speed" in parts:
        with res.part("speed", dev):
            run(cfg(**short), a.batch)  # warm-up: same batch, short canvas
            for steps in a.steps:
                out, secs = run(cfg(steps=steps), a.batch)
                eager[steps] = speed_row(out, secs, steps)
                res.put("speed", {"batch": a.batch, "block": a.block, "path": "eager", "by_steps": eager})
    if "graphed" in parts:
        with res.part("graphed", dev):
            run(cfg(cuda_graph=True, **short), a.batch)  # warm-up of the kernels (a shape of its own)
            graphs, rows = StepGraphs(), graphed
            for i, steps in enumerate(a.steps):  # the shape's capture included, then replays only
                for when in ("first", "again") if i == 0 else ("again",):
                    rows[f"{steps}_{when}"] = graphed_row(cfg(steps=steps, cuda_graph=True), steps, graphs)
                    res.put("graphed", {"batch": a.batch, "block": a.block, "path": "cuda_graph", "by_run": rows})
            del graphs
            _free(dev)
    if "compiled" in parts:
        with res.part("compiled", dev):
            graphs, rows, c = StepGraphs(), {}, cfg(steps=a.gen, cuda_graph=True, compile=True)
            for when in ("first", "again"):  # the first compiles and captures both static shapes
                row = graphed_row(c, a.gen, graphs)
                if f"{a.gen}_again" in graphed:
                    row["speedup_vs_graphed"] = graphed[f"{a.gen}_again"]["seconds"] / row["seconds"]
                rows[f"{a.gen}_{when}"] = row
                res.put("compiled", {"batch": a.batch, "block": a.block, "path": "cuda_graph+compile", "by_run": rows})
            counter = c.model_copy(update={"noise_source": "counter"})
            for when in ("first", "again"):  # the same static steps; the first compiles the counter's choice
                row = graphed_row(counter, a.gen, graphs)
                row["speedup_vs_generator"] = rows[f"{a.gen}_again"]["seconds"] / row["seconds"]
                rows[f"{a.gen}_counter_{when}"] = row
                res.put("compiled", {"batch": a.batch, "block": a.block, "path": "cuda_graph+compile", "by_run": rows})
            del graphs
            _free(dev)
    for name in ("split", "split_compiled", "split_counter"):
        if name in parts:
            with res.part(name, dev):
                graphs = StepGraphs()
                c = cfg(steps=a.gen, cuda_graph=True, compile=name != "split",
                        noise_source="counter" if name == "split_counter" else "generator")
                generate(policy, prompts, seeds, c, graphs)  # captures (and compiles) this shape's steps
                res.put(name, time_split(lambda: generate(policy, prompts, seeds, c, graphs), dev, a.batch * a.gen))
                del graphs
                _free(dev)
    if "decode" in parts:
        with res.part("decode", dev):
            res.put("decode", decode_times(a, policy, dev))
    if "profile" in parts:
        with res.part("profile", dev):
            c = cfg(**short)  # forwards: prefill, then 4 per block
            res.put("profile", bl.profile_forwards(policy.model, lambda: generate(policy, prompts, seeds, c), dev,
                                                   skip=a.block, active=2 * a.block))
    if "graph_profile" in parts:
        with res.part("graph_profile", dev):
            graphs, c = StepGraphs(), cfg(cuda_graph=True, **short)
            first = generate(policy, prompts, seeds, c, graphs)  # captures the short canvas's shape
            before = graphs.replays
            table = bl.profile_run(
                lambda: generate(policy, prompts, seeds, c, graphs), dev, forwards=first.num_forwards
            )
            res.put(
                "graph_profile", {**table, "replays_profiled": graphs.replays - before, "captures": graphs.captures}
            )
            del graphs
            _free(dev)
    for name in ("replay_profile", "replay_profile_compiled"):
        if name in parts:
            with res.part(name, dev):
                graphs = StepGraphs()
                generate(policy, prompts, seeds, cfg(cuda_graph=True, compile=name.endswith("compiled"), **short),
                         graphs)  # captures the in-block and the entering step
                res.put(name, replay_profile(graphs, sc, a, dev, peak))
                del graphs
                _free(dev)
    if "exactness" in parts:
        with res.part("exactness", dev):
            res.put("exactness", exactness(a, policy, prompts, seeds, cfg, dev))
    if "gqa_fold" in parts:
        with res.part("gqa_fold", dev):
            with folded_attention(policy):
                run(cfg(**short), a.batch)  # warm-up
                out, secs = run(cfg(steps=a.gen), a.batch)
                row = {"steps": a.gen, "seconds": secs, "tokens_per_s": a.batch * a.gen / secs,
                       "ms_per_forward": 1e3 * secs / out.num_forwards}
                if a.gen in eager:
                    row["speedup_vs_stock"] = eager[a.gen]["seconds"] / secs
            res.put("gqa_fold", row)
    res.put("memory", {"peak_gib": bl.peak_memory_gib(dev)})


def decode_times(a: argparse.Namespace, policy, dev: torch.device) -> dict:
    """ms per ``choose_tokens`` call on [batch, block, vocab] random logits, per noise dtype, eager / fused."""
    from stabledrl.rollout.sampling.decode import choose_tokens

    g = torch.Generator(device=dev).manual_seed(0)
    logits = torch.randn(a.batch, a.block, policy.vocab_size, generator=g, device=dev).to(bl.compute_dtype(dev))
    generators = [torch.Generator(device=dev).manual_seed(i) for i in range(a.batch)]
    out = {"shape": list(logits.shape)}
    counter = (torch.arange(a.batch, device=dev) * 7919 + 1, torch.zeros(a.batch, dtype=torch.long, device=dev))
    for source in ("generator", "counter"):
        for noise in ("float64", "float32"):
            for fused in (False, True):
                def call() -> None:
                    choose_tokens(logits.clone(), a.temperature, generators, mask_token_id=policy.mask_token_id,
                                  noise_dtype=noise, fused=fused, counter=counter if source == "counter" else None)
                key = f"{'counter_' if source == 'counter' else ''}{noise}_{'fused' if fused else 'eager'}_ms"
                out[key] = bl.median(bl.event_times_ms(call, dev, warmup=3, reps=10))
    return out


def time_split(run, dev: torch.device, tokens: int) -> dict:
    """``run()`` (one generation) with every logits call and every decode step timed on its own,
    the device synchronised before and after each: {kind: calls, ms per call, share of the wall}."""
    import time

    from stabledrl.rollout.sampling import block_diffusion
    from stabledrl.rollout.sampling.state import DecodeState

    spent: dict[str, list[float]] = {}

    def timed(kind_of, fn):
        def wrapper(*args, **kwargs):
            bl.sync(dev)
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            bl.sync(dev)
            spent.setdefault(kind_of(*args, **kwargs), []).append(time.perf_counter() - t0)
            return out
        return wrapper

    def logits_kind(self, state, view, *rest, **kw) -> str:
        return "prefill" if view.forward == 0 else "enter" if view.refresh else "inside"

    logits, step = block_diffusion.BlockDiffusionLogits.__call__, DecodeState.step
    block_diffusion.BlockDiffusionLogits.__call__ = timed(logits_kind, logits)
    DecodeState.step = timed(lambda *a, **k: "decode", step)
    try:
        t0 = time.perf_counter()
        run()
        bl.sync(dev)
        wall = time.perf_counter() - t0
    finally:
        block_diffusion.BlockDiffusionLogits.__call__, DecodeState.step = logits, step
    out = {kind: {"calls": len(v), "ms_per_call": 1e3 * sum(v) / len(v), "share_of_wall": sum(v) / wall}
           for kind, v in spent.items()}
    return {"wall_s": wall, "tokens_per_s": tokens / wall, "by_kind": out,
            "other_share": 1 - sum(v["share_of_wall"] for v in out.values())}


def fused_norms(policy: torch.nn.Module) -> int:
    """Every RMSNorm of ``policy`` through ``torch.nn.functional.rms_norm`` (one fused kernel on CUDA) in
    float32, then cast and scaled by the weight in the input dtype as the model's norm does; returns
    how many norms were replaced."""
    import torch.nn.functional as F

    replaced = 0
    for m in policy.modules():
        if type(m).__name__.endswith("RMSNorm"):
            def forward(x: torch.Tensor, m: torch.nn.Module = m) -> torch.Tensor:
                return m.weight * F.rms_norm(x.float(), (x.shape[-1],), None, m.variance_epsilon).to(x.dtype)

            m.forward = forward
            replaced += 1
    return replaced


def replay_profile(graphs: StepGraphs, sc: bl.ShapeCount, a: argparse.Namespace, dev: torch.device,
                   peak: float | None) -> dict:
    """Each kept static step replayed ``a.replay_reps`` times on its own: ms per replay, its matmul
    floor at the measured rate, and the profiled kernels of as many more replays by category."""
    out = {}
    for step in graphs.static_steps():
        with torch.inference_mode():  # as the sampler runs them
            out.update(_replay_row(step, sc, a, dev, peak))
    return out


def _replay_row(step, sc: bl.ShapeCount, a: argparse.Namespace, dev: torch.device, peak: float | None) -> dict:
    """{kind: row} of one static step: "inside" (the in-block step) or "enter_<query length>"."""
    query = step.ids.shape[1]
    kind = "inside" if query == a.block else f"enter_{query}"

    def replay() -> torch.Tensor:  # its own inputs again: the cache reads this step's slots
        return step(step.ids, step.positions, step.slots)

    times = bl.event_times_ms(replay, dev, warmup=2, reps=a.replay_reps)
    flops = bl.forward_flops(sc, rows=a.batch, query_len=query, key_len=step.cache.num_slots / 2,
                             logit_positions=a.block)
    row = {"query_tokens": a.batch * query, "ms_per_replay": bl.median(times), "gflop": flops / 1e9,
           "matmul_floor_ms": 1e3 * flops / (peak * 1e12) if peak else None}
    table = bl.profile_run(lambda: [replay() for _ in range(a.replay_reps)], dev, forwards=a.replay_reps, top=15)
    row.update({k: table.get(k) for k in ("device_busy_ms_per_forward", "kernels_per_forward", "by_category",
                                           "top_kernels")})
    return {kind: row}


def exactness(a, policy, prompts, seeds, cfg, dev: torch.device) -> dict:
    """Reference path (no cache) vs the eager exact cache and the graphed path, temperature 0:
    fp32 on a 4-layer model of the real widths; the compute dtype on the full model (not --quick)."""
    rows = min(a.exact_batch, a.batch)
    c = cfg(gen_length=a.exact_gen, steps=a.exact_gen, temperature=0.0)
    out = {"rows": rows, "gen": a.exact_gen}
    fp32 = bl.build_policy(a.shape, dev, torch.float32, block_size=a.block, num_hidden_layers=a.exact_layers)
    out["fp32"] = {"layers": a.exact_layers, **agreement(fp32, prompts[:rows], seeds[:rows], c, graphed=True)}
    del fp32
    _free(dev)
    if not a.quick:
        out[str(bl.compute_dtype(dev)).replace("torch.", "")] = agreement(policy, prompts[:rows], seeds[:rows], c)
    return out


def agreement(policy, prompts, seeds, c: SamplerConfig, graphed: bool = False) -> dict:
    """Cached (exact cache) and, with ``graphed``, the CUDA-graph path vs reference tokens of one model."""
    ref, ref_s = bl.timed(
        lambda: generate(policy, prompts, seeds, c.model_copy(update={"cache": "none"})), policy.device
    )
    got, got_s = bl.timed(lambda: generate(policy, prompts, seeds, c), policy.device)
    same = (got.completion_ids == ref.completion_ids).float()
    row = {"token_agreement": float(same.mean()), "rows_identical": int(same.all(dim=1).sum()),
           "none_seconds": ref_s, "cached_seconds": got_s, "same_forwards": got.num_forwards == ref.num_forwards}
    if graphed:
        row.update(graphed_agreement(policy, prompts, seeds, c, ref))
    return row


def graphed_agreement(policy, prompts, seeds, c: SamplerConfig, ref) -> dict:
    """The graphed path against the reference: its first generation (capture), the next one on the
    same pool (replays of that graph), and one more after every weight changed in place (what a
    weight push does): the kept graph must read the new weights. Changes ``policy``'s weights."""
    graphs, g = StepGraphs(), c.model_copy(update={"cuda_graph": True})
    first = generate(policy, prompts, seeds, g, graphs)
    again = generate(policy, prompts, seeds, g, graphs)
    with torch.no_grad():
        gen = torch.Generator(device=policy.device).manual_seed(7)
        for p in policy.parameters():
            p.mul_(1 + 0.5 * torch.rand(p.shape, generator=gen, device=p.device, dtype=p.dtype))
    ref2 = generate(policy, prompts, seeds, c.model_copy(update={"cache": "none"}))
    moved = generate(policy, prompts, seeds, g, graphs)
    return {
        "graphed_token_agreement": float((first.completion_ids == ref.completion_ids).float().mean()),
        "graphed_decode_steps_equal": bool(torch.equal(first.decode_step, ref.decode_step)),
        "graphed_replay_identical": bool(torch.equal(again.completion_ids, first.completion_ids)),
        "graphed_after_inplace_weights_agreement": float((moved.completion_ids == ref2.completion_ids).float().mean()),
        "reference_changed_with_weights": not torch.equal(ref2.completion_ids, ref.completion_ids),
        "graphed_captures": graphs.captures,
        "graphed_replays": graphs.replays,
        "graphed_reuses": graphs.reuses,
        **compiled_agreement(policy, prompts, seeds, c, ref2),
    }


def compiled_agreement(policy, prompts, seeds, c: SamplerConfig, ref) -> dict:
    """The compiled graphed path (``SamplerConfig.compile``) against the reference tokens ``ref``
    of the same weights: fused kernels may round differently, so this is reported, not required."""
    got = generate(policy, prompts, seeds, c.model_copy(update={"cuda_graph": True, "compile": True}), StepGraphs())
    same = (got.completion_ids == ref.completion_ids).float()
    return {"compiled_token_agreement": float(same.mean()), "compiled_rows_identical": int(same.all(dim=1).sum())}


def generation_flops(sc: bl.ShapeCount, a: argparse.Namespace, steps: int, forwards: int) -> float:
    """FLOPs of one cached generation with fixed steps: the first forward feeds [prompt | block 0];
    the first step of every later block feeds [previous block | current block] (the previous one
    enters the cache), the other steps only the current block. Keys read: the prompt and the blocks
    up to the current one (the average over the generation; the graphed step reads all T slots,
    the extra ones masked: not counted as useful work). Logits: the current block."""
    b, bs = a.batch, a.block
    mean_keys = a.prompt + a.gen / 2 + bs / 2
    first = bl.forward_flops(sc, rows=b, query_len=a.prompt + bs, key_len=a.prompt + bs, logit_positions=bs)
    entering = bl.forward_flops(sc, rows=b, query_len=2 * bs, key_len=mean_keys, logit_positions=bs)
    inside = bl.forward_flops(sc, rows=b, query_len=bs, key_len=mean_keys, logit_positions=bs)
    nblocks = a.gen // bs
    n_entering = nblocks - 1
    n_inside = max(forwards - 1 - n_entering, 0)
    return first + n_entering * entering + n_inside * inside


def _free(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
