"""Benchmark 6: weight push of LLaDA-8B bf16 weights (16 GB, 291 tensors) from GPU 0 to GPU 1 over
the project's NCCL push (``stabledrl.common.transport``: a group of its own, flat byte buckets, versioned,
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

``--engine`` measures the learner's own push: L learner ranks of a real DeepSpeed engine
(``LearnerEngine``, ZeRO ``--zero``, LLaDA-8B's width at ``--layers`` layers, one GPU each) and N
receivers (a policy each, loaded through ``ParameterLoader``), L + N GPUs, against the raw bucketed
broadcast of the same bytes from rank 0 to the receivers in the same run:

raw              the full parameters' bytes as broadcasts of one bucket (``--bucket-mb``) from
                 GPU 0 to the receivers (their own group)
push_gather      the gathered push (a merged LoRA push's path): every learner rank joins the ZeRO-3
                 gathers, rank 0 packs the gathered tensors into buckets and broadcasts them
push_shards      the sharded push (the job's): every learner rank holding partitions (ZeRO-3:
                 all L; ZeRO-1/2: rank 0) broadcasts them straight from the engine's memory to the
                 receivers (one group of the sources and the receivers), which put the parameters
                 together
staged           the sharded push as a rollout worker takes it (``weights.staging``): into its
                 engine's staging copy (``TorchRolloutEngine.stage_weights``), the receiver idle
busy             the same while another thread of the receiver generates, as a worker does
                 between its requests: the job's sampler (gen 256, block 32, 128 steps, dual cache,
                 threshold 0.9; ``--busy-rows`` rows of ``--busy-prompt-tokens``) on the receiver's
                 own random weights with the LM head scaled by ``--busy-head-scale`` (the system
                 benchmark's checkpoints: 13.5 at LLaDA-8B), so that its requests commit several
                 tokens a forward and run the cache's refresh forwards as the job's worker does;
                 the in-job push's condition
raw_busy         the raw broadcast again while the receivers generate as in ``busy`` (each
                 receiver's host waits for its last broadcast, no device-wide drain): the busy
                 modes' fair denominator, recorded as their ``ratio_to_raw_busy`` when it runs
                 before them
peer_staged      ``weights.backend: peer`` into the staging copy, the receiver idle: each learner rank
                 copies its partitions into a buffer of its own and the receiver pulls every rank's
                 rows with its copy engines (CUDA IPC), putting each parameter together in place
peer_busy        the same beside the receiver's generation (as ``busy``)
peer_python      the same beside a receiver thread that runs Python alone (no GPU work: what a worker
                 does grading rewards, decoding, answering calls): each copy the pulling thread issues
                 gives up Python's GIL and has to take it back from that thread
peer_busy_rows,  ``peer_busy`` and ``peer_python`` as the pull was before: written row by row into the
peer_python_rows staging tensors (a copy per row on the pulling thread) at Python's own switch interval,
                 the collector free to start and the whole heap in it (``StagedWeights(defer=False,
                 prompt=False)``, ``gc.unfreeze``), instead of copied whole per rank span, put together
                 when applied, under a short switch interval with no collection starting and the
                 set-up's heap frozen (common/gil.py)
A mode may name its bucket size: ``busy@2048`` (MiB; default the first ``--bucket-mb``).
Each: one warm-up, then the median of ``--reps`` (the slowest rank's time, all ranks started after
a barrier; a staged push's time is its stage, not the later swap). Checked after, bit for bit,
against the learner's gathered weights: the receivers' weights, zeroed before (a staged mode: its
staging copy is zeroed before the last push, and the weights once the requests have stopped; the
last version is then swapped in). The busy modes report the
requests the receiver finished meanwhile, their median seconds and their tokens per forward.

    python tests/benchmarks/bench_push.py --engine --learners 1 --receivers 1 --layers 11 --out e.json  # 2 GPUs
    python tests/benchmarks/bench_push.py --engine --learners 3 --receivers 1 --out e.json  # 4 GPUs, 8B
    python tests/benchmarks/bench_push.py --engine --tiny --learners 2 --receivers 1 --out e.json  # CPU
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from datetime import timedelta
from pathlib import Path

import benchlib as bl
import torch
import torch.distributed as dist

from stabledrl.common.transport.store import open_store

# --engine's staged modes: whether the receiver generates meanwhile. Two weights options timed beside
# generation were not kept (neither shortened the push): weights.high_priority, weights.stage_pause
STAGED = {"staged": False, "busy": True, "peer_staged": False, "peer_busy": True, "peer_python": True,
          "peer_busy_rows": True, "peer_python_rows": True}
# the pull push (weights.backend: peer): the receiver reads each rank's buffer
PEER = ("peer_staged", "peer_busy", "peer_python", "peer_busy_rows", "peer_python_rows")
PYTHON = ("peer_python", "peer_python_rows")  # the receiver's other thread runs Python, not requests
ROWS = ("peer_busy_rows", "peer_python_rows")  # the pull row by row into the staging tensors


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--bucket-mb", default="512", help="comma list of push bucket sizes (MiB)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--timeout-s", type=float, default=120.0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--engine", action="store_true", help="the learner's own push (module docstring)")
    ap.add_argument("--learners", type=int, default=1, help="--engine: learner ranks (one GPU each)")
    ap.add_argument("--receivers", type=int, default=1, help="--engine: receivers (one GPU each)")
    ap.add_argument("--layers", type=int, default=None, help="--engine: layers (default: the model's 32)")
    ap.add_argument("--zero", type=int, default=3, choices=[1, 2, 3], help="--engine: ZeRO stage")
    ap.add_argument("--modes", default="gather,shards", help="--engine: comma list of pushes to time (gather, "
                    "shards, raw_busy, " + ", ".join(STAGED) + ")")
    ap.add_argument("--busy-rows", type=int, default=32, help="--engine busy modes: rows of the receiver's requests")
    ap.add_argument("--busy-prompt-tokens", type=int, default=100, help="--engine busy modes: prompt length")
    ap.add_argument("--busy-head-scale", type=float, default=13.5,
                    help="--engine busy modes: the receiver's LM head scaled by this (1: as initialised)")
    ap.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--ports", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.shape = "tiny-llada" if a.tiny else "llada-8b"
    return a


def launch(a: argparse.Namespace) -> int:
    # engine: learner, all, raw, then one per mode; rank 0 hosts every store
    n_ports = 3 + len(a.modes.split(",")) if a.engine else 1 + len(a.bucket_mb.split(","))
    listeners, ports = bl.rendezvous_ports(n_ports)
    world = a.learners + a.receivers if a.engine else 2
    codes = bl.launch_ranks(__file__, lambda r: [*sys.argv[1:], "--rank", str(r), "--ports", ",".join(map(str, ports))]
                            + ([] if r == 0 else ["--out", ""]), world, listeners)
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
    from stabledrl.common.transport import ParameterLoader, WeightHandle, WeightPushConfig, setup_weight_push

    rank = a.rank
    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    port_group, *push_ports = (int(p) for p in a.ports.split(","))
    if cuda:
        torch.cuda.set_device(0)
    dev = bl.device()
    bl.adopt_listeners()
    store = open_store("127.0.0.1", port_group, is_master=rank == 0, timeout=timedelta(seconds=a.timeout_s),
                       world_size=2)
    dist.init_process_group(backend, store=store, rank=rank, world_size=2, timeout=timedelta(seconds=a.timeout_s))
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


def group(backend: str, port: int, rank: int, world: int, timeout_s: float) -> dist.ProcessGroup:
    """A process group of its own over a TCPStore on ``port`` (rank 0 hosts it)."""
    store = open_store("127.0.0.1", port, is_master=rank == 0, timeout=timedelta(seconds=timeout_s), world_size=world)
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world, timedelta(seconds=timeout_s))
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timedelta(seconds=timeout_s)
    return dist.ProcessGroupNCCL(store, rank, world, options)


def engine_main(a: argparse.Namespace) -> None:
    """``--engine`` (the module docstring): this process is learner rank r < L or receiver r - L."""
    from stabledrl.common.config.learner import DeepSpeedConfig, LearnerConfig, OptimizerConfig
    from stabledrl.common.transport import ParameterLoader, WeightHandle, WeightPushConfig, setup_weight_push
    from stabledrl.common.transport.plan import PushInputs, plan_push
    from stabledrl.common.gil import settle_heap
    from stabledrl.common.transport.staging import StagedWeights
    from stabledrl.rollout.engine import TorchRolloutEngine

    rank, learners, receivers = a.rank, a.learners, a.receivers
    world, learner = learners + receivers, a.rank < a.learners
    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    port_learn, port_all, port_raw, *mode_ports = (int(p) for p in a.ports.split(","))
    bl.adopt_listeners()
    modes = a.modes.split(",")
    unknown = [m for m in modes if m.split("@")[0] not in ("gather", "shards", "raw_busy", *STAGED)]
    if unknown:
        raise SystemExit(f"--modes: unknown {unknown}; choose from gather, shards, raw_busy, {', '.join(STAGED)}")
    if cuda:
        torch.cuda.set_device(0)
    dev = bl.device()
    dtype = bl.compute_dtype(dev)
    every = group(backend, port_all, rank, world, a.timeout_s)  # barriers, times, checksums
    res = bl.Result("push_engine", a.out if rank == 0 else None, vars(a), echo=rank == 0)
    shape, layers = ("tiny-llada" if a.tiny else "llada-8b"), ({} if a.layers is None else
                                                                {"num_hidden_layers": a.layers})
    bucket_mb = float(a.bucket_mb.split(",")[0])
    lcfg = LearnerConfig(num_ranks=learners, optimizer=OptimizerConfig(lr=1e-6),
                         deepspeed=DeepSpeedConfig(zero_stage=a.zero, dtype="bf16" if cuda else "fp32",
                                                   param_persistence_threshold=0 if a.tiny else 100_000))
    sources = plan_push(PushInputs(WeightPushConfig(backend=backend), lcfg)).sources

    def barrier() -> None:
        bl.sync(dev)
        every.allreduce([torch.zeros(1, device=dev)]).wait()
        bl.sync(dev)

    def slowest(seconds: float) -> float:
        t = torch.tensor([seconds], dtype=torch.float64, device=dev)
        every.allreduce([t], dist.ReduceOp.MAX).wait()
        return float(t)

    def receiver_requests(requests) -> dict:
        """Receiver 0's requests during a busy mode, into every rank's record (rank 0 writes it)."""
        counts = torch.tensor([0.0] * 3 if requests is None else requests, dtype=torch.float64, device=dev)
        every.allreduce([counts], dist.ReduceOp.MAX).wait()
        return {"done": int(counts[0]), "median_s": float(counts[1]), "tokens_per_forward": float(counts[2])}

    def times(fn, drain: bool = True, before=None) -> list[float]:
        """``drain``: this rank's clock stops once its whole device is idle (False: ``fn`` waits for
        what it timed itself; a staged push beside a generating thread). ``before(i)``: untimed,
        before repetition i's barrier."""
        out = []
        for i in range(a.reps + 1):
            if before is not None:
                before(i)
            barrier()
            t0 = time.perf_counter()
            fn(i)
            if drain:
                bl.sync(dev)
            secs = slowest(time.perf_counter() - t0)
            if i:
                out.append(secs)
        return out

    engine = policy = None
    t0 = time.perf_counter()
    if learner:
        from stabledrl.learner.engine import LearnerEngine
        from stabledrl.learner.group import init_learner_group

        init_learner_group("127.0.0.1", port_learn, rank, learners, backend=backend, timeout_s=a.timeout_s)
        engine = LearnerEngine(bl.build_policy(shape, dev, dtype, **layers), lcfg)
        named = list(engine.module.named_parameters())
        total = sum(int(getattr(p, "ds_numel", p.numel())) * p.element_size() for _, p in named)
    else:
        policy = bl.build_policy(shape, dev, dtype, seed=1, **layers)
        named = list(policy.named_parameters())
        total = sum(p.numel() * p.element_size() for _, p in named)
    res.put("setup", {"shape": shape, **layers, "learners": learners, "receivers": receivers, "zero": a.zero,
                      "sources": sources, "tensors": len(named), "gib": total / 2**30, "dtype": str(dtype),
                      "backend": backend, "bucket_mb": bucket_mb, "build_s": time.perf_counter() - t0})

    def checksums() -> torch.Tensor:
        """Rank 0's gathered weights' checksums (every learner rank takes part), a receiver's own."""
        if learner:
            sums = [t.double().sum() + t.double().square().sum()
                    for _, t in engine.named_parameters_for_push()] if rank == 0 else []
            if rank != 0:
                for _ in engine.named_parameters_for_push():
                    pass
                return torch.zeros(len(named), dtype=torch.float64, device=dev)
            return torch.stack(sums)
        return torch.stack([p.detach().double().sum() + p.detach().double().square().sum() for _, p in named])

    # raw: rank 0 -> receivers, bucketed, in a group of their own
    raw_s = None
    with res.part("raw", dev):
        members = rank == 0 or not learner
        raw = group(backend, port_raw, 0 if rank == 0 else rank - learners + 1, 1 + receivers, a.timeout_s) \
            if members else None
        bucket = int(bucket_mb * 2**20)
        buffer = torch.empty(bucket, dtype=torch.uint8, device=dev)
        n_full, tail = divmod(total, bucket)

        def raw_fn(_, host_wait: bool = False):
            """``host_wait``: the host waits for the last broadcast itself (beside generation: no
            device-wide drain, which would wait for the requests' kernels too)."""
            if raw is None:
                return
            opts = dist.BroadcastOptions()
            opts.rootRank = 0
            works = [raw.broadcast([buffer if i < n_full else buffer[:tail]], opts)
                     for i in range(n_full + (1 if tail else 0))]
            for work in works if backend == "gloo" else works[-1:]:
                work.wait(timedelta(seconds=a.timeout_s)) if host_wait else work.wait()
        secs = times(raw_fn)
        raw_s = bl.median(secs)
        res.put("raw", {"seconds": secs, "median_s": raw_s, "gb_per_s": total / raw_s / 1e9})

    generates = any(m == "raw_busy" or (STAGED.get(m.split("@")[0], False) and m.split("@")[0] not in PYTHON)
                    for m in modes)
    busy = Generating(policy, a, dev) if not learner and generates else None
    raw_busy_s = None
    for mode, port in zip(modes, mode_ports):
        if mode == "raw_busy":  # the raw broadcast again, the receivers generating: the push's fair denominator
            with res.part(mode, dev):
                if busy is not None:
                    busy.start(TorchRolloutEngine(policy))
                secs = times(lambda i: raw_fn(i, host_wait=busy is not None), drain=busy is None)
                requests = busy.stop() if busy is not None else None
                raw_busy_s = bl.median(secs)
                res.put(mode, {"seconds": secs, "median_s": raw_busy_s, "ratio_to_raw": raw_busy_s / raw_s if raw_s
                               else None, "receiver_requests": receiver_requests(requests)})
            continue
        with res.part(f"push_{mode}", dev):
            base, _, mode_mb = mode.partition("@")
            generating = STAGED.get(base, False)
            source = "gather" if base == "gather" else "shards"
            cfg = WeightPushConfig(backend="peer" if base in PEER else backend, timeout_s=a.timeout_s,
                                   bucket_mb=float(mode_mb or bucket_mb))
            s = sources if source == "shards" else 0
            first = max(s, 1)
            member = (rank < first) if learner else True
            end_rank = rank if learner else first + rank - learners
            push = setup_weight_push(cfg, rank=end_rank, world_size=first + receivers, master_addr="127.0.0.1",
                                     master_port=port, sources=s) if member else None
            staged = base in STAGED and not learner
            receiver = TorchRolloutEngine(policy) if staged else None  # the worker's engine: its staging copy
            if receiver is not None:
                receiver.staged = StagedWeights(policy, defer=base not in ROWS, prompt=base not in ROWS)
                if base in ROWS:  # as before: every object in the collections
                    gc.unfreeze()
                else:  # as a worker after its set-up (common/gil.py)
                    settle_heap(actors_only=False)
            other = (PythonBusy() if base in PYTHON else busy) if generating and not learner else None
            if not learner and not staged:
                with torch.no_grad():
                    for _, p in named:
                        p.zero_()

            def zero_staging_before_the_last(i):
                if receiver is not None and i == a.reps:  # what the last push must bring, wiped untimed
                    with torch.no_grad():
                        for t in [*receiver.staged.tensors.values(), *receiver.staged.mirrors.values()]:
                            t.zero_()
                    bl.sync(dev)
            version = {"v": 0}

            def one_push(_):
                version["v"] += 1
                v = version["v"]
                if receiver is not None:
                    receiver.stage_weights(push, WeightHandle(v, cfg.backend), keep_order=False,
                                           timeout_s=a.timeout_s)
                elif not learner:
                    loader = ParameterLoader(policy)
                    push.receive(WeightHandle(v, cfg.backend), loader)
                    loader.finish()
                elif s:
                    if push is not None:
                        push.send_shards(engine.partitions_for_push(s), v)
                elif push is not None:
                    push.send(engine.named_parameters_for_push(), v)
                else:
                    for _ in engine.named_parameters_for_push():
                        pass
            if other is not None:
                other.start(receiver)
            secs = times(one_push, drain=receiver is None, before=zero_staging_before_the_last)
            requests = other.stop() if other is not None else None
            if receiver is not None:  # the last staged version swapped in, as the worker's next request would
                with torch.no_grad():  # onto zeros: only the swap can make the check below pass
                    for _, p in named:
                        p.zero_()
                receiver.update_weights(push, WeightHandle(version["v"], cfg.backend))
            stats = dict(getattr(push, "stats", {}) or {}) if push is not None and rank == 0 else {}
            sums = checksums()
            expected = sums.clone()
            every.broadcast([expected], dist.BroadcastOptions()).wait()  # root 0
            same = torch.tensor([0.0 if learner or torch.equal(sums, expected) else 1.0], device=dev)
            every.allreduce([same], dist.ReduceOp.MAX).wait()
            if push is not None:
                push.close()
            med = bl.median(secs)
            out = {"seconds": secs, "median_s": med, "gb_per_s": total / med / 1e9,
                   "ratio_to_raw": med / raw_s if raw_s else None, "sources": s,
                   "ratio_to_raw_busy": med / raw_busy_s if raw_busy_s and generating else None,
                   "bucket_mb": cfg.bucket_mb,
                   "rank0_segments": stats, "weights_bit_identical": float(same) == 0.0}
            if generating:
                out["receiver_python_loops" if base in PYTHON else "receiver_requests"] = receiver_requests(requests)
            res.put(f"push_{mode}", out)
    res.put("memory", {"peak_gib": bl.peak_memory_gib(dev)})
    if res.data["errors"]:
        raise SystemExit(f"failed: {list(res.data['errors'])}")


class PythonBusy:
    """The receiver's other thread in the ``peer_python`` modes: Python alone (integer arithmetic,
    no GPU work, no call that gives the GIL up) that keeps the last 20,000 small containers it made
    alive, as a worker's requests leave results about (so the cyclic collector runs, now and then
    over the whole heap), until stopped; ``stop`` returns (loops done, 0, 0)."""

    def start(self, engine) -> None:
        import threading

        self.stopping, self.loops = threading.Event(), 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        time.sleep(0.1)

    def _run(self) -> None:
        import collections

        kept = collections.deque(maxlen=20_000)
        while not self.stopping.is_set():
            x = 0
            for i in range(1_000):
                x += i * i
                if i % 10 == 0:
                    kept.append([x, {"i": i}])
            self.loops += 1

    def stop(self) -> list[float]:
        self.stopping.set()
        self.thread.join()
        return [float(self.loops), 0.0, 0.0]


class Generating:
    """The receiver's other thread in the busy modes: requests of the job's sampler, one after
    another, on the receiver's policy (the default stream, as a worker's request thread), until
    stopped; ``stop`` returns (requests finished, their median seconds, tokens per forward). From
    ``start`` to ``stop`` the receiver's LM head is scaled by ``--busy-head-scale`` (``stop`` puts the
    head it found back, so a later mode starts from the same weights)."""

    def __init__(self, policy, a: argparse.Namespace, dev: torch.device) -> None:
        from stabledrl.common.config.sampler import SamplerConfig

        self.policy, self.dev, self.head_scale = policy, dev, a.busy_head_scale
        tiny = dev.type != "cuda"
        self.cfg = SamplerConfig(gen_length=32 if tiny else 256, block_length=8 if tiny else 32,
                                 steps=16 if tiny else 128, temperature=0.9, cache="dual", threshold=0.9,
                                 max_batch_size=64)
        self.prompts = bl.random_prompts(a.busy_rows, a.busy_prompt_tokens, policy.vocab_size, seed=0)
        self.seeds = torch.arange(a.busy_rows)
        self.thread, self.error = None, None

    def start(self, engine) -> None:
        import threading

        head = self.policy.model.get_output_embeddings().weight
        self.head = head.detach().clone()
        with torch.no_grad():
            head.mul_(self.head_scale)
        self.stopping, self.seconds, self.tokens, self.forwards = threading.Event(), [], 0, 0
        self.thread = threading.Thread(target=self._run, args=(engine,), daemon=True)
        self.thread.start()
        time.sleep(1.0)  # the first request is under way before the first push

    def _run(self, engine) -> None:
        try:
            while not self.stopping.is_set():
                t0 = time.perf_counter()
                out = engine.generate(self.prompts, self.seeds, self.cfg)
                self.tokens, self.forwards = self.tokens + out.tokens_generated, self.forwards + out.num_forwards
                if self.dev.type == "cuda":  # this thread's stream only, as a worker's request waits
                    torch.cuda.current_stream(self.dev).synchronize()
                self.seconds.append(time.perf_counter() - t0)
        except BaseException as e:  # noqa: BLE001  (re-raised by stop, on the timing thread)
            self.error = e

    def stop(self) -> list[float]:
        self.stopping.set()
        self.thread.join()
        with torch.no_grad():
            self.policy.model.get_output_embeddings().weight.copy_(self.head)
        self.head = None
        if self.error is not None:
            raise RuntimeError(f"the receiver's requests failed: {self.error!r}") from self.error
        return [float(len(self.seconds)), bl.median(self.seconds) if self.seconds else 0.0,
                self.tokens / self.forwards if self.forwards else 0.0]


def main() -> None:
    a = parse()
    if a.rank is None:
        sys.exit(launch(a))
    engine_main(a) if a.engine else rank_main(a)
    bl.finish_rank()


if __name__ == "__main__":
    main()
