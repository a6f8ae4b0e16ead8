"""Benchmarks 2 and 3: full-attention sampling (LLaDA-8B shape, random weights, bf16).

Canvas [prompt 128 | gen 256], blocks of 32, a batch of B rows (default 32: 12,288 tokens per
naive forward, compute-bound). Every part runs the real engine (``stabledrl.rollout.sampling.generate``)
with ``stop_at_eos=False``, so every row decodes all 256 positions and the work is fixed.

naive       The exact sampler (cache none). Every step is the same forward over the whole canvas
            plus one decode step, so it is timed over one step per block (8 forwards) and a
            generation of S steps costs S x that per-step time (stated as extrapolated). FLOPs:
            Linear layers over B*384 tokens, the LM head over the block's B*32 positions,
            attention 384 x 384; achieved rate / the card's measured matmul rate (target >= 60%).
            Profile: the model forward alone (CUDA events) and the decode step alone.
            Compiled: the same with ``sampler.compile`` (decoder layers through torch.compile):
            per-step time, speed-up over eager, the forward alone, tokens equal to eager's.
cached      Dual cache (Fast-dLLM, refreshed once per block), fixed steps S1 = 128 and S2 = 256
            (--quick: 64 and 128), whole generations measured. Cache speed-up at equal steps = naive(S) / cached(S).
            From the two runs: t_cached = (T(S2) - T(S1)) / (S2 - S1) per cached step and
            t_refresh per block, so a run at k tokens per forward costs
            8 t_refresh + (256/k - 8) t_cached (the cost model, reported for k = 1..8).
parallel    Confidence-threshold decoding (0.9) with the dual cache. A random model's top
            probability is ~1/V, so the threshold would commit one token per step; the LM head is
            scaled by alpha so that the median top-1 confidence of block 0's first step equals the
            threshold (a model that is sure of about half its positions). The tokens per forward
            this gives are measured, not chosen; the run checks the cost model at that k. Rows are
            block-synchronous under the cache (rollout/sampling/state.py), so the cache is
            refreshed once per block: the refreshes are counted (= the number of blocks).
cuda_graph  the sampler's graphed dual-cache step (``SamplerConfig.cuda_graph``, rollout/sampling/
            graphs.py; refreshes eager), through one ``StepGraphs`` pool kept across generations
            (captured at the warm-up, replayed after), at the larger fixed step count of ``cached``
            and with the threshold on the scaled model: seconds, speed-ups over the eager dual
            cache and over naive, and whether the tokens equal the eager runs' (they must: the
            same kernels, LLaDA having no grouped-query heads to fold, prompt 128 no bucketing).
graph_pool  the graphed dual-cache step as a rollout worker runs it: through the engine's own pool
            (rollout/engine.py, ``graph_capacity`` shapes kept, prompt widths rounded up to 32) over
            a stream of requests whose prompt lengths follow a dataset's (--prompt-lengths-from:
            JSONL rows (or .jsonl.gz) with a "question" or "prompt", each estimated at ceil(UTF-8 bytes / 4) tokens
            plus --template-tokens; without it a synthetic spread), --prompts-per-request prompts of
            --group rows each (default 2 x 16, llada8b_1node's request), threshold decoding on the
            scaled head. The same stream runs eager, then graphed at each of --pool-capacities:
            seconds per request, static steps built (pool misses), the seconds of a request that
            builds against one that replays, the device memory the pool keeps, tokens equal to
            eager's; and the pool's miss rate over 2,000 requests drawn from the whole length list
            at capacities 1, 2, 4, 8 (arithmetic: an LRU over the rounded widths).
profile     torch.profiler over 6 in-block dual-cache steps (forward + decode step): wall vs
            device-busy ms per step, kernels launched, top-20 kernels, top host ops.
agreement   Temperature 0, fixed prompts, gen/2 steps (--quick: gen/4), the LM head scaled as in
            parallel. (a) Same-state agreement, the cache's own error: at every cached step the
            exact full forward is also run on the *same* canvas,
            and the block's masked positions are compared (argmax agreement, mean total-variation
            distance of the two distributions). (b) Trajectory agreement: fraction of equal final
            tokens, cached vs uncached generation; one early difference changes everything after
            it, and on random weights (nearly flat logits) bf16 rounding alone flips argmaxes, so
            (b) measures divergence, not quality ((a) is the number to read). Dual and prefix
            (--quick: dual); and (b) with the threshold on the scaled model (not in --quick).

    python tests/benchmarks/bench_full_attention.py --peak-from matmul.json --out fa.json
    python tests/benchmarks/bench_full_attention.py --tiny --out fa.json
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import math
import random
from collections import OrderedDict
from pathlib import Path

import benchlib as bl
import torch

from stabledrl.common.attention import full_mask
from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.rollout.sampling import generate
from stabledrl.rollout.sampling.base import forward_block_logits, run_denoising
from stabledrl.rollout.sampling.canvas import build_canvas
from stabledrl.rollout.sampling.compiled import compiled_layers
from stabledrl.rollout.sampling.full_attention import FullAttentionLogits
from stabledrl.rollout.sampling.decode import choose_tokens, commit_mask
from stabledrl.common.seeding import generator

PARTS = ("naive", "cached", "parallel", "cuda_graph", "graph_pool", "profile", "agreement")


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="toy model and sizes (CPU check)")
    ap.add_argument("--batch", type=int, default=None, help="rows (default 32; 4 with --tiny)")
    ap.add_argument("--prompt", type=int, default=None, help="prompt tokens (default 128; 16 with --tiny)")
    ap.add_argument("--gen", type=int, default=None, help="gen_length (default 256; 32 with --tiny)")
    ap.add_argument("--block", type=int, default=None, help="block_length (default 32; 8 with --tiny)")
    ap.add_argument("--temperature", type=float, default=0.9, help="rollout temperature of the speed runs")
    ap.add_argument("--threshold", type=float, default=0.9)
    ap.add_argument("--agree-batch", type=int, default=None, help="rows of the agreement runs (default 4; 2 tiny)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {PARTS}")
    ap.add_argument("--quick", action="store_true", help="fewer and shorter runs (the GPU re-measure)")
    ap.add_argument("--prompt-lengths-from", default=None,
                    help="graph_pool: a JSONL of prompts ('question' or 'prompt'), e.g. GSM8K's train.jsonl; the "
                    "file is read, never copied (default: a synthetic spread)")
    ap.add_argument("--template-tokens", type=int, default=32,
                    help="graph_pool: tokens the chat template and instruction add to every prompt")
    ap.add_argument("--prompts-per-request", type=int, default=2, help="graph_pool: prompts in one worker request")
    ap.add_argument("--group", type=int, default=None, help="graph_pool: rows per prompt (default 16; 2 with --tiny)")
    ap.add_argument("--pool-requests", type=int, default=None,
                    help="graph_pool: requests in the stream (default 12; 6 with --quick, 3 with --tiny)")
    ap.add_argument("--pool-capacities", default=None,
                    help="graph_pool: comma list of pool sizes to run (default 2,4; 2 with --quick or --tiny)")
    ap.add_argument("--peak-from", default=None, help="bench_matmul JSON of this card (the denominator)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    tiny = a.tiny
    a.shape = "tiny-llada" if tiny else "llada-8b"
    a.batch = a.batch or (4 if tiny else 32)
    a.prompt = a.prompt or (16 if tiny else 128)
    a.gen = a.gen or (32 if tiny else 256)
    a.block = a.block or (8 if tiny else 32)
    a.agree_batch = a.agree_batch or (2 if tiny else 4)
    a.group = a.group or (2 if tiny else 16)
    a.pool_requests = a.pool_requests or (3 if tiny else 6 if a.quick else 12)
    a.pool_capacities = [int(c) for c in (a.pool_capacities or ("2" if tiny or a.quick else "2,4")).split(",")]
    return a


class Bench:
    def __init__(self, a: argparse.Namespace, res: bl.Result) -> None:
        self.a, self.dev, self.res = a, bl.device(), res
        self.parts = bl.part_names(a)
        self.peak = bl.read_peak_tflops(a.peak_from)
        built, secs = bl.timed(lambda: bl.build_policy(a.shape, self.dev, bl.compute_dtype(self.dev)), self.dev)
        self.policy, self.sc = built, bl.count_shape(built)
        self.nblocks = a.gen // a.block
        self.prompts = bl.random_prompts(a.batch, a.prompt, self.policy.vocab_size, seed=1)
        self.seeds = torch.arange(a.batch)
        self.res.put("model", {"shape": a.shape, "params": self.sc.total, "linear_params": self.sc.linear,
                               "head_params": self.sc.head, "build_s": secs, "dtype": str(bl.compute_dtype(self.dev)),
                               "measured_matmul_tflops": self.peak})
        self.t_naive = None  # seconds per naive step
        self.cached_s: dict[int, float] = {}  # steps -> seconds per dual-cache generation
        self.cached_tokens: dict[int, torch.Tensor] = {}  # steps -> its tokens
        self.parallel_run: dict = {}  # the eager threshold run: seconds, tokens

    def cfg(self, **kw) -> SamplerConfig:
        base = dict(
            gen_length=self.a.gen,
            block_length=self.a.block,
            steps=self.nblocks,
            temperature=self.a.temperature,
            cache="none",
            stop_at_eos=False,
            max_batch_size=max(self.a.batch, self.a.agree_batch),
        )
        return SamplerConfig(**{**base, **kw})

    def run(self, cfg: SamplerConfig, rows: int | None = None):
        rows = rows or self.a.batch
        return bl.timed(lambda: generate(self.policy, self.prompts[:rows], self.seeds[:rows], cfg), self.dev)

    def pct(self, tflops: float) -> dict:
        return {"pct_of_measured_matmul": None if not self.peak else 100 * tflops / self.peak,
                "pct_of_nominal_989": 100 * tflops / bl.NOMINAL_H100_BF16_TFLOPS if self.dev.type == "cuda" else None}

    # ---- 2: naive -------------------------------------------------------------------------
    def naive(self) -> None:
        a, cfg = self.a, self.cfg()
        self.run(cfg)  # warm-up: CUDA context, cuBLAS handles, allocator
        out, secs = self.run(cfg)
        self.t_naive = secs / out.num_forwards
        length = a.prompt + a.gen
        flops = bl.forward_flops(self.sc, rows=a.batch, query_len=length, key_len=length, logit_positions=a.block)
        engine_tflops = flops / self.t_naive / 1e12
        fwd_ms, decode_ms = self.profile_naive_step()
        tokens = a.batch * a.gen
        self.res.put("naive", {
            "batch": a.batch, "canvas": length, "forwards_timed": out.num_forwards, "seconds": secs,
            "s_per_step": self.t_naive, "tflop_per_forward": flops / 1e12, "engine_tflops": engine_tflops,
            **{f"engine_{k}": v for k, v in self.pct(engine_tflops).items()},
            "forward_only_ms": fwd_ms, "forward_only_tflops": flops / (fwd_ms * 1e-3) / 1e12,
            **{f"forward_only_{k}": v for k, v in self.pct(flops / (fwd_ms * 1e-3) / 1e12).items()},
            "decode_step_ms": decode_ms,
            "tokens_per_s_at_steps": {s: tokens / (s * self.t_naive) for s in (a.gen, a.gen // 2)},
            "note": "tokens/s at S steps = B*gen / (S * s_per_step): every naive step is the same full forward",
            "compiled": self.naive_compiled(flops, out),
        })

    def naive_compiled(self, flops: float, eager) -> dict:
        """The same exact sampler with ``sampler.compile`` (its decoder layers through torch.compile):
        compiled at the warm-up generation, then timed like the eager one; the forward alone under
        the compiled layers; the share of tokens equal to the eager run's (bf16: rounding may differ)."""
        cfg = self.cfg(compile=True)
        _, compile_s = self.run(cfg)  # warm-up: the compilation
        out, secs = self.run(cfg)
        per_step = secs / out.num_forwards
        forward = self.naive_forward()
        with torch.inference_mode(), compiled_layers(self.policy):
            fwd = bl.median(bl.event_times_ms(forward, self.dev, warmup=1, reps=3))
        tflops = flops / per_step / 1e12
        return {
            "first_generation_s": compile_s, "s_per_step": per_step, "engine_tflops": tflops,
            **{f"engine_{k}": v for k, v in self.pct(tflops).items()},
            "speedup_vs_eager": self.t_naive / per_step, "forward_only_ms": fwd,
            "forward_only_tflops": flops / (fwd * 1e-3) / 1e12,
            "tokens_equal_to_eager": float((out.completion_ids == eager.completion_ids).float().mean()),
        }

    def naive_forward(self):
        """One naive step's model forward over the whole canvas (the first block's logits), as a call."""
        a, p = self.a, self.policy
        canvas = build_canvas(
            self.prompts, a.gen, mask_token_id=p.mask_token_id, pad_token_id=p.pad_token_id, device=self.dev
        )
        mask = full_mask(canvas.valid)

        def forward() -> torch.Tensor:
            return p(canvas.ids, attention_mask=mask, position_ids=canvas.position_ids,
                     logits_from=a.prompt, logits_to=a.prompt + a.block).logits

        return forward

    def profile_naive_step(self) -> tuple[float, dict]:
        """(model forward alone, ms) and the decode step alone (ms; float64, float32 and the StableDRL
        release's float32-then-bfloat16 Gumbel noise; eager and fused)."""
        a, p = self.a, self.policy
        forward = self.naive_forward()
        with torch.inference_mode():
            fwd = bl.median(bl.event_times_ms(forward, self.dev, warmup=1, reps=3))
            logits = forward()  # [B, Lb, V]
            gens = [generator(i, self.dev) for i in range(a.batch)]
            masked = torch.ones(logits.shape[:2], dtype=torch.bool, device=self.dev)
            k = torch.full((a.batch,), max(1, a.block // 16), device=self.dev)
            decode = {}
            for name, noise in (("float64_noise", "float64"), ("float32_noise", "float32"),
                                ("release_product_noise", "float32_then_bfloat16")):
                for fused in (False, True):  # fused: sampler.compile's one-pass choice (the warm-up compiles it)
                    def step():
                        x0, conf = choose_tokens(logits.clone(), a.temperature, gens, mask_token_id=p.mask_token_id,
                                                 noise_dtype=noise, fused=fused)
                        return commit_mask(conf, masked, k=k)

                    key = name + ("_fused" if fused else "")
                    decode[key] = bl.median(bl.event_times_ms(step, self.dev, warmup=2, reps=5))
        return fwd, decode

    # ---- 3: cached at equal steps, and the cost model --------------------------------------
    def cached(self) -> None:
        a = self.a
        top = a.gen // 2 if a.quick else a.gen
        steps = sorted({min(a.gen, max(self.nblocks, top // 2)), top})  # 128 and 256 (--quick: 64 and 128)
        self.run(self.cfg(cache="dual", steps=2 * self.nblocks))  # warm-up of the cached shapes
        rows = {}
        for s in steps:
            out, secs = self.run(self.cfg(cache="dual", steps=s))
            self.cached_s[s] = secs
            self.cached_tokens[s] = out.completion_ids
            tps = a.batch * a.gen / secs
            rows[s] = {"forwards": out.num_forwards, "seconds": secs, "tokens_per_s": tps}
            if self.t_naive:
                rows[s]["naive_tokens_per_s_extrapolated"] = a.batch * a.gen / (s * self.t_naive)
                rows[s]["speedup_vs_naive_equal_steps"] = s * self.t_naive / secs
        model = self.cost_model()
        self.res.put(
            "cached", {"mode": "dual", "batch": a.batch, "temperature": a.temperature, "by_steps": rows, **model}
        )

    def cost_model(self) -> dict:
        if len(self.cached_s) < 2:
            return {}
        (s1, t1), (s2, t2) = sorted(self.cached_s.items())
        t_c = (t2 - t1) / (s2 - s1)
        t_refresh = t1 / self.nblocks - (s1 / self.nblocks - 1) * t_c
        self.t_cached, self.t_refresh = t_c, t_refresh
        out = {"t_cached_step_s": t_c, "t_refresh_step_s": t_refresh}
        if self.t_naive:
            naive_full = self.a.gen * self.t_naive  # naive at one token per step (LLaDA's reference setting)
            out["speedup_vs_naive_steps_gen_at_k_tokens_per_forward"] = {
                k: naive_full / self.predict(k) for k in (1, 2, 3, 4, 6, 8)}
            out["cost_model"] = "T(k) = nblocks*t_refresh + (gen/k - nblocks)*t_cached; naive = gen*t_naive_step"
        return out

    def predict(self, k: float) -> float:
        forwards = max(self.a.gen / k, self.nblocks)
        return self.nblocks * self.t_refresh + (forwards - self.nblocks) * self.t_cached

    # ---- 3: threshold decoding on a model with meaningful confidence -----------------------
    @contextlib.contextmanager
    def scaled_head(self):
        """The LM head scaled by the calibrated alpha inside the block (restored after); yields
        (alpha, top-1 quantiles)."""
        head = self.policy.model.get_output_embeddings().weight
        original = head.detach().clone()
        try:
            yield self.calibrate(self.a.threshold, head)
        finally:
            with torch.no_grad():
                head.copy_(original)

    def parallel(self) -> None:
        a = self.a
        with self.scaled_head() as (alpha, quantiles):
            cfg = self.cfg(cache="dual", steps=None, threshold=a.threshold)
            self.run(cfg, rows=min(a.batch, 4))  # warm-up of the threshold path
            lengths: list[int] = []
            hook = self.policy.model.register_forward_pre_hook(
                lambda m, args, kw: lengths.append(kw["input_ids"].shape[1]), with_kwargs=True)
            try:
                out, secs = self.run(cfg)
            finally:
                hook.remove()
            k = a.batch * a.gen / (out.num_forwards * a.batch)  # forwards are batch-wide
            self.parallel_run = {"seconds": secs, "tokens": out.completion_ids}
            row = {"alpha": alpha, "block0_top1_conf_quantiles_10_50_90": quantiles, "forwards": out.num_forwards,
                   "refreshes": sum(n == a.prompt + a.gen for n in lengths), "blocks": self.nblocks,
                   "tokens_per_forward_per_row": k, "seconds": secs, "tokens_per_s": a.batch * a.gen / secs}
            if self.t_naive:
                row["speedup_vs_naive_steps_gen"] = a.gen * self.t_naive / secs
                row["speedup_vs_naive_steps_half_gen"] = (a.gen // 2) * self.t_naive / secs
            if getattr(self, "t_cached", None):
                row["cost_model_prediction_s"] = self.predict(k)
            self.res.put("parallel", row)
            if "agreement" in self.parts and not a.quick:
                with self.res.part("agreement_threshold", self.dev):
                    cfg0 = self.cfg(steps=None, threshold=a.threshold, temperature=0.0)
                    self.res.put("agreement_threshold", self.agree(cfg0, ("dual",)))

    def calibrate(self, threshold: float, head: torch.Tensor) -> tuple[float, list[float]]:
        """Scale the LM head by alpha so that the median top-1 probability over block 0's positions
        at the first step equals ``threshold``; returns (alpha, top-1 quantiles at alpha)."""
        a, p = self.a, self.policy
        canvas = build_canvas(
            self.prompts, a.gen, mask_token_id=p.mask_token_id, pad_token_id=p.pad_token_id, device=self.dev
        )
        with torch.inference_mode():
            logits = p(canvas.ids, attention_mask=full_mask(canvas.valid), position_ids=canvas.position_ids,
                       logits_from=a.prompt, logits_to=a.prompt + a.block).logits.float()  # [B, Lb, V]
            logits[..., p.mask_token_id] = float("-inf")

            def top1(alpha: float) -> torch.Tensor:
                return torch.softmax(alpha * logits, dim=-1).amax(dim=-1).flatten()  # [B * Lb]

            lo, hi = -6.0, 14.0  # log2 alpha
            for _ in range(40):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if top1(2**mid).median() < threshold else (lo, mid)
            alpha = 2 ** hi
            q = torch.quantile(top1(alpha), torch.tensor([0.1, 0.5, 0.9], device=logits.device)).tolist()
        with torch.no_grad():
            head.mul_(alpha)
        return alpha, q

    # ---- the sampler's graphed dual-cache step ------------------------------------------------
    def cuda_graph(self) -> None:
        from stabledrl.rollout.sampling import StepGraphs

        a, row, graphs = self.a, {}, StepGraphs()

        def timed_run(cfg):
            cfg, before = cfg.model_copy(update={"cuda_graph": True}), graphs.replays
            out, secs = bl.timed(lambda: generate(self.policy, self.prompts, self.seeds, cfg, graphs), self.dev)
            return (out, graphs.replays - before), secs  # this run's replays

        timed_run(self.cfg(cache="dual", steps=2 * self.nblocks))  # warm-up (capture, replays)
        steps = max(self.cached_s) if self.cached_s else self.a.gen // 2
        (out, replays), secs = timed_run(self.cfg(cache="dual", steps=steps))
        row["fixed"] = {"steps": steps, "replays": replays, "seconds": secs, "tokens_per_s": a.batch * a.gen / secs,
                        "speedup_vs_eager_dual": self.cached_s[steps] / secs if steps in self.cached_s else None,
                        "speedup_vs_naive_equal_steps": steps * self.t_naive / secs if self.t_naive else None,
                        "tokens_equal_eager": _same(out.completion_ids, self.cached_tokens.get(steps))}
        self.res.put("cuda_graph", row)
        with self.scaled_head() as (alpha, _):
            (out, replays), secs = timed_run(self.cfg(cache="dual", steps=None, threshold=a.threshold))
        eager = self.parallel_run
        row["threshold"] = {
            "alpha": alpha, "forwards": out.num_forwards, "replays": replays, "seconds": secs,
            "tokens_per_forward_per_row": a.gen / out.num_forwards, "tokens_per_s": a.batch * a.gen / secs,
            "speedup_vs_naive_steps_gen": a.gen * self.t_naive / secs if self.t_naive else None,
            "speedup_vs_eager_threshold": eager["seconds"] / secs if eager else None,
            "tokens_equal_eager": _same(out.completion_ids, eager.get("tokens"))}
        self.res.put("cuda_graph", row)

    # ---- the engine's graph pool under a spread of prompt lengths -------------------------------
    def graph_pool(self) -> None:
        from stabledrl.rollout.engine import TorchRolloutEngine
        from stabledrl.rollout.sampling.graphs import PROMPT_BUCKET, graph_prompt_width

        a = self.a
        lengths, source = prompt_lengths(a.prompt_lengths_from, a.template_tokens, self.a.prompt)
        rng = random.Random(0)
        stream = [[rng.choice(lengths) for _ in range(a.prompts_per_request)] for _ in range(a.pool_requests)]
        g = torch.Generator().manual_seed(2)
        requests, widths = [], []
        for i, lens in enumerate(stream):
            prompts = [torch.randint(4, self.policy.vocab_size, (n,), generator=g) for n in lens]
            rows = [p for p in prompts for _ in range(a.group)]
            requests.append((rows, torch.arange(len(rows)) + 1000 * i))
            widths.append(graph_prompt_width(prompts, 1))  # the canvas width the graphed dual-cache step keys on
        q = sorted(lengths)
        row = {"source": source, "template_tokens": a.template_tokens, "prompts": len(lengths),
               "prompt_tokens_min_median_max": [q[0], q[len(q) // 2], q[-1]],
               "requests": len(requests), "rows_per_request": a.prompts_per_request * a.group,
               "widths": widths, "simulated_miss_rate": {
                   cap: lru_miss_rate(lengths, a.prompts_per_request, cap, PROMPT_BUCKET) for cap in (1, 2, 4, 8)}}
        self.res.put("graph_pool", row)
        with self.scaled_head() as (alpha, _):
            cfg = self.cfg(cache="dual", steps=None, threshold=a.threshold, max_batch_size=64)
            row["alpha"] = alpha
            eager_engine = TorchRolloutEngine(self.policy)
            eager_engine.generate(*requests[0], cfg)  # warm-up: allocator, kernels
            eager = [bl.timed(lambda r=r: eager_engine.generate(*r, cfg), self.dev) for r in requests]
            row["eager"] = {"seconds": [s for _, s in eager], "total_s": sum(s for _, s in eager)}
            self.res.put("graph_pool", row)
            for cap in a.pool_capacities:
                row[f"graphed_capacity_{cap}"] = self.pool_stream(
                    TorchRolloutEngine(self.policy, graph_capacity=cap), requests, cfg, eager)
                self.res.put("graph_pool", row)

    def pool_stream(self, engine, requests, cfg: SamplerConfig, eager) -> dict:
        """One engine (its own pool) over the request stream, graphed; against the eager runs."""
        cfg = cfg.model_copy(update={"cuda_graph": True})
        bl.sync(self.dev)
        before = torch.cuda.memory_allocated(self.dev) if self.dev.type == "cuda" else 0
        seconds, built, equal = [], [], []
        for (rows, seeds), (eager_out, _) in zip(requests, eager):
            n = engine.graphs.built
            out, secs = bl.timed(lambda: engine.generate(rows, seeds, cfg), self.dev)
            seconds.append(secs)
            built.append(engine.graphs.built - n)
            equal.append(float((out.completion_ids == eager_out.completion_ids).float().mean()))
        kept = (torch.cuda.memory_allocated(self.dev) - before) / 2**30 if self.dev.type == "cuda" else None
        miss = [s for s, b in zip(seconds[1:], built[1:]) if b]  # the first request also warms the path up
        hit = [s for s, b in zip(seconds[1:], built[1:]) if not b]
        total = sum(seconds)
        eager_total = sum(s for _, s in eager)
        out = {"seconds": seconds, "static_steps_built": built, "captures": engine.graphs.captures,
               "replays": engine.graphs.replays, "total_s": total, "speedup_vs_eager": eager_total / total,
               "speedup_vs_eager_after_first": sum(s for _, s in eager[1:]) / max(sum(seconds[1:]), 1e-9),
               "misses_after_first": len(miss), "building_request_s_mean": sum(miss) / len(miss) if miss else None,
               "replaying_request_s_mean": sum(hit) / len(hit) if hit else None,
               "pool_memory_kept_gib": kept, "tokens_equal_eager_mean": sum(equal) / len(equal)}
        engine.graphs.clear()  # its static steps' caches and graphs handed back before the next pool
        if self.dev.type == "cuda":
            torch.cuda.empty_cache()
        return out

    # ---- profile of the cached step -------------------------------------------------------
    def profile(self) -> None:
        a = self.a
        cfg = self.cfg(cache="dual", steps=a.gen // 2)  # gen/2 steps: 16 steps per block of 32
        run = lambda: generate(self.policy, self.prompts, self.seeds, cfg)  # noqa: E731
        self.res.put("profile", {"what": "in-block dual-cache steps (forward + decode step)",
                                 **bl.profile_forwards(self.policy.model, run, self.dev, skip=2, active=6)})

    # ---- 3: agreement -----------------------------------------------------------------------
    def agreement(self) -> None:
        """On the scaled (confident) model of the threshold run: a flat random model's argmax is
        decided by differences far below any cache's error."""
        cfg = self.cfg(steps=self.a.gen // (4 if self.a.quick else 2), temperature=0.0)
        with self.scaled_head() as (alpha, _):
            row = self.agree(cfg, ("dual",) if self.a.quick else ("dual", "prefix"), same_state=True)
        self.res.put("agreement", {"lm_head_alpha": alpha, **row})

    def agree(self, cfg: SamplerConfig, modes: tuple[str, ...], same_state: bool = False) -> dict:
        rows = self.a.agree_batch
        ref, ref_s = self.run(cfg.model_copy(update={"cache": "none"}), rows=rows)
        out = {"rows": rows, "steps": cfg.steps, "threshold": cfg.threshold, "none_forwards": ref.num_forwards,
               "none_seconds": ref_s}
        for mode in modes:
            c = cfg.model_copy(update={"cache": mode})
            if same_state:
                (got, state_stats), secs = bl.timed(lambda: probe_same_state(self.policy, self.prompts[:rows],
                                                                              self.seeds[:rows], c), self.dev)
            else:
                (got, secs), state_stats = self.run(c, rows=rows), {}
            same = (got.completion_ids == ref.completion_ids).float()
            out[mode] = {"token_agreement": float(same.mean()), "rows_identical": int(same.all(dim=1).sum()),
                         "forwards": got.num_forwards, "seconds": secs, **state_stats}
        return out


def _same(a: torch.Tensor, b) -> bool | None:
    return None if b is None else bool(torch.equal(a, b))


class SameStateProbe(FullAttentionLogits):
    """The cached ``block_logits`` that also runs the exact full forward on the same canvas at
    every cached step and accumulates how far the two block distributions are, over the
    positions still masked: argmax agreement and total-variation distance."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.positions, self.same_argmax, self.tv = 0, None, None

    def __call__(self, state, view):
        got = super().__call__(state, view)  # [B, Lb, V]
        if view.refresh:  # a refresh is the exact forward itself
            return got
        c = self.canvas
        exact = forward_block_logits(self.policy, c.ids, attention_mask=self.mask, position_ids=c.position_ids,
                                     logits_from=c.prompt_width + view.lo, offsets=self._offsets(state, view),
                                     block_length=self.block_length)
        masked = (c.ids.gather(1, state.block_positions()) == self.policy.mask_token_id) & ~state.done[:, None]
        p, q = torch.softmax(got.float(), -1), torch.softmax(exact.float(), -1)  # [B, Lb, V]
        same = (got.argmax(-1) == exact.argmax(-1)) & masked
        tv = 0.5 * (p - q).abs().sum(-1) * masked
        self.same_argmax = same.sum() if self.same_argmax is None else self.same_argmax + same.sum()
        self.tv = tv.sum() if self.tv is None else self.tv + tv.sum()
        self.positions += masked.sum()
        return got


def prompt_lengths(path: str | None, template_tokens: int, prompt: int) -> tuple[list[int], str]:
    """(token lengths of a dataset's prompts, where they came from): each JSONL row's "question" or
    "prompt" estimated at ceil(UTF-8 bytes / 4) tokens (English under a BPE vocabulary) plus the
    template's tokens; without a file, a synthetic spread of 0.5-4x ``prompt`` (rehearsals)."""
    if path is None:
        rng = random.Random(1)
        return [rng.randint(prompt // 2, 4 * prompt) for _ in range(512)], "synthetic: uniform 0.5-4x --prompt"
    lengths = []
    text_of = gzip.open(path, "rt") if path.endswith(".gz") else open(path)
    with text_of as f:
        lines = f.read().splitlines()
    for line in lines:
        if line.strip():
            row = json.loads(line)
            text = row.get("question", row.get("prompt"))
            if not isinstance(text, str):
                raise ValueError(f"{path}: a row without a 'question' or 'prompt' string: {line[:80]!r}")
            lengths.append(math.ceil(len(text.encode()) / 4) + template_tokens)
    if not lengths:
        raise ValueError(f"{path}: no prompts")
    return lengths, f"{Path(path).name}: ceil(bytes / 4) + {template_tokens} template tokens"


def lru_miss_rate(lengths: list[int], per_request: int, capacity: int, bucket: int, requests: int = 2000) -> float:
    """The share of ``requests`` requests (``per_request`` prompts drawn from ``lengths``) whose
    rounded width is not among the ``capacity`` most recently used ones."""
    rng, pool, misses = random.Random(0), OrderedDict(), 0
    for _ in range(requests):
        width = -(-max(rng.choice(lengths) for _ in range(per_request)) // bucket) * bucket
        if width in pool:
            pool.move_to_end(width)
        else:
            misses += 1
            pool[width] = None
            while len(pool) > capacity:
                pool.popitem(last=False)
    return misses / requests


def probe_same_state(policy, prompts, seeds, cfg: SamplerConfig):
    """(GenerationOutput, same-state statistics) of one cached generation (see SameStateProbe)."""
    block_length, _, steps_per_block = cfg.layout(policy.block_size)
    mode = cfg.resolved_cache(block_diffusion=False)
    with torch.inference_mode():
        canvas = build_canvas(prompts, cfg.gen_length, mask_token_id=policy.mask_token_id,
                              pad_token_id=policy.pad_token_id, device=policy.device)
        probe = SameStateProbe(policy, canvas, block_length, mode)
        out = run_denoising(canvas, seeds, cfg, block_length=block_length, steps_per_block=steps_per_block,
                            mask_token_id=policy.mask_token_id, eos_token_id=policy.eos_token_id, block_logits=probe,
                            block_sync=True)
    n = max(int(probe.positions), 1)
    return out, {"same_state_positions": int(probe.positions),
                 "same_state_argmax_agreement": float(probe.same_argmax) / n if probe.same_argmax is not None else None,
                 "same_state_mean_tv_distance": float(probe.tv) / n if probe.tv is not None else None}


def main() -> None:
    bl.run_benchmark("full_attention", parse(), Bench, PARTS)


if __name__ == "__main__":
    main()
