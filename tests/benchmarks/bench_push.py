"""Benchmark 6: weight push of LLaDA-8B bf16 weights (16 GB, 291 tensors) from GPU 0 to GPU 1 over
the project's NCCL push (``common.transport``: a group of its own, flat byte buckets, versioned,
every wait bounded), timed against raw ``torch.distributed`` broadcasts of the same bytes in the
same run (target: push <= 2x raw).

Rank 0 (GPU 0) holds the weights as plain tensors of the model's names and shapes (the learner
side's gather from ZeRO-3 shards is timed by bench_learner's ``zero3_gather``); rank 1 (GPU 1) is
a receiver holding a real LLaDA-8B policy that the push loads by name.

raw_per_tensor   one broadcast per tensor straight into the receiver's parameters (the ideal:
                 no staging, no copies)
raw_buckets      the same bytes as broadcasts of one bucket-sized buffer (pure link bandwidth)
push             ``BroadcastPush.send`` -> ``receive(handle, policy)``: pack into the bucket,
                 store metadata, broadcast, unpack and copy into the parameters, check all arrived
Each: one warm-up, then the median of ``--reps``; a time is the slower rank's, both ranks started
together after a barrier. A checksum of every tensor checks the pushed weights bit for bit.

    python tests/benchmarks/bench_push.py --out push.json          # needs 2 GPUs
    python tests/benchmarks/bench_push.py --tiny --out push.json   # CPU, gloo
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import timedelta
from pathlib import Path

import benchlib as bl
import torch
import torch.distributed as dist


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--bucket-mb", default="512", help="comma list of push bucket sizes (MiB)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--timeout-s", type=float, default=120.0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--ports", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.shape = "tiny-llada" if a.tiny else "llada-8b"
    return a


def launch(a: argparse.Namespace) -> int:
    from learner.group import free_port

    ports = ",".join(str(free_port()) for _ in range(1 + len(a.bucket_mb.split(","))))  # group, one per push
    codes = bl.launch_ranks(__file__, lambda r: [*sys.argv[1:], "--rank", str(r), "--ports", ports]
                            + ([] if r == 0 else ["--out", ""]), 2)
    if any(codes) and a.out and Path(a.out).exists():
        data = json.loads(Path(a.out).read_text())
        data.setdefault("errors", {})["ranks"] = f"exit codes {codes}"
        Path(a.out).write_text(json.dumps(data, indent=1))
    return max(codes)


def slowest(seconds: float, dev: torch.device) -> float:
    t = torch.tensor([seconds], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def time_both(fn, dev: torch.device, reps: int) -> list[float]:
    """[reps] seconds of ``fn`` run by both ranks at once (after a warm-up), the slower rank's."""
    out = []
    for i in range(reps + 1):
        bl.sync(dev)
        dist.barrier()
        t0 = time.perf_counter()
        fn(i)
        bl.sync(dev)
        secs = slowest(time.perf_counter() - t0, dev)
        if i:
            out.append(secs)
    return out


def checksums(named: list[tuple[str, torch.Tensor]]) -> torch.Tensor:
    return torch.stack([t.detach().double().sum() + t.detach().double().square().sum() for _, t in named])


def rank_main(a: argparse.Namespace) -> None:
    from common.transport import ParameterLoader, WeightHandle, WeightPushConfig, setup_weight_push

    rank = a.rank
    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    port_group, *push_ports = (int(p) for p in a.ports.split(","))
    if cuda:
        torch.cuda.set_device(0)
    dev = bl.device()
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port_group}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=a.timeout_s))
    res = bl.Result("push", a.out if rank == 0 else None, vars(a), echo=rank == 0)
    dtype = bl.compute_dtype(dev)
    shapes = [(n, tuple(p.shape)) for n, p in bl.build_policy(a.shape, torch.device("meta"), dtype).named_parameters()]
    if rank == 0:
        g = torch.Generator(dev).manual_seed(0)
        named = [(n, torch.empty(s, dtype=dtype, device=dev).normal_(generator=g)) for n, s in shapes]
    else:
        policy = bl.build_policy(a.shape, dev, dtype, seed=1)
        named = list(policy.named_parameters())
        assert [(n, tuple(p.shape)) for n, p in named] == shapes
    total = sum(t.numel() * t.element_size() for _, t in named)
    res.put("weights", {"shape": a.shape, "tensors": len(named), "gib": total / 2**30, "dtype": str(dtype),
                        "backend": backend})

    with res.part("raw_per_tensor", dev), torch.no_grad():
        def per_tensor(_):
            for _, t in named:
                dist.broadcast(t.data, src=0)
        secs = time_both(per_tensor, dev, a.reps)
        res.put(
            "raw_per_tensor", {"seconds": secs, "median_s": bl.median(secs), "gb_per_s": total / bl.median(secs) / 1e9}
        )
    raw_best = bl.median(secs) if "raw_per_tensor" in res.data["parts"] else None

    for bucket_mb, port_push in zip([float(b) for b in a.bucket_mb.split(",")], push_ports):
        bucket = int(bucket_mb * 2**20)
        raw_bucket_s = None
        with res.part(f"raw_buckets_{bucket_mb:g}mb", dev):
            buffer = torch.empty(bucket, dtype=torch.uint8, device=dev)
            n_full, tail = divmod(total, bucket)

            def buckets(_):
                for _ in range(n_full):
                    dist.broadcast(buffer, src=0)
                if tail:
                    dist.broadcast(buffer[:tail], src=0)
            secs = time_both(buckets, dev, a.reps)
            raw_bucket_s = bl.median(secs)
            res.put(f"raw_buckets_{bucket_mb:g}mb", {"seconds": secs, "median_s": raw_bucket_s,
                                                     "gb_per_s": total / raw_bucket_s / 1e9})
        with res.part(f"push_{bucket_mb:g}mb", dev):
            cfg = WeightPushConfig(backend=backend, timeout_s=a.timeout_s, bucket_mb=bucket_mb)
            if rank == 1:  # the raw broadcasts already delivered these bytes: the push must do it again
                with torch.no_grad():
                    for _, t in named:
                        t.zero_()
            push = setup_weight_push(cfg, rank=rank, world_size=2, master_addr="127.0.0.1", master_port=port_push,
                                     peer_names=["receiver on GPU 1"] if rank == 0 else None)
            version = {"v": 0}

            def one_push(i):
                version["v"] += 1
                if rank == 0:
                    push.send(iter(named), version["v"])
                else:
                    loader = ParameterLoader(policy)
                    assert push.receive(WeightHandle(version["v"], backend), loader) == version["v"]
                    loader.finish()
            secs = time_both(one_push, dev, a.reps)
            sums = checksums(named)
            expected = sums.clone()
            dist.broadcast(expected, src=0)
            push.close()  # a new group (its own port) for the next bucket size
            med = bl.median(secs)
            res.put(f"push_{bucket_mb:g}mb", {
                "seconds": secs, "median_s": med, "gb_per_s": total / med / 1e9,
                "ratio_to_raw_per_tensor": med / raw_best if raw_best else None,
                "ratio_to_raw_buckets": med / raw_bucket_s if raw_bucket_s else None,
                "weights_bit_identical": bool(torch.equal(sums, expected)),
            })
    res.put("memory", {"peak_gib": bl.peak_memory_gib(dev)})


def main() -> None:
    a = parse()
    if a.rank is None:
        sys.exit(launch(a))
    rank_main(a)


if __name__ == "__main__":
    main()
