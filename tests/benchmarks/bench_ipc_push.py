"""Benchmark: the same-device weight push (``weights.backend: ipc``, common/transport/ipc.py) of
LLaDA-8B's bf16 weights (16 GB, 291 tensors) from a learner-side process to a rollout-side process
on one GPU, as ``cluster.colocate`` runs it: the sender copies every tensor into its buffer and
writes the version; the receiver (another process) maps the buffer through CUDA IPC and copies each
tensor into its own policy.

raw_copy     the same bytes copied device to device by the sender alone, tensor by tensor, into
             a buffer allocated beforehand: the floor of the sender's part
first_push   a new push end's first ``send`` (it lays its buffer out while the tensors arrive) and
             the receiver's first ``receive`` (it maps the buffer)
push         later pushes of the same tensors: the buffer and the mapping kept
Each push is timed on both sides (send, then receive: the two take turns), and the receiver's
policy is checked against the sent tensors, bit for bit, after the first and the last push.

    python tests/benchmarks/bench_ipc_push.py --out ipc.json            # 1 GPU, LLaDA-8B
    python tests/benchmarks/bench_ipc_push.py --tiny --out ipc.json     # CPU: shared-memory blocks
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import time

import benchlib as bl
import torch
from bench_push import checksums


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--layers", type=int, default=None, help="layers (default: the model's 32)")
    ap.add_argument("--reps", type=int, default=3, help="later pushes timed (their median is reported)")
    ap.add_argument("--timeout-s", type=float, default=600.0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    a.shape = "tiny-llada" if a.tiny else "llada-8b"
    return a


def layers(a: argparse.Namespace) -> dict:
    return {} if a.layers is None else {"num_hidden_layers": a.layers}


def receiver(a: argparse.Namespace, handles, results) -> None:
    """The rollout side: a policy of the shape, loaded from each handle; reports its seconds and,
    when asked, its weights' checksums."""
    from stabledrl.common.transport import ParameterLoader, WeightPushConfig
    from stabledrl.common.transport.ipc import IpcPush

    try:
        dev = bl.device()
        policy = bl.build_policy(a.shape, dev, bl.compute_dtype(dev), seed=1, **layers(a))
        end = IpcPush(WeightPushConfig(backend="ipc"))
        results.put(("ready", None))
        while (item := handles.get()) is not None:
            handle, check = item
            with torch.no_grad():
                if check:  # only this push can make the weights equal the sender's
                    for p in policy.parameters():
                        p.zero_()
                bl.sync(dev)
                t0 = time.perf_counter()
                loader = ParameterLoader(policy)
                end.receive(handle, loader)
                loader.finish()
                bl.sync(dev)
                seconds = time.perf_counter() - t0
            results.put(("received", (seconds, checksums(list(policy.named_parameters())).tolist() if check
                                         else None)))
        end.close()
    except BaseException as e:  # noqa: BLE001 - reported to the sender, which fails the part
        results.put(("error", repr(e)))


def main() -> None:
    from stabledrl.common.transport import WeightPushConfig
    from stabledrl.common.transport.ipc import IpcPush

    a = parse()
    dev = bl.device()
    dtype = bl.compute_dtype(dev)
    res = bl.Result("ipc_push", a.out, vars(a))
    shapes = [(n, tuple(p.shape)) for n, p in
              bl.build_policy(a.shape, torch.device("meta"), dtype, **layers(a)).named_parameters()]
    g = torch.Generator(dev).manual_seed(0)
    named = [(n, torch.empty(s, dtype=dtype, device=dev).normal_(generator=g)) for n, s in shapes]
    total = sum(t.numel() * t.element_size() for _, t in named)
    expected = checksums(named).tolist()
    res.put("weights", {"shape": a.shape, "tensors": len(named), "gib": total / 2**30, "dtype": str(dtype)})

    with res.part("raw_copy", dev), torch.no_grad():
        flat = torch.empty(total, dtype=torch.uint8, device=dev)
        views, offset = [], 0
        for _, t in named:
            n = t.numel() * t.element_size()
            views.append(flat[offset:offset + n].view(t.dtype).view(t.shape))
            offset += n
        secs = []
        for _ in range(a.reps + 1):
            _, s = bl.timed(lambda: [v.copy_(t) for v, (_, t) in zip(views, named)], dev)
            secs.append(s)
        secs = secs[1:]  # the first warms up
        res.put("raw_copy", {"seconds": secs, "median_s": bl.median(secs), "gb_per_s": total / bl.median(secs) / 1e9})
        raw = bl.median(secs)
        flat = views = None  # freed before the pushes

    ctx = mp.get_context("spawn")
    handles, results = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=receiver, args=(a, handles, results), daemon=True)
    proc.start()
    push = IpcPush(WeightPushConfig(backend="ipc"))

    def reply(kind: str):
        got, value = results.get(timeout=a.timeout_s)
        if got == "error":
            raise RuntimeError(f"receiver: {value}")
        assert got == kind, (got, kind)
        return value

    def one_push(version: int, check: bool) -> dict:
        bl.sync(dev)
        t0 = time.perf_counter()
        handle = push.send(iter(named), version)
        send_s = time.perf_counter() - t0  # send ends with its device synchronised
        handles.put((handle, check))
        receive_s, sums = reply("received")
        out = {"send_s": send_s, "receive_s": receive_s, "total_s": send_s + receive_s}
        if check:
            out["weights_bit_identical"] = sums == expected
        return out

    try:
        reply("ready")
        with res.part("first_push", dev):
            first = one_push(1, check=True)
            res.put("first_push", {**first, "ratio_send_to_raw_copy": first["send_s"] / raw,
                                   "blocks": len(push.blocks) if hasattr(push, "blocks") else None})
        with res.part("push", dev):
            runs = [one_push(2 + i, check=i == a.reps - 1) for i in range(a.reps)]
            med = {k: bl.median([r[k] for r in runs]) for k in ("send_s", "receive_s", "total_s")}
            res.put("push", {"runs": runs, **{f"median_{k}": v for k, v in med.items()},
                             "ratio_send_to_raw_copy": med["send_s"] / raw,
                             "first_over_later_total": first["total_s"] / med["total_s"],
                             "weights_bit_identical": runs[-1]["weights_bit_identical"]})
        res.put("memory", {"peak_gib": bl.peak_memory_gib(dev)})
    finally:
        handles.put(None)
        proc.join(timeout=60)
        push.close()
    failed = res.data["errors"] or any(not res.data["parts"].get(p, {}).get("weights_bit_identical", False)
                                       for p in ("first_push", "push"))
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
