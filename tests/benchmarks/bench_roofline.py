"""Where a generation's time goes at a job's shape: the matmuls, attention and the rest, by kernel.

The peer benchmark's roofline (peers/roofline.py) gives a loop's generation rate against the card's
square bf16 matmul rate (bench_matmul.py). This benchmark takes that rate apart at the shapes a
job feeds (default: d1's colocated worker, 12 rows of a 200-token prompt and 256 positions in
blocks of 32, at LLaDA-8B's shape with random weights in bf16):

gemm       every Linear of a decoder layer (LLaDA: q, k, v, attn_out; ff_proj, up_proj, ff_out) as
           ``F.linear`` on the layer's own weights at M = rows x tokens a forward, for the exact
           forward (the whole canvas) and the cached step (the block): TFLOP/s and the share of the
           square rate (each timing 20 products back to back, so that a product of tens of
           microseconds is not timed with its launch). The layer's rate at M is its FLOPs over the
           sum of its matmuls' times, the best a forward at that M does while its matmuls run one
           after another.
attention  ``scaled_dot_product_attention`` at the exact forward's shape [rows, heads, T, head_dim]
           with the 4-D boolean mask of full attention, without a mask, and with the mask on cuDNN's
           backend; and flash attention's variable-length kernel over each row's real keys (the
           rows flattened, each row's padding a sequence of keys that no query reads: the padding
           hidden without a mask): ms per layer and TFLOP/s. A backend that cannot run the shape
           is recorded as such.
exact      the exact sampler (cache none, ``sampler.compile`` unless --no-compile): a warm-up
           generation (it compiles), a timed one, then a profiled one: the rate over the card's
           matmul rate and, per forward, the device time by kernel category, the matmul kernels'
           TFLOP/s (the Linear and head FLOPs over their time) and attention's.
dual       the dual cache's step graphed (``sampler.cuda_graph``) and compiled, a fixed number of
           steps: the same figures over the whole generation (a full forward per block, then the
           cached steps).

``--short-prompts N``: the second half of the rows' prompts N tokens shorter, as d1's requests of two
prompts of different lengths give the sampler left-padded calls (the default: one length, no padding;
a graphed canvas is padded to its prompt bucket either way).

``--lora R``: the samplers run with unmerged adapters of rank R on d1's targets (q, k, v and the
MLP's up projection; common/models/lora.py), as a LoRA recipe's rollout worker holds them: their
thin matmuls are not counted as FLOPs, so the rate they cost shows against the run without.

From them: the share of each kernel category in a forward, and the generation's rate if its matmuls
ran at the gemm part's rates for their widths and nothing else took time (``shape_ceiling_of_matmul``,
with the gemm part run first). Where that ceiling is itself below a rate target, the matmuls' shape
holds the generation back, not the work between them.

    python tests/benchmarks/bench_roofline.py --peak-from matmul.json --out roofline.json   # GPU
    python tests/benchmarks/bench_roofline.py --tiny --out /tmp/roofline.json               # CPU check
"""
from __future__ import annotations

import argparse
import contextlib
from typing import Any, Optional

import benchlib as bl
import torch
import torch.nn.functional as F

from stabledrl.common.attention import full_mask
from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.models.lora import attach_adapters, target_paths
from stabledrl.rollout.sampling.compiled import decoder_layers
from stabledrl.rollout.sampling import StepGraphs, generate
from stabledrl.rollout.sampling.canvas import build_canvas

PARTS = ("gemm", "attention", "exact", "dual")
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "up_proj"]  # d1's effective targets, in the project's names
INNER = 20  # products a gemm timing runs back to back


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="toy model and sizes (CPU check)")
    ap.add_argument("--shape", default=None, help="benchlib SHAPES name (default llada-8b; tiny-llada with --tiny)")
    ap.add_argument("--layers", type=int, default=None, help="keep this many layers of the shape")
    ap.add_argument("--rows", type=int, default=None, help="rows a forward (default 12, d1's; 4 with --tiny)")
    ap.add_argument("--prompt", type=int, default=None, help="prompt tokens (default 200; 16 with --tiny)")
    ap.add_argument("--gen", type=int, default=None, help="gen_length (default 256; 32 with --tiny)")
    ap.add_argument("--block", type=int, default=None, help="block_length (default 32; 8 with --tiny)")
    ap.add_argument("--exact-steps", type=int, default=None,
                    help="steps of the exact part's generations (default 2 a block: every step is the same forward)")
    ap.add_argument("--dual-steps", type=int, default=None, help="steps of the dual part's generations (default gen/2)")
    ap.add_argument("--no-compile", action="store_true", help="the samplers eager (sampler.compile off)")
    ap.add_argument("--short-prompts", type=int, default=0,
                    help="the second half of the rows' prompts this many tokens shorter (left-padded calls)")
    ap.add_argument("--lora", type=int, default=0, help="adapters of this rank on q, k, v and up_proj (0: none)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {PARTS}")
    ap.add_argument("--peak-from", default=None, help="bench_matmul JSON of this card (the denominator)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    a.shape = a.shape or ("tiny-llada" if a.tiny else "llada-8b")
    a.rows = a.rows or (4 if a.tiny else 12)
    a.prompt = a.prompt or (16 if a.tiny else 200)
    a.gen = a.gen or (32 if a.tiny else 256)
    a.block = a.block or (8 if a.tiny else 32)
    a.exact_steps = a.exact_steps or 2 * (a.gen // a.block)
    a.dual_steps = a.dual_steps or a.gen // 2
    return a


class Bench:
    def __init__(self, a: argparse.Namespace, res: bl.Result) -> None:
        self.a, self.dev, self.res = a, bl.device(), res
        self.dtype = bl.compute_dtype(self.dev)
        self.peak = bl.read_peak_tflops(a.peak_from)
        overrides = {"num_hidden_layers": a.layers} if a.layers else {}
        self.policy = bl.build_policy(a.shape, self.dev, self.dtype, **overrides)
        self.sc = bl.count_shape(self.policy)  # before any adapter: the base model's FLOPs
        if a.lora:
            model = self.policy.model
            attach_adapters(model, target_paths(model, LORA_TARGETS), a.lora, scale=0.5)
        self.canvas = a.prompt + a.gen
        if not 0 <= a.short_prompts < a.prompt:
            raise ValueError(f"--short-prompts {a.short_prompts}: between 0 and the prompt's {a.prompt} tokens")
        self.prompts = bl.random_prompts(a.rows, a.prompt, self.policy.vocab_size, seed=1)
        half = a.rows // 2
        self.prompts[half:] = [p[a.short_prompts:] for p in self.prompts[half:]]
        # the canvas's real positions, as the samplers lay it out (the short rows left-padded)
        self.valid = build_canvas(self.prompts, a.gen, mask_token_id=self.policy.mask_token_id,
                                  pad_token_id=self.policy.pad_token_id, device=self.dev).valid
        self.seeds = torch.arange(a.rows)
        self.layer_rate: dict[int, float] = {}  # M -> the layer's matmul TFLOP/s (gemm part)
        self.res.put("model", {"shape": a.shape, "layers": self.sc.layers, "params": self.sc.total,
                               "linear_params": self.sc.linear, "dtype": str(self.dtype),
                               "rows": a.rows, "prompt": a.prompt, "gen": a.gen, "block": a.block,
                               "short_prompts": a.short_prompts,
                               "compile": not a.no_compile, "lora_rank": a.lora,
                               "measured_matmul_tflops": self.peak})

    def of_peak(self, tflops: Optional[float]) -> Optional[float]:
        return tflops / self.peak if tflops and self.peak else None

    # ---- the layer's matmuls at the job's M ---------------------------------------------------
    def layer_linears(self) -> list[tuple[str, torch.nn.Linear]]:
        """The first decoder layer's Linear modules (an adapted one timed as its base product)."""
        return [(n, m) for n, m in decoder_layers(self.policy)[0].named_modules() if isinstance(m, torch.nn.Linear)]

    def gemm(self) -> None:
        a, out = self.a, {}
        linears = self.layer_linears()
        if not linears:
            raise RuntimeError(f"no Linear in {a.shape}'s first decoder layer")
        for what, m_rows in (("exact forward (rows x canvas)", a.rows * self.canvas),
                             ("cached step (rows x block)", a.rows * a.block)):
            per, flops_sum, ms_sum = {}, 0.0, 0.0
            for name, lin in linears:
                x = torch.randn(m_rows, lin.in_features, device=self.dev, dtype=self.dtype)
                w = lin.weight.detach()
                def products() -> None:
                    for _ in range(INNER):
                        F.linear(x, w)

                with torch.inference_mode():
                    ms = bl.median(bl.event_times_ms(products, self.dev, warmup=1, reps=5)) / INNER
                flops = 2.0 * m_rows * lin.in_features * lin.out_features
                tflops = flops / (ms * 1e-3) / 1e12
                per[name] = {"k": lin.in_features, "n": lin.out_features, "ms": ms, "tflops": tflops,
                             "of_matmul": self.of_peak(tflops)}
                flops_sum, ms_sum = flops_sum + flops, ms_sum + ms
            rate = flops_sum / (ms_sum * 1e-3) / 1e12
            self.layer_rate[m_rows] = rate
            out[what] = {"m": m_rows, "layer_ms": ms_sum, "layer_tflops": rate, "layer_of_matmul": self.of_peak(rate),
                         "linears": per}
        self.res.put("gemm", out)

    # ---- attention at the exact forward's shape -----------------------------------------------
    def attention(self) -> None:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        a, sc = self.a, self.sc
        g = torch.Generator(self.dev).manual_seed(0)
        q, k, v = (torch.randn(a.rows, sc.heads, self.canvas, sc.head_dim, device=self.dev, generator=g)
                   .to(self.dtype) for _ in range(3))
        mask = full_mask(self.valid)
        flops = 4.0 * a.rows * sc.heads * sc.head_dim * self.canvas * self.canvas
        # the rows flattened to [B*T, H, D] as 2B sequences: row b's padding (keys only, no queries),
        # then its real keys, read by all T of the row's queries
        flat = [x.transpose(1, 2).reshape(-1, sc.heads, sc.head_dim).contiguous() for x in (q, k, v)]
        t, pad = self.canvas, (~self.valid).sum(dim=1, dtype=torch.int32)
        starts = torch.arange(a.rows, dtype=torch.int32, device=self.dev) * t
        end = torch.full((1,), a.rows * t, dtype=torch.int32, device=self.dev)
        cu_q = torch.cat([torch.stack([starts, starts], 1).flatten(), end])
        cu_k = torch.cat([torch.stack([starts, starts + pad], 1).flatten(), end])

        def varlen() -> torch.Tensor:
            return torch.ops.aten._flash_attention_forward(*flat, cu_q, cu_k, t, t, 0.0, False, False,
                                                           scale=sc.head_dim ** -0.5)[0]

        def sdpa(m: Optional[torch.Tensor]) -> Any:
            return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=m)

        backends = {"boolean mask (sdpa's choice)": (sdpa(mask), None),
                    "no mask": (sdpa(None), None),
                    "boolean mask on cuDNN": (sdpa(mask), [SDPBackend.CUDNN_ATTENTION]),
                    "boolean mask, efficient kernel": (sdpa(mask), [SDPBackend.EFFICIENT_ATTENTION]),
                    "the rows' real keys, variable-length flash": (varlen, None)}
        out: dict[str, Any] = {"shape": [a.rows, sc.heads, self.canvas, sc.head_dim],
                               "padded_rows": int((~self.valid).any(dim=1).sum())}
        for name, (fn, kernels) in backends.items():
            ctx = sdpa_kernel(kernels) if kernels else contextlib.nullcontext()
            try:
                with torch.inference_mode(), ctx:
                    ms = bl.median(bl.event_times_ms(fn, self.dev, warmup=3, reps=10))
            except RuntimeError as exc:  # no kernel of that backend for this shape, mask or device
                out[name] = {"unavailable": str(exc).splitlines()[0][:200]}
                continue
            tflops = flops / (ms * 1e-3) / 1e12
            out[name] = {"ms_per_layer": ms, "ms_per_forward": ms * sc.layers, "tflops": tflops,
                         "of_matmul": self.of_peak(tflops)}
        self.res.put("attention", out)

    # ---- the two samplers, profiled -------------------------------------------------------------
    def cfg(self, **kw) -> SamplerConfig:
        a = self.a
        base = dict(gen_length=a.gen, block_length=a.block, temperature=0.9, stop_at_eos=False,
                    max_batch_size=a.rows, compile=not a.no_compile)
        return SamplerConfig(**{**base, **kw})

    def exact(self) -> None:
        self.sampler("exact", self.cfg(cache="none", steps=self.a.exact_steps), graphs=None, refreshes=0)

    def dual(self) -> None:
        a = self.a
        self.sampler("dual", self.cfg(cache="dual", steps=a.dual_steps, cuda_graph=True), graphs=StepGraphs(),
                     refreshes=a.gen // a.block)

    def shape_bound_s(self, forwards: int, tokens: int, refreshes: int) -> Optional[float]:
        """Seconds the generation's matmuls take at the gemm part's layer rates: ``refreshes`` forwards
        of the whole canvas (every forward where 0), the other tokens fed at the block's width, the
        head at the block's; None without the gemm part's rates for both widths."""
        a, sc = self.a, self.sc
        full, block = a.rows * self.canvas, a.rows * a.block
        if full not in self.layer_rate or block not in self.layer_rate:
            return None
        full_tokens = tokens if refreshes == 0 else min(tokens, refreshes * full)
        full_flops = 2.0 * sc.linear * full_tokens
        block_flops = 2.0 * sc.linear * (tokens - full_tokens) + 2.0 * sc.head * block * forwards
        return full_flops / (self.layer_rate[full] * 1e12) + block_flops / (self.layer_rate[block] * 1e12)

    def sampler(self, part: str, cfg: SamplerConfig, graphs: Optional[StepGraphs], refreshes: int) -> None:
        a, sc = self.a, self.sc

        def run():
            return generate(self.policy, self.prompts, self.seeds, cfg, graphs)

        with torch.inference_mode():
            _, first_s = bl.timed(run, self.dev)  # compiles, captures
            out, secs = bl.timed(run, self.dev)
            prof = bl.profile_run(run, self.dev, forwards=out.num_forwards)
        forwards = out.num_forwards
        tokens = out.forward_tokens or a.rows * self.canvas * forwards
        attended = out.forward_attended or a.rows * self.canvas * self.canvas * forwards
        mm_flops = 2.0 * sc.linear * tokens + 2.0 * sc.head * a.rows * a.block * forwards
        att_flops = 4.0 * sc.heads * sc.head_dim * sc.layers * attended
        total = mm_flops + att_flops
        rate = total / secs / 1e12
        cats = prof.get("by_category") or {}
        mm_ms = (cats.get("matmul") or {}).get("ms_per_forward")
        att_ms = (cats.get("attention") or {}).get("ms_per_forward")
        ms_forward = 1e3 * secs / forwards
        bound = self.shape_bound_s(forwards, tokens, refreshes)
        mm_rate = mm_flops / forwards / (mm_ms * 1e-3) / 1e12 if mm_ms else None
        row = {
            "forwards": forwards, "first_generation_s": first_s, "seconds": secs, "ms_per_forward": ms_forward,
            "tokens_per_forward": tokens / forwards, "tflops": rate, "of_matmul": self.of_peak(rate),
            "matmul_kernels_tflops": mm_rate, "matmul_kernels_of_matmul": self.of_peak(mm_rate),
            "attention_kernels_tflops": att_flops / forwards / (att_ms * 1e-3) / 1e12 if att_ms else None,
            "ms_by_category_per_forward": {k: v["ms_per_forward"] for k, v in cats.items()},
            "share_of_forward": {k: v["ms_per_forward"] / ms_forward for k, v in cats.items()},
            # the generation's rate if its matmuls ran at the gemm part's rates for their widths and nothing
            # else took time: the most this shape allows without changing the matmuls
            "shape_ceiling_of_matmul": self.of_peak(total / bound / 1e12) if bound else None,
            "profile": {k: prof.get(k) for k in ("wall_ms_per_forward", "device_busy_ms_per_forward",
                                                  "device_busy_fraction", "kernels_per_forward", "top_kernels")},
        }
        self.res.put(part, row)


def main() -> None:
    bl.run_benchmark("roofline", parse(), Bench, PARTS)


if __name__ == "__main__":
    main()
