"""Benchmark: a receiver pulling the learner ranks' bytes with its copy engines (peer-to-peer
``cudaMemcpyAsync``, no kernel, no SM) beside its own generation, against the same pull idle: does a
transfer that needs none of the receiver's SMs keep its speed while the receiver's forwards fill
them? (The in-job push, NCCL broadcasts whose kernels share the worker's SMs with its forwards,
took 5.2x the raw broadcast idle at 3 ranks -> 1 worker.)

One process sees S + 1 GPUs: GPUs 0..S-1 each hold one source's share of LLaDA-8B's bf16 bytes
(ceil(total / S), random), GPU S holds a receiver policy of that shape and a staging copy of every
share. A pull copies each share into its staging segment, one CUDA stream per source, and the
host waits for those streams (not the whole device, which would wait for the requests' kernels).

pull_idle   the pull alone
pull_busy   the same while another thread generates on GPU S exactly as ``bench_push --engine``'s
            busy modes do (the job's sampler: gen 256, block 32, 128 steps, dual cache, threshold
            0.9, ``--busy-rows`` rows, the LM head scaled by ``--busy-head-scale``)
Each: one warm-up, then the median of ``--reps``; every share is checked byte for byte after.

    python tests/benchmarks/bench_peer_pull.py --sources 3 --out pull.json   # 4 GPUs, LLaDA-8B
    python tests/benchmarks/bench_peer_pull.py --tiny --out pull.json        # CPU: the same code
"""
from __future__ import annotations

import argparse
import contextlib
import time

import benchlib as bl
import torch


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--layers", type=int, default=None, help="layers (default: the model's 32)")
    ap.add_argument("--sources", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--busy-rows", type=int, default=32)
    ap.add_argument("--busy-prompt-tokens", type=int, default=100)
    ap.add_argument("--busy-head-scale", type=float, default=13.5)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    a.shape = "tiny-llada" if a.tiny else "llada-8b"
    return a


def main() -> None:
    from bench_push import Generating

    from stabledrl.rollout.engine import TorchRolloutEngine

    a = parse()
    cuda = torch.cuda.is_available()
    if cuda and torch.cuda.device_count() < a.sources + 1:
        raise SystemExit(f"--sources {a.sources} needs {a.sources + 1} visible GPUs, {torch.cuda.device_count()} seen")
    devs = [torch.device("cuda", i) if cuda else torch.device("cpu") for i in range(a.sources + 1)]
    recv = devs[-1]
    if cuda:
        torch.cuda.set_device(recv)
    dtype = bl.compute_dtype(recv)
    res = bl.Result("peer_pull", a.out, vars(a))
    policy = bl.build_policy(a.shape, recv, dtype, seed=1, **({} if a.layers is None else
                                                                {"num_hidden_layers": a.layers}))
    total = sum(p.numel() * p.element_size() for p in policy.parameters())
    share = -(-total // a.sources)
    g = torch.Generator().manual_seed(0)
    sources = [torch.randint(0, 256, (share,), dtype=torch.uint8, generator=g).to(d) for d in devs[:-1]]
    staging = [torch.empty(share, dtype=torch.uint8, device=recv) for _ in sources]
    streams = [torch.cuda.Stream(recv) for _ in sources] if cuda else [None] * a.sources
    peer = [bool(cuda and torch.cuda.can_device_access_peer(recv.index, d.index)) for d in devs[:-1]]
    res.put("setup", {"shape": a.shape, "sources": a.sources, "share_gib": share / 2**30, "gib": total / 2**30,
                      "peer_access": peer, "devices": [str(d) for d in devs]})

    def pull() -> float:
        t0 = time.perf_counter()
        for stream, dst, src in zip(streams, staging, sources):
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                dst.copy_(src, non_blocking=True)
        for stream in streams:
            if stream is not None:
                stream.synchronize()
        return time.perf_counter() - t0

    def timed(name: str, extra: dict | None = None) -> float:
        for dst in staging:  # what this mode's pulls must bring, wiped untimed
            dst.zero_()
        bl.sync(recv)
        secs = [pull() for _ in range(a.reps + 1)][1:]
        same = all(torch.equal(dst, src.to(recv)) for dst, src in zip(staging, sources))
        med = bl.median(secs)
        res.put(name, {"seconds": secs, "median_s": med, "gb_per_s": total / med / 1e9, "bytes_equal": same,
                       **(extra or {})})
        return med

    idle = None
    with res.part("pull_idle", recv):
        idle = timed("pull_idle")
    with res.part("pull_busy", recv):
        busy = Generating(policy, a, recv)
        busy.start(TorchRolloutEngine(policy))
        try:
            med = timed("pull_busy")
        finally:
            done, median_s, per_forward = busy.stop()
        res.data["parts"]["pull_busy"].update({
            "ratio_to_idle": med / idle if idle else None,
            "receiver_requests": {"done": int(done), "median_s": median_s, "tokens_per_forward": per_forward}})
        res.write()
    res.put("memory", {"peak_gib": bl.peak_memory_gib(recv)})
    failed = res.data["errors"] or not all(res.data["parts"].get(p, {}).get("bytes_equal") for p in
                                           ("pull_idle", "pull_busy"))
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
