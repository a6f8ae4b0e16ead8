"""Benchmark 1: the card's bf16 matrix-product rate, the denominator of every ratio.

C = A @ B with A, B of n x n random bf16 (n = 8192: 2 n^3 = 1.1 TFLOP per product), timed with
CUDA events after a warm-up; the median of the timed products. Two input sets alternate so that
no product reads what the previous one left in L2. Also a device-to-device copy (bytes read +
written) for the bandwidth ceiling that the memory-bound parts (cached decoding) meet.

    python tests/benchmarks/bench_matmul.py --out /tmp/matmul.json          # GPU
    python tests/benchmarks/bench_matmul.py --tiny --out /tmp/matmul.json   # CPU check
"""
from __future__ import annotations

import argparse

import benchlib as bl
import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="small sizes for a CPU check")
    ap.add_argument("--n", type=int, default=None, help="matrix size (default 8192; 256 with --tiny)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=None, help="JSON result file")
    args = ap.parse_args()
    dev = bl.device()
    dtype = bl.compute_dtype(dev)
    n = args.n or (256 if args.tiny else 8192)
    res = bl.Result("matmul", args.out, vars(args))

    with res.part("matmul", dev):
        g = torch.Generator(dev).manual_seed(0)
        pairs = [
            (torch.randn(n, n, device=dev, generator=g).to(dtype), torch.randn(n, n, device=dev, generator=g).to(dtype))
            for _ in range(2)
        ]
        out = torch.empty(n, n, device=dev, dtype=dtype)
        state = {"i": 0}

        def product() -> None:
            a, b = pairs[state["i"] % 2]
            state["i"] += 1
            torch.matmul(a, b, out=out)

        ms = bl.event_times_ms(product, dev, warmup=5, reps=args.reps)
        flops = 2.0 * n**3
        res.put("matmul", {
            "n": n, "dtype": str(dtype), "ms_median": bl.median(ms), "ms_min": min(ms),
            "tflops_median": flops / (bl.median(ms) * 1e-3) / 1e12, "tflops_best": flops / (min(ms) * 1e-3) / 1e12,
            "nominal_bf16_tflops": bl.NOMINAL_H100_BF16_TFLOPS if dev.type == "cuda" else None,
        })

    with res.part("copy", dev):
        numel = (1 << 30 if dev.type == "cuda" else 1 << 22)  # 2 GiB of bf16 on GPU
        src = torch.randn(numel, device=dev).to(dtype)
        dst = torch.empty_like(src)
        ms = bl.event_times_ms(lambda: dst.copy_(src), dev, warmup=3, reps=10)
        moved = 2 * src.numel() * src.element_size()
        res.put("copy", {"gib": src.numel() * src.element_size() / 2**30, "ms_median": bl.median(ms),
                         "tb_per_s_read_plus_write": moved / (bl.median(ms) * 1e-3) / 1e12})


if __name__ == "__main__":
    main()
