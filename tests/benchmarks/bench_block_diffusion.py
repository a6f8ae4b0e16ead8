"""Benchmark 4: block-diffusion sampling (SDAR-8B ~ Qwen3-8B shape, random weights, bf16) with the
exact KV cache: batch 128, block 4, prompt 128, gen 256 (target >= 3,000 tokens/s on one H100).

Whole generations through the real engine (``rollout.sampling.generate``, cache "prefix" = the
exact cache), ``stop_at_eos=False`` so every row decodes all 256 positions:

speed       steps = 256 (one token per step: 4 steps per block) and 128 (two per step); tokens/s
            = B * 256 / wall seconds; achieved FLOP/s from the tokens each forward feeds.
profile     torch.profiler over 8 forwards (2 blocks: their entering steps and in-block steps, with
            the decode steps between them) of a one-token-per-step generation: wall vs device-busy
            ms per forward, kernels launched, the top-20 kernels and the top host ops. Wall far
            above device-busy time means the forward is bound by the host (Python and launches of
            ~3,000 aten ops per forward at this depth), not by the GPU.
exactness   the cached path against the reference path without cache (whole canvas, block-causal
            mask, every step), temperature 0: (a) in fp32 on a model of the same widths and
            vocabulary but 4 layers (fp32 kernels round alike whatever the shape: must be 100%
            identical), (b) on the bf16 8B model (random weights give nearly flat logits, so the
            bf16 rounding of different kernel shapes flips argmaxes: reported, not a defect).
cuda_graph  an experiment (graphed_steps.py): the in-block step with static shapes (all T slots
            behind a block-causal mask) replayed as one CUDA graph per generation; tokens/s at one
            token per step with transformers' sdpa (repeat_kv + masked kernel) and with the GQA
            fold; exactness in fp32 (the 4-layer model: graphed vs reference tokens, must be 100%).
            On a CPU the static path runs uncaptured (checks the code path, not the speed).
gqa_fold    the same one-token-per-step generation with grouped-query attention folded into the
            query length instead of transformers' repeat_kv copy of the KV cache (gqa_fold.py, an
            experiment; not in --quick: the first run measured 0.95x): tokens/s, speed-up over
            the stock path, token agreement with it.

    python tests/benchmarks/bench_block_diffusion.py --peak-from matmul.json --out bd.json
    python tests/benchmarks/bench_block_diffusion.py --tiny --out bd.json
"""
from __future__ import annotations

import argparse
import contextlib

import benchlib as bl
import torch

from common.config.sampler import SamplerConfig
from rollout.sampling import generate

PARTS = ("speed", "profile", "exactness", "cuda_graph", "gqa_fold")
QUICK_PARTS = ("speed", "profile", "exactness", "cuda_graph")


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--batch", type=int, default=None, help="rows (default 128; 8 with --tiny)")
    ap.add_argument("--prompt", type=int, default=None, help="default 128; 16 with --tiny")
    ap.add_argument("--gen", type=int, default=None, help="default 256; 32 with --tiny")
    ap.add_argument("--block", type=int, default=4, help="the policy's block size (SDAR / TraDo: 4)")
    ap.add_argument("--steps", default=None, help="comma list of steps per generation (default gen, gen/2; --quick: gen)")
    ap.add_argument("--temperature", type=float, default=0.9)
    ap.add_argument("--exact-batch", type=int, default=4)
    ap.add_argument("--exact-gen", type=int, default=None, help="gen_length of the exactness runs (default 64; 16 tiny)")
    ap.add_argument("--exact-layers", type=int, default=4, help="layers of the fp32 exactness model")
    ap.add_argument("--quick", action="store_true", help=f"parts {QUICK_PARTS} only (the GPU re-measure)")
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
        policy, build_s = bl.timed(lambda: bl.build_policy(a.shape, dev, bl.compute_dtype(dev), block_size=a.block), dev)
    except Exception as exc:  # nothing can run without the model
        res.error("model", exc)
        raise
    sc = bl.count_shape(policy)
    res.put("model", {"shape": a.shape, "params": sc.total, "build_s": build_s, "block_size": policy.block_size,
                      "measured_matmul_tflops": peak})
    prompts = bl.random_prompts(a.batch, a.prompt, policy.vocab_size, seed=2)
    seeds = torch.arange(a.batch)

    def cfg(**kw) -> SamplerConfig:
        base = dict(gen_length=a.gen, block_length=None, steps=a.gen, temperature=a.temperature, cache="prefix",
                    stop_at_eos=False, max_batch_size=a.batch)
        return SamplerConfig(**{**base, **kw})

    def run(c: SamplerConfig, rows: int):
        return bl.timed(lambda: generate(policy, prompts[:rows], seeds[:rows], c), dev)

    parts = a.parts.split(",")
    stock: dict = {}  # steps -> the stock path's speed row; "tokens" -> its exactness-run tokens
    if "speed" in parts:
        with res.part("speed", dev):
            run(cfg(gen_length=4 * a.block, steps=4 * a.block), a.batch)  # warm-up: same batch, short canvas
            rows = {}
            for steps in a.steps:
                out, secs = run(cfg(steps=steps), a.batch)
                tflops = generation_flops(sc, a, steps, out.num_forwards) / secs / 1e12
                rows[steps] = {"forwards": out.num_forwards, "seconds": secs, "tokens_per_s": a.batch * a.gen / secs,
                               "tokens_per_step_per_row": a.gen / steps, "achieved_tflops": tflops,
                               "pct_of_measured_matmul": 100 * tflops / peak if peak else None,
                               "ms_per_forward": 1e3 * secs / out.num_forwards}
                res.put("speed", {"batch": a.batch, "block": a.block, "by_steps": rows})
            stock = dict(rows)
    if "profile" in parts:
        with res.part("profile", dev):
            c = cfg(gen_length=4 * a.block, steps=4 * a.block)  # forwards: prefill, then 4 per block
            res.put("profile", bl.profile_forwards(policy.model, lambda: generate(policy, prompts, seeds, c), dev,
                                                   skip=a.block, active=2 * a.block))
    if "exactness" in parts:
        with res.part("exactness", dev):
            rows = min(a.exact_batch, a.batch)
            c = cfg(gen_length=a.exact_gen, steps=a.exact_gen, temperature=0.0)
            row = {"rows": rows, "gen": a.exact_gen}
            fp32 = bl.build_policy(a.shape, dev, torch.float32, block_size=a.block, num_hidden_layers=a.exact_layers)
            row["fp32"] = {"layers": a.exact_layers, **agreement(fp32, prompts[:rows], seeds[:rows], c)}
            row["fp32"].pop("_tokens")
            del fp32
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            own = agreement(policy, prompts[:rows], seeds[:rows], c)
            stock["tokens"] = own.pop("_tokens")
            row[str(bl.compute_dtype(dev)).replace("torch.", "")] = own
            res.put("exactness", row)
    if "cuda_graph" in parts:
        with res.part("cuda_graph", dev):
            res.put("cuda_graph", cuda_graph(a, policy, prompts, seeds, cfg, stock, dev))
    if "gqa_fold" in parts:
        with res.part("gqa_fold", dev):
            from gqa_fold import folded_attention

            with folded_attention(policy):
                run(cfg(gen_length=4 * a.block, steps=4 * a.block), a.batch)  # warm-up
                out, secs = run(cfg(steps=a.gen), a.batch)
                row = {"steps": a.gen, "seconds": secs, "tokens_per_s": a.batch * a.gen / secs,
                       "ms_per_forward": 1e3 * secs / out.num_forwards}
                if a.gen in stock:
                    row["speedup_vs_stock"] = stock[a.gen]["seconds"] / secs
                if stock.get("tokens") is not None:
                    rows = stock["tokens"].shape[0]
                    folded, _ = run(cfg(gen_length=a.exact_gen, steps=a.exact_gen, temperature=0.0), rows)
                    row["token_agreement_with_stock"] = float((folded.completion_ids == stock["tokens"]).float().mean())
            res.put("gqa_fold", row)
    res.put("memory", {"peak_gib": bl.peak_memory_gib(dev)})


def cuda_graph(a, policy, prompts, seeds, cfg, stock: dict, dev: torch.device) -> dict:
    """The graphed in-block step (graphed_steps.py): speed at one token per step, stock attention
    and GQA fold, and fp32 exactness on the small model."""
    from gqa_fold import folded_attention
    from graphed_steps import generate_graphed

    row: dict = {}
    rows = min(a.exact_batch, a.batch)
    c = cfg(gen_length=a.exact_gen, steps=a.exact_gen, temperature=0.0)
    fp32 = bl.build_policy(a.shape, dev, torch.float32, block_size=a.block, num_hidden_layers=a.exact_layers)
    (graphed, replays), _ = bl.timed(lambda: generate_graphed(fp32, prompts[:rows], seeds[:rows], c), dev)
    ref = generate(fp32, prompts[:rows], seeds[:rows], c.model_copy(update={"cache": "none"}))
    row["fp32_exactness"] = {"layers": a.exact_layers, "replays": replays,
                             "token_agreement": float((graphed.completion_ids == ref.completion_ids).float().mean())}
    del fp32, graphed, ref
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    for name, ctx in (("sdpa", contextlib.nullcontext), ("sdpa_gqa_fold", lambda: folded_attention(policy))):
        with ctx():
            generate_graphed(policy, prompts, seeds, cfg(gen_length=4 * a.block, steps=4 * a.block))  # warm-up
            (out, replays), secs = bl.timed(lambda: generate_graphed(policy, prompts, seeds, cfg(steps=a.gen)), dev)
        r = {"steps": a.gen, "replays": replays, "seconds": secs, "tokens_per_s": a.batch * a.gen / secs,
             "ms_per_forward": 1e3 * secs / out.num_forwards}
        if a.gen in stock:
            r["speedup_vs_eager"] = stock[a.gen]["seconds"] / secs
        row[name] = r
    return row


def agreement(policy, prompts, seeds, c: SamplerConfig) -> dict:
    """Cached (exact cache) vs reference tokens of one model, temperature 0."""
    ref, ref_s = bl.timed(lambda: generate(policy, prompts, seeds, c.model_copy(update={"cache": "none"})), policy.device)
    got, got_s = bl.timed(lambda: generate(policy, prompts, seeds, c), policy.device)
    same = (got.completion_ids == ref.completion_ids).float()
    return {"token_agreement": float(same.mean()), "rows_identical": int(same.all(dim=1).sum()),
            "none_seconds": ref_s, "cached_seconds": got_s, "same_forwards": got.num_forwards == ref.num_forwards,
            "_tokens": got.completion_ids}


def generation_flops(sc: bl.ShapeCount, a: argparse.Namespace, steps: int, forwards: int) -> float:
    """FLOPs of one cached generation with fixed steps: the first forward feeds [prompt | block 0];
    the first step of every later block feeds [previous block | current block] (the previous one
    enters the cache), the other steps only the current block. Keys read: the prompt and the blocks
    up to the current one (the average over the generation). Logits: the current block."""
    b, bs = a.batch, a.block
    mean_keys = a.prompt + a.gen / 2 + bs / 2
    first = bl.forward_flops(sc, rows=b, query_len=a.prompt + bs, key_len=a.prompt + bs, logit_positions=bs)
    entering = bl.forward_flops(sc, rows=b, query_len=2 * bs, key_len=mean_keys, logit_positions=bs)
    inside = bl.forward_flops(sc, rows=b, query_len=bs, key_len=mean_keys, logit_positions=bs)
    nblocks = a.gen // bs
    n_entering = nblocks - 1
    n_inside = max(forwards - 1 - n_entering, 0)
    return first + n_entering * entering + n_inside * inside


if __name__ == "__main__":
    main()
