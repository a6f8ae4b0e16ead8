"""What a LoRA learner should push: the merged adapted matrices, or the adapters themselves?

Both through the project's broadcast push (``stabledrl.common.transport``, gloo on CPU: sender and receiver
are two threads of this process), for a LLaDA-family policy with LoRA on the seven default
targets (learner/lora.py), timed per push (median of ``--reps`` after one warm-up):

full       every parameter (full fine-tuning's push), for reference
merged     the sender computes W + s·B·A of each adapted module and sends those matrices; the
           receiver copies them into its plain policy (what the learner does)
adapters   the sender sends A and B; the receiver holds them unmerged (common/models/lora.py:
           the "extra receiver bytes" are the adapters themselves)

Reported: bytes on the wire, the sender's preparation (merges), the whole push until the receiver
has its weights, and the receiver's extra memory; plus the same byte counts at LLaDA-8B's shape,
computed from the shape (bf16). Times on a shared CPU say little about a GPU; the bytes do.

    python tests/benchmarks/bench_lora_push.py --shape small --reps 3

``--engine`` measures the project's own push end to end in one process on one device (the GPU
measurement): a ``LearnerEngine`` (1 rank, ZeRO-3) with LoRA at LLaDA-8B's shape
(``--tiny``: the tiny LLaDA on the CPU) and a plain receiving policy beside it. For each
``learner.lora.push`` (merged, adapters) the learner's seconds per push (draining
``named_parameters_for_push``: the ZeRO-3 gathers, and for merged the merges), the bytes it
yields, and the receiver's seconds to load them (a ParameterLoader: for adapters into the
adapters a worker holds unmerged), median of ``--reps`` after a warm-up; the adapters' receiver
ends holding the learner's A and B bit for bit. Then ``adapters_shards``: the adapters through the
sharded push's learner end (every rank's partitions of A and B, no
gather, packed into the rounds' segments) and the worker's assembly. The wire time is not included
(the bytes set it: bench_push.py measures the broadcast).

    python tests/benchmarks/bench_lora_push.py --engine --out lora_push.json            # 1 GPU
    python tests/benchmarks/bench_lora_push.py --engine --tiny --reps 1 --out x.json    # CPU
"""
from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import benchlib as bl
import torch

from stabledrl.common.config.learner import LoraConfig
from stabledrl.common.models.lora import attach_adapters, target_paths
from stabledrl.common.transport import ParameterLoader, WeightHandle, WeightPushConfig, setup_weight_push
from stabledrl.learner.group import reserve_port
from stabledrl.common.transport.adapters import adapter_names
from stabledrl.learner.lora import add_adapters, merged_weight

SMALL = dict(num_hidden_layers=4, hidden_size=1024, intermediate_size=2816, num_attention_heads=16,
             num_key_value_heads=16, vocab_size=4096)


def holding_adapters(policy: torch.nn.Module, lora: LoraConfig) -> torch.nn.Module:
    """``policy`` as a worker holds it under ``learner.lora.push: adapters`` (rollout/engine.py)."""
    attach_adapters(policy.model, target_paths(policy.model, lora.resolved_targets()), lora.rank,
                    lora.alpha / lora.rank)
    return policy


def held_adapters(receiver: torch.nn.Module) -> dict[str, torch.Tensor]:
    """CPU copies of the adapters a receiver holds (what an adapter push changes)."""
    return {n: p.detach().clone().cpu() for n, p in receiver.named_parameters() if n.endswith((".lora_A", ".lora_B"))}


def same_adapters(held: dict | None, engine) -> bool | None:
    """Whether a receiver holds the learner's A and B bit for bit (None: not checked)."""
    if held is None:
        return None
    pushed = {n: t.cpu() for n, t in engine.named_parameters_for_push()}
    return held.keys() == pushed.keys() and all(torch.equal(held[n], pushed[n]) for n in held)


def adapters_sharded(engine, receiver, a: argparse.Namespace, dev: torch.device, res, held: dict) -> None:
    """``adapters_shards``: the learner's end of the sharded push of the
    adapters, without the wire: this rank's partitions of every A and B (no gather), the plan's
    rounds (512 MB), each round's segment as it lies or packed; the worker puts each round
    together into the adapters it holds (``shards.assemble``)."""
    from stabledrl.common.transport.broadcast import _ShardBuffers
    from stabledrl.common.transport.shards import assemble, iter_segments, plan_rounds

    bufs = _ShardBuffers()

    def segments():
        partitions = list(engine.partitions_for_push(1))
        rounds = plan_rounds([(n, tuple(shape), t.dtype) for n, shape, t in partitions], 1, 512 << 20)
        for rnd, parts in iter_segments(rounds, iter(partitions), 1):
            yield rnd, bufs.payload(parts, rnd, dev)
            bufs.sent(None)

    def learner_only() -> int:
        return sum(payload.numel() * payload.element_size() for _, payload in segments())

    def learner_and_worker() -> None:
        loader = ParameterLoader(receiver, partial=True)
        for rnd, payload in segments():
            assemble(payload.view(1, -1), rnd, 1, loader)
        loader.finish()

    with torch.no_grad():  # the adapters the earlier parts left are wiped: this push must bring them back
        for name, p in receiver.named_parameters():
            if name.endswith((".lora_A", ".lora_B")):
                p.zero_()
    wire = learner_only()  # warm-up
    learner_and_worker()
    learner_s = [bl.timed(learner_only, dev)[1] for _ in range(a.reps)]
    both_s = [bl.timed(learner_and_worker, dev)[1] for _ in range(a.reps)]
    held["adapters_shards"] = held_adapters(receiver) if a.tiny else None
    res.put("adapters_shards", {"wire_gb": wire / 1e9, "learner_s": statistics.median(learner_s),
                                "learner_s_all": learner_s, "learner_and_worker_s": statistics.median(both_s),
                                "worker_s": max(0.0, statistics.median(both_s) - statistics.median(learner_s)),
                                "peak_memory_gib": bl.peak_memory_gib(dev)})


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=["tiny", "small"], default="small")
    ap.add_argument("--rank", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--engine", action="store_true", help="the LearnerEngine's push and the worker's load (above)")
    ap.add_argument("--tiny", action="store_true", help="--engine: the tiny LLaDA on the CPU")
    ap.add_argument("--out", default=None)
    return ap.parse_args()


def engine_push(a: argparse.Namespace) -> None:
    """``--engine`` (the module docstring)."""
    from stabledrl.common.config.learner import DeepSpeedConfig, LearnerConfig, OptimizerConfig
    from stabledrl.learner.engine import LearnerEngine
    from stabledrl.learner.group import init_learner_group

    dev = bl.device()
    dtype = bl.compute_dtype(dev)
    shape = "tiny-llada" if a.tiny else "llada-8b"
    res = bl.Result("lora_push", a.out, vars(a))
    init_learner_group("127.0.0.1", reserve_port(), 0, 1, backend="nccl" if dev.type == "cuda" else "gloo",
                       timeout_s=300)
    lora = LoraConfig(rank=a.rank, alpha=a.rank / 2)
    cfg = LearnerConfig(num_ranks=1, optimizer=OptimizerConfig(lr=1e-6), lora=lora,
                        deepspeed=DeepSpeedConfig(zero_stage=3, param_persistence_threshold=0 if a.tiny else 100_000))
    engine, init_s = bl.timed(lambda: LearnerEngine(bl.build_policy(shape, dev, dtype), cfg), dev)
    receiver = bl.build_policy(shape, dev, dtype)  # the worker's plain policy: the same random weights (seed 0)
    holder = holding_adapters(bl.build_policy(shape, dev, dtype), lora)  # a worker of the adapters' push
    from deepspeed.runtime.zero import GatheredParameters

    torch.manual_seed(0)
    with GatheredParameters([m.lora_B for m in engine.adapted], modifier_rank=0), torch.no_grad():
        for m in engine.adapted:  # trained adapters (B starts at 0)
            m.lora_B.normal_(0.0, 1e-3)
    res.put("setup", {"shape": shape, "rank": a.rank, "deepspeed_init_s": init_s,
                      "targets": len(engine.adapted), "peak_memory_gib": bl.peak_memory_gib(dev)})
    held = {}
    for push in ("adapters", "merged"):
        with res.part(push, dev):
            engine.cfg = engine.cfg.model_copy(update={"lora": lora.model_copy(update={"push": push})})

            def learner_only() -> int:
                return sum(t.numel() * t.element_size() for _, t in engine.named_parameters_for_push())

            def learner_and_worker() -> None:
                loader = ParameterLoader(holder if push == "adapters" else receiver, partial=True)
                for name, t in engine.named_parameters_for_push():
                    loader([(name, t)])
                loader.finish()

            wire = learner_only()  # warm-up
            learner_and_worker()
            learner_s = [bl.timed(learner_only, dev)[1] for _ in range(a.reps)]
            both_s = [bl.timed(learner_and_worker, dev)[1] for _ in range(a.reps)]
            if push == "adapters":
                held[push] = same_adapters(held_adapters(holder), engine) if a.tiny else None
            extra = sum(t.numel() * t.element_size() for t in held_adapters(holder).values()) if push == "adapters" \
                else 0
            res.put(push, {"wire_gb": wire / 1e9, "learner_s": statistics.median(learner_s),
                           "learner_s_all": learner_s, "learner_and_worker_s": statistics.median(both_s),
                           "worker_s": max(0.0, statistics.median(both_s) - statistics.median(learner_s)),
                           "worker_extra_gb": extra / 1e9, "peak_memory_gib": bl.peak_memory_gib(dev)})
    with res.part("adapters_shards", dev):  # the adapters again, through the sharded push's learner end
        engine.cfg = engine.cfg.model_copy(update={"lora": lora.model_copy(update={"push": "adapters"})})
        adapters_sharded(engine, holder, a, dev, res, held)
        held["adapters_shards"] = same_adapters(held["adapters_shards"], engine)
    parts = res.data["parts"]
    if "merged" in parts and "adapters" in parts:
        m, d = parts["merged"], parts["adapters"]
        sh = parts.get("adapters_shards") or {}
        res.put("ratio", {"bytes_merged_over_adapters": m["wire_gb"] / d["wire_gb"],
                          "learner_s_merged_over_adapters": m["learner_s"] / d["learner_s"],
                          "learner_s_merged_over_adapters_shards": m["learner_s"] / sh["learner_s"] if sh else None,
                          "receiver_adapters_equal": held.get("adapters"),
                          "receiver_adapters_equal_shards": held.get("adapters_shards")})
    if res.data["errors"]:
        raise SystemExit(f"failed: {list(res.data['errors'])}")


def push_seconds(prepare, receive_load, reps: int) -> tuple[float, float]:
    """(median push seconds, median sender-preparation seconds) of ``reps`` pushes after a warm-up."""
    cfg = WeightPushConfig(backend="gloo", timeout_s=300, bucket_mb=64)
    port = reserve_port()
    sent_prep: list[float] = []
    received = threading.Event()  # the sender's store must outlive the receiver's last read

    def sender() -> None:
        push = setup_weight_push(cfg, rank=0, world_size=2, master_addr="127.0.0.1", master_port=port)
        for version in range(reps + 1):
            t0 = time.perf_counter()
            named = prepare()
            sent_prep.append(time.perf_counter() - t0)
            push.send(iter(named), version)
        received.wait(cfg.timeout_s)
        push.close()

    thread = threading.Thread(target=sender)
    thread.start()
    push = setup_weight_push(cfg, rank=1, world_size=2, master_addr="127.0.0.1", master_port=port)
    times = []
    for version in range(reps + 1):
        t0 = time.perf_counter()
        push.receive(WeightHandle(version, "gloo"), receive_load())
        times.append(time.perf_counter() - t0)
    received.set()
    push.close()
    thread.join()
    return statistics.median(times[1:]), statistics.median(sent_prep[1:])


def nbytes(named: list[tuple[str, torch.Tensor]]) -> int:
    return sum(t.numel() * t.element_size() for _, t in named)


def main() -> None:
    a = parse()
    if a.engine:
        return engine_push(a)
    shape = SMALL if a.shape == "small" else {k: v for k, v in bl.SHAPES["tiny-llada"].items() if k != "family"}
    learner = bl.build_policy("tiny-llada", torch.device("cpu"), torch.float32, **shape)
    receiver = bl.build_policy("tiny-llada", torch.device("cpu"), torch.float32, **shape)
    lora = LoraConfig(rank=a.rank, alpha=a.rank / 2)
    holder = holding_adapters(bl.build_policy("tiny-llada", torch.device("cpu"), torch.float32, **shape), lora)
    adapted = add_adapters(learner, lora)
    with torch.no_grad():
        for m in adapted:  # trained adapters: B != 0
            m.lora_B.normal_(0.0, 1e-3)
    plain = {n: p.detach() for n, p in receiver.named_parameters()}

    def merged():
        return [(m.weight_name, merged_weight(m.base, m.lora_A, m.lora_B, m.scale)) for m in adapted]

    def adapters():
        return [(n, t.detach()) for m in adapted for n, t in zip(adapter_names(m.path), (m.lora_A, m.lora_B))]

    results = {}
    for variant, prepare, load, extra in (
        ("full", lambda: list(plain.items()), lambda: ParameterLoader(receiver), 0),
        ("merged", merged, lambda: ParameterLoader(receiver, partial=True), 0),
        ("adapters", adapters, lambda: ParameterLoader(holder, partial=True), nbytes(adapters())),
    ):
        seconds, prep = push_seconds(prepare, load, a.reps)
        if variant == "merged":  # the receiver holds the merged matrices
            assert all(torch.equal(plain[n], t) for n, t in merged()), variant
        if variant == "adapters":  # the holder holds the learner's adapters
            assert all(torch.equal(dict(holder.named_parameters())[n], t) for n, t in adapters()), variant
        results[variant] = {"wire_mb": nbytes(prepare()) / 2**20, "push_s": seconds, "sender_prep_s": prep,
                            "extra_receiver_mb": extra / 2**20}
    results["llada_8b_bf16_gb"] = shape_bytes(bl.SHAPES["llada-8b"], a.rank)
    print(json.dumps({"shape": shape, "rank": a.rank, "threads": torch.get_num_threads(), **results}, indent=1))


def shape_bytes(s: dict, rank: int) -> dict[str, float]:
    """Wire bytes (bf16, GB) of each variant at a shape, with LoRA on all seven projections."""
    h, f = s["hidden_size"], s["intermediate_size"]
    kv = s["num_key_value_heads"] * h // s["num_attention_heads"]
    mats = [(h, h), (kv, h), (kv, h), (h, h), (f, h), (f, h), (h, f)]  # q k v o gate up down: (out, in)
    layers = s["num_hidden_layers"]
    target = layers * sum(o * i for o, i in mats)
    adapter = layers * sum(rank * (o + i) for o, i in mats)
    full = target + 2 * s["vocab_size"] * h + layers * 2 * h + h
    return {"full": 2 * full / 1e9, "merged": 2 * target / 1e9, "adapters": 2 * adapter / 1e9}


if __name__ == "__main__":
    main()
