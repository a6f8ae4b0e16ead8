"""The sharded push of a LoRA job's adapters (``learner.lora.push: adapters``, sharded as
the plan decides): 2 learner ranks of a real DeepSpeed ZeRO-3 engine with LoRA (CPU, gloo) each broadcast
their own partitions of every adapted module's A and B, nothing gathered, to a receiver that puts
them together into the adapters its rollout engine holds unmerged (common/models/lora.py). What it
holds equals the learner's adapters, bit for bit, and its base weights stay as loaded, after two
trained pushes and one staged beside a running request, over the broadcast (gloo) and then over the
pull (peer): the two transports take turns on one set of actors, the push set up again for each."""
from __future__ import annotations

import time

import pytest
import torch

ray = pytest.importorskip("ray")

from stabledrl.common.config.learner import DeepSpeedConfig, LearnerConfig, LoraConfig, OptimizerConfig  # noqa: E402
from stabledrl.common.models.presets import build_tiny_policy  # noqa: E402
from stabledrl.common.transport.base import WeightHandle, WeightPushConfig  # noqa: E402
from stabledrl.common.transport.plan import PushInputs, plan_push  # noqa: E402
from stabledrl.coordinator.runtime.weight_sync import push_calls  # noqa: E402
import harness  # noqa: E402

pytestmark = pytest.mark.e2e

VOCAB, RANKS = 97, 2
LORA = LoraConfig(rank=4, alpha=8.0, target_modules=["q_proj", "up_proj"], push="adapters")


def ce_loss(model, mb: dict):
    logits = model(mb["input_ids"]).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), mb["input_ids"].flatten(), reduction="sum")
    return loss / mb["denominator"], {}


def base_policy():
    return build_tiny_policy("llada", vocab_size=VOCAB, seed=0)


@ray.remote(num_cpus=0.25)
class LoraLearnerRank(harness.PushLearner):
    """``LearnerWorker``'s weight-push methods over a LoRA engine of the tiny policy."""

    def start(self, addr: str, port: int) -> None:
        ds = DeepSpeedConfig(zero_stage=3, dtype="fp32", param_persistence_threshold=0)
        cfg = LearnerConfig(num_ranks=self.world_size, optimizer=OptimizerConfig(lr=5e-2, eps=1e-3), deepspeed=ds,
                            lora=LORA)
        self.start_engine(addr, port, base_policy(), cfg)

    def train_once(self, seed: int) -> None:
        ids = torch.randint(3, VOCAB, (2, 8), generator=torch.Generator().manual_seed(seed * 10 + self.rank))
        self.engine.train_step([{"input_ids": ids, "denominator": 48.0}], ce_loss)

    def pushed(self) -> dict:
        return self.engine.state_dict_for_push(all_ranks=True)

    def partitioned(self) -> list[bool]:
        """Whether each adapter partition this rank would send is a part, not the whole matrix."""
        return [part.numel() < torch.Size(shape).numel() for _, shape, part in self.engine.partitions_for_push(RANKS)]


def expected(learners, loaded: dict) -> dict:
    """What the receiver must hold: the learner's adapters A and B (gathered: collective, every
    rank takes part) and every other weight as it loaded them (``loaded``: before it held adapters)."""
    pushed = ray.get([a.pushed.remote() for a in learners], timeout=60)[0]
    return {**loaded, **pushed}


class AdapterReceiver(harness.PushReceiver):
    """A worker's end of an adapter push: the adapters held unmerged, partial pushes."""

    def setup_push(self, cfg, lora: LoraConfig, **kwargs) -> None:
        super().setup_push(cfg, **kwargs)
        self.engine.hold_adapters(lora)

    def receive_weights(self, handle) -> int:
        return self.engine.update_weights(self.push_end, handle, partial=True)

    def stage_and_apply(self, handle) -> int:
        self.engine.stage_weights(self.push_end, handle, partial=True, keep_order=False, timeout_s=60)
        return self.engine.update_weights(self.push_end, handle, partial=True)


@pytest.fixture(scope="module")
def cluster():
    """The learner ranks (started, their gloo group joined), the receiver, and the weights it loaded."""
    with harness.local_ray(__name__):  # this module and the harness (PushReceiver) pickled by value
        learners = [LoraLearnerRank.remote(r, RANKS) for r in range(RANKS)]
        receiver = ray.remote(num_cpus=0.25)(AdapterReceiver).remote(base_policy)
        addr, port = ray.get(learners[0].rendezvous_address.remote())
        ray.get([a.start.remote(addr, port) for a in learners])
        yield learners, receiver, ray.get(receiver.weights.remote())[1]


@pytest.mark.parametrize("backend", ["gloo", "peer"])
def test_lora_ranks_push_their_adapter_partitions_and_the_worker_holds_the_adapters(cluster, backend):
    """The receiver holds the learner's adapters, and every other weight as it loaded them before it
    held adapters (the module's tests share it: its versions only grow)."""
    learners, receiver, loaded = cluster
    cfg = WeightPushConfig(backend=backend, timeout_s=60, bucket_mb=0.01)  # several rounds
    learner_cfg = LearnerConfig(num_ranks=RANKS, deepspeed=DeepSpeedConfig(zero_stage=3), lora=LORA)
    sources = plan_push(PushInputs(cfg, learner_cfg)).sources
    assert sources == RANKS
    assert all(all(ray.get(a.partitioned.remote())) for a in learners)  # nothing is sent whole
    world = RANKS + 1
    addr, port = ray.get(learners[0].rendezvous_address.remote())  # the push's own store, not the learner's
    ray.get([a.setup_weight_push.remote(cfg, rank=0, world_size=world, master_addr=addr, master_port=port,
                                        peer_names=["rollout-0"], sources=sources) for a in learners]
            + [receiver.setup_push.remote(cfg, LORA, rank=RANKS, world_size=world,
                                          master_addr=addr, master_port=port, sources=sources)])
    before = ray.get(receiver.weights.remote())[1]
    base = 0 if backend == "gloo" else 10
    for version in (base + 1, base + 2):
        ray.get([a.train_once.remote(version) for a in learners])
        t0 = time.perf_counter()
        sends, receives = push_calls(backend, learners, [receiver], version)
        assert ray.get(receives, timeout=120) == [version]
        assert all(h.version == version for h in ray.get(sends, timeout=120))
        print(f"push {version}: {time.perf_counter() - t0:.2f} s")
        harness.assert_received(ray.get(receiver.weights.remote()), expected(learners, loaded), version)
    after = ray.get(receiver.weights.remote())[1]
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and all(n.endswith(("q_proj.lora_B", "up_proj.lora_B", ".lora_A")) for n in changed), \
        sorted(changed)
    ray.get([a.train_once.remote(base + 3) for a in learners])  # staged beside a running request, then swapped in
    sends = [a.push_weights.remote(base + 3) for a in learners]
    assert ray.get(receiver.stage_and_apply.remote(WeightHandle(base + 3, backend)), timeout=120) == base + 3
    ray.get(sends, timeout=120)
    harness.assert_received(ray.get(receiver.weights.remote()), expected(learners, loaded), base + 3)
