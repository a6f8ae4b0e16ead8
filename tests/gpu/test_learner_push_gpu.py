"""The learner engine and the NCCL weight push on 2 GPUs (Ray actors, one GPU each).

1. ZeRO-2 and ZeRO-3 in bf16 over NCCL: both ranks agree, the grad norm matches an fp32 CPU
   reference on all the data, a NaN loss skips the step bit for bit.
2. NCCL push: a 1-rank ZeRO-3 learner on GPU 0 streams its gathered bf16 parameters to a receiver
   on GPU 1, bit-identical and versioned; a receiver that never joins fails the sender in time;
   the throughput of a 2 GiB synthetic push is printed.
"""
from __future__ import annotations

import sys
import time

import pytest
import torch

ray = pytest.importorskip("ray")

from stabledrl.common.config.learner import DeepSpeedConfig, LearnerConfig, OptimizerConfig  # noqa: E402
from stabledrl.common.models.presets import build_tiny_policy  # noqa: E402
from stabledrl.common.transport.base import WeightHandle, WeightPushConfig  # noqa: E402
from stabledrl.coordinator.runtime.weight_sync import push_calls  # noqa: E402
from gpu_ray import local_gpu_ray  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs"),
]
VOCAB = 97


def ce_loss(model, mb: dict):
    ids = mb["input_ids"].to(model.device)
    logits = model(ids).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), ids.flatten(), reduction="sum")
    loss = loss / mb["denominator"]
    if mb.get("poison"):
        loss = loss + torch.tensor(float("nan"), device=loss.device)
    return loss, {}


def micro_batches(rank: int, n: int) -> list[dict]:
    g = torch.Generator().manual_seed(100 + rank)
    return [{"input_ids": torch.randint(3, VOCAB, (2, 16), generator=g), "denominator": 2 * 16 * 5.0}
            for _ in range(n)]  # rank 0: 2 micro-batches, rank 1: 3 -> 5 · 32 tokens in all


@ray.remote(num_gpus=1, num_cpus=1)
class GpuRank:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.push_end = None

    def address(self):
        from stabledrl.learner.group import rendezvous_address

        return rendezvous_address()

    def start(self, addr: str, port: int, world: int) -> None:
        from stabledrl.learner.group import init_learner_group

        init_learner_group(addr, port, self.rank, world, timeout_s=120)  # auto: nccl

    def build(self, stage: int) -> str:
        from stabledrl.learner.engine import LearnerEngine

        cfg = LearnerConfig(optimizer=OptimizerConfig(lr=1e-3, grad_clip=1e9),
                            deepspeed=DeepSpeedConfig(zero_stage=stage, param_persistence_threshold=0,
                                                      gradient_checkpointing=True))
        self.engine = LearnerEngine(build_tiny_policy("llada", vocab_size=VOCAB, seed=0), cfg)
        return str(self.engine.dtype)

    def step(self, poison: bool = False) -> dict:
        mbs = micro_batches(self.rank, 2 + self.rank)
        for mb in mbs:
            mb["poison"] = poison and self.rank == 1
        return self.engine.train_step(mbs, ce_loss)

    def weights(self) -> dict:
        return self.engine.state_dict_for_push(all_ranks=True)

    def setup_push(self, cfg, **kwargs) -> None:
        from stabledrl.common.transport import setup_weight_push

        if getattr(self, "push_end", None) is not None:
            self.push_end.close()
        self.push_end = setup_weight_push(cfg, **kwargs)

    def push_weights(self, version: int):
        return self.push_end.send(self.engine.named_parameters_for_push(), version)

    def push_synthetic(self, version: int, count: int, numel: int) -> float:
        tensors = [(f"t{i}", torch.randn(numel, generator=torch.Generator("cuda").manual_seed(i), device="cuda",
                                         dtype=torch.float32).to(torch.bfloat16)) for i in range(count)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        self.push_end.send(tensors, version)
        torch.cuda.synchronize()
        return time.perf_counter() - t0


@ray.remote(num_gpus=1, num_cpus=1)
class GpuReceiver:
    def __init__(self) -> None:
        from stabledrl.rollout.engine import TorchRolloutEngine

        self.engine = TorchRolloutEngine(
            build_tiny_policy("llada", vocab_size=VOCAB, seed=1, dtype=torch.bfloat16).cuda()
        )

    def setup_push(self, cfg, **kwargs) -> None:
        from stabledrl.common.transport import setup_weight_push

        if getattr(self, "push_end", None) is not None:
            self.push_end.close()
        self.push_end = setup_weight_push(cfg, **kwargs)

    def receive_weights(self, handle) -> int:
        return self.engine.update_weights(self.push_end, handle)

    def weights(self) -> dict:
        return {n: p.detach().cpu() for n, p in self.engine.policy.named_parameters()}

    def receive_synthetic(self, handle, count: int, numel: int) -> tuple[bool, float]:
        ok = []

        def check(named):
            for name, t in named:
                i = int(name[1:])
                ref = torch.randn(numel, generator=torch.Generator("cuda").manual_seed(i), device="cuda",
                                  dtype=torch.float32).to(torch.bfloat16)
                ok.append(torch.equal(t, ref))

        t0 = time.perf_counter()
        self.push_end.receive(handle, check)
        torch.cuda.synchronize()
        return len(ok) == count and all(ok), time.perf_counter() - t0


@pytest.fixture(scope="module")
def gpu_ray():
    with local_gpu_ray(2, sys.modules[__name__]):
        yield


def fp32_reference_norm() -> float:
    model = build_tiny_policy("llada", vocab_size=VOCAB, seed=0).train()
    total = sum(ce_loss(model, mb)[0] for rank in (0, 1) for mb in micro_batches(rank, 2 + rank))
    total.backward()
    return float(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")))


def test_zero_engine_bf16_on_two_gpus(gpu_ray):
    ranks = [GpuRank.remote(r) for r in range(2)]
    addr, port = ray.get(ranks[0].address.remote())
    ray.get([r.start.remote(addr, port, 2) for r in ranks])
    ref_norm = fp32_reference_norm()
    for stage in (2, 3):
        t0 = time.perf_counter()
        assert ray.get([r.build.remote(stage) for r in ranks]) == ["torch.bfloat16"] * 2
        print(f"\nZeRO-{stage} bf16 init {time.perf_counter() - t0:.2f} s")
        before = ray.get([r.weights.remote() for r in ranks])[0]
        t0 = time.perf_counter()
        m0, m1 = ray.get([r.step.remote() for r in ranks])
        print(f"ZeRO-{stage} first step {time.perf_counter() - t0:.2f} s, metrics {m0}")
        assert m0 == m1 and m0["train/skipped"] == 0.0 and m0["train/micro_batches"] == 5.0
        assert m0["train/grad_norm"] == pytest.approx(ref_norm, rel=5e-2)  # bf16 vs the fp32 reference
        w0, w1 = ray.get([r.weights.remote() for r in ranks])
        assert all(torch.equal(w0[n], w1[n]) for n in w0)
        assert not all(torch.equal(before[n], w0[n]) for n in w0)
        m0, _ = ray.get([r.step.remote(poison=True) for r in ranks])  # NaN loss on rank 1 only
        assert m0["train/skipped"] == 1.0
        after = ray.get([r.weights.remote() for r in ranks])[0]
        assert all(torch.equal(w0[n], after[n]) for n in w0)
    for r in ranks:
        ray.kill(r)


def test_nccl_push_learner_to_receiver(gpu_ray):
    learner, receiver = GpuRank.remote(0), GpuReceiver.remote()
    addr, port = ray.get(learner.address.remote())
    ray.get(learner.start.remote(addr, port, 1))
    ray.get(learner.build.remote(3))
    ray.get(learner.step.remote())
    cfg = WeightPushConfig(backend="nccl", timeout_s=60, bucket_mb=0.1)
    addr, port = ray.get(learner.address.remote())
    ray.get([learner.setup_push.remote(cfg, rank=0, world_size=2, master_addr=addr, master_port=port,
                                       peer_names=["gpu-receiver"]),
             receiver.setup_push.remote(cfg, rank=1, world_size=2, master_addr=addr, master_port=port)])
    for version in (1, 2):
        t0 = time.perf_counter()
        sends, receives = push_calls(cfg.backend, [learner], [receiver], version)
        assert ray.get(receives + sends, timeout=300)[0] == version
        seconds = time.perf_counter() - t0
        print(f"\nNCCL push of the tiny policy (version {version}): {seconds * 1e3:.1f} ms")
        expected = ray.get(learner.weights.remote())
        got = ray.get(receiver.weights.remote())
        assert all(torch.equal(got[n], expected[n]) for n in expected)
        ray.get(learner.step.remote())

    count, numel = 16, 64 << 20  # 16 tensors × 64 Mi bf16 elements = 2 GiB, through a group of its own
    big = WeightPushConfig(backend="nccl", timeout_s=120, bucket_mb=512)
    addr, port = ray.get(learner.address.remote())
    ray.get([learner.setup_push.remote(big, rank=0, world_size=2, master_addr=addr, master_port=port),
             receiver.setup_push.remote(big, rank=1, world_size=2, master_addr=addr, master_port=port)])
    for version in (10, 11):
        send = learner.push_synthetic.remote(version, count, numel)
        ok, recv_s = ray.get(receiver.receive_synthetic.remote(WeightHandle(version, "nccl"), count, numel))
        send_s = ray.get(send)
        print(f"NCCL push of 2 GiB bf16 in 512 MiB buckets (version {version}): send {send_s:.3f} s "
              f"({2 / send_s:.1f} GiB/s), receive+check {recv_s:.3f} s")
        assert ok

    ghost = WeightPushConfig(backend="nccl", timeout_s=5)
    addr, port = ray.get(learner.address.remote())
    ray.get([learner.setup_push.remote(ghost, rank=0, world_size=3, master_addr=addr, master_port=port,
                                       peer_names=["gpu-receiver", "gpu-ghost"]),
             receiver.setup_push.remote(ghost, rank=1, world_size=3, master_addr=addr, master_port=port)])
    t0 = time.perf_counter()
    send, recv = learner.push_weights.remote(20), receiver.receive_weights.remote(WeightHandle(20, "nccl"))
    with pytest.raises(ray.exceptions.RayTaskError, match="never joined: gpu-ghost"):
        ray.get(send, timeout=60)
    assert time.perf_counter() - t0 < 5 + 15
    with pytest.raises(ray.exceptions.RayTaskError, match="learner rank 0"):
        ray.get(recv, timeout=60)
