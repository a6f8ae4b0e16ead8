"""The sharded weight push end to end: 3 learner ranks of a real
DeepSpeed ZeRO-3 engine (CPU, gloo) each broadcast their own partitions, straight from the
engine's memory, to a receiver that puts the full parameters together through its rollout engine;
what it holds equals the full weights gathered by DeepSpeed, bit for bit. With 3 ranks and the
tiny model's sizes (64, 97·64, 64·64, 32·64, ...) most element counts do not divide by 3, so the
last partitions carry padding; the input and output embeddings are tied (one parameter, one name);
parameters under 2,000 elements (the norms) stay gathered (ZeRO-3's persistent ones), the others not.
The learner end is ``LearnerWorker``'s own set-up and push; the same group also carries the
gathered path (rank 0 gathers, as a merged LoRA push does) for comparison. Both run again over the
pull push (``weights.backend: peer``): the receiver reads each rank's buffer instead."""
from __future__ import annotations

import functools
import time

import pytest
import torch

ray = pytest.importorskip("ray")

from stabledrl.common.config.learner import DeepSpeedConfig, LearnerConfig, OptimizerConfig  # noqa: E402
from stabledrl.common.models.presets import build_tiny_policy  # noqa: E402
from stabledrl.common.transport.base import WeightPushConfig  # noqa: E402
from stabledrl.common.transport.plan import PushInputs, plan_push  # noqa: E402
from stabledrl.coordinator.runtime.weight_sync import push_calls  # noqa: E402
import harness  # noqa: E402

pytestmark = pytest.mark.e2e

VOCAB, RANKS = 97, 3
TIMES: dict[str, float] = {}


def tied_policy(seed: int):
    policy = build_tiny_policy("llada", vocab_size=VOCAB, seed=seed)
    model = next(m for m in policy.modules() if hasattr(m, "get_output_embeddings") and m is not policy)
    model.get_output_embeddings().weight = model.get_input_embeddings().weight
    return policy


def ce_loss(model, mb: dict):
    logits = model(mb["input_ids"]).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), mb["input_ids"].flatten(), reduction="sum")
    return loss / mb["denominator"], {}


@ray.remote(num_cpus=0.25)
class LearnerRank(harness.PushLearner):
    """``LearnerWorker``'s weight-push methods over an engine of the tiny tied policy."""

    def start(self, addr: str, port: int) -> None:
        ds = DeepSpeedConfig(zero_stage=3, dtype="fp32", param_persistence_threshold=2000)
        cfg = LearnerConfig(num_ranks=self.world_size, optimizer=OptimizerConfig(lr=1e-2, eps=1e-3), deepspeed=ds)
        self.start_engine(addr, port, tied_policy(seed=0), cfg)

    def train_once(self, seed: int) -> None:
        ids = torch.randint(3, VOCAB, (2, 8), generator=torch.Generator().manual_seed(seed * 10 + self.rank))
        self.engine.train_step([{"input_ids": ids, "denominator": 48.0}], ce_loss)

    def gathered(self) -> dict:
        return self.engine.state_dict_for_push(all_ranks=True)

    def tied(self) -> bool:
        names = [n for n, _ in self.engine.module.named_parameters()]
        return not any("lm_head" in n for n in names)  # the output embedding is the input one


# other weights than the learner's, behind the engine a rollout worker uses
Receiver = ray.remote(num_cpus=0.25)(harness.PushReceiver)
OTHER_WEIGHTS = functools.partial(tied_policy, seed=1)


@pytest.fixture(scope="module")
def cluster():
    with harness.local_ray(__name__):  # this module and the harness (PushReceiver) pickled by value
        learners = [LearnerRank.remote(r, RANKS) for r in range(RANKS)]
        receiver = Receiver.remote(OTHER_WEIGHTS)
        addr, port = ray.get(learners[0].rendezvous_address.remote())
        t0 = time.perf_counter()
        ray.get([a.start.remote(addr, port) for a in learners])
        TIMES["learner_start"] = time.perf_counter() - t0
        yield learners, receiver
    print("\ntimes (s):", {k: round(v, 2) for k, v in TIMES.items()})


def setup(cluster, cfg: WeightPushConfig, sources: int) -> None:
    """The driver's set-up (coordinator/runtime/weight_sync.py): every learner rank gets the same call."""
    learners, receiver = cluster
    addr, port = ray.get(learners[0].rendezvous_address.remote())
    world = max(sources, 1) + 1
    ray.get([a.setup_weight_push.remote(cfg, rank=0, world_size=world, master_addr=addr, master_port=port,
                                        peer_names=["rollout-0"], sources=sources) for a in learners]
            + [receiver.setup_push.remote(cfg, rank=max(sources, 1), world_size=world, master_addr=addr,
                                          master_port=port, sources=sources)])


def assert_delivered(cluster, version: int) -> None:
    learners, receiver = cluster
    expected = ray.get([a.gathered.remote() for a in learners], timeout=60)[0]
    harness.assert_received(ray.get(receiver.weights.remote(), timeout=60), expected, version)


@pytest.mark.parametrize("backend", ["gloo", "peer"])
def test_three_zero3_ranks_push_their_partitions_and_the_receiver_holds_the_gathered_weights(cluster, backend):
    """gloo: each rank broadcasts its partitions; peer: the receiver pulls them from each rank's buffer."""
    learners, receiver = cluster
    assert all(ray.get([a.tied.remote() for a in learners]))
    learner_cfg = LearnerConfig(num_ranks=RANKS, deepspeed=DeepSpeedConfig(zero_stage=3))
    cfg = WeightPushConfig(backend=backend, timeout_s=60, bucket_mb=0.05)  # several rounds
    sources = plan_push(PushInputs(cfg, learner_cfg)).sources
    assert sources == RANKS
    setup(cluster, cfg, sources)
    before = ray.get(receiver.weights.remote())[1]
    base = 0 if backend == "gloo" else 10  # the receiver's versions only grow (the module's tests share it)
    for version in (base + 1, base + 2):  # the group and its buffers are reused
        ray.get([a.train_once.remote(version) for a in learners])
        t0 = time.perf_counter()
        sends, receives = push_calls(backend, learners, [receiver], version)
        assert ray.get(receives, timeout=120) == [version]
        assert all(h.version == version for h in ray.get(sends, timeout=120))
        TIMES[f"push_shards_{backend}_v{version}"] = time.perf_counter() - t0
        assert_delivered(cluster, version)
    after = ray.get(receiver.weights.remote())[1]
    assert not all(torch.equal(before[n], after[n]) for n in before)
    # staged beside a running request (weights.staging), then swapped in
    ray.get([a.train_once.remote(base + 3) for a in learners])
    sends = [a.push_weights.remote(base + 3) for a in learners]
    from stabledrl.common.transport.base import WeightHandle

    assert ray.get(receiver.stage_and_apply.remote(WeightHandle(base + 3, backend)), timeout=120) == base + 3
    ray.get(sends, timeout=120)
    assert_delivered(cluster, base + 3)


@pytest.mark.parametrize("backend", ["gloo", "peer"])
def test_the_gathered_path_of_a_zero3_learner_delivers_the_same_weights(cluster, backend):
    """Rank 0 gathers and sends (sources 0), the path of a merged LoRA push and of the object store."""
    learners, receiver = cluster
    cfg = WeightPushConfig(backend=backend, timeout_s=60, bucket_mb=0.05)
    setup(cluster, cfg, 0)
    version = 20 if backend == "gloo" else 30
    ray.get([a.train_once.remote(version) for a in learners])
    t0 = time.perf_counter()
    sends, receives = push_calls(backend, learners, [receiver], version)
    assert ray.get(receives, timeout=120) == [version]
    ray.get(sends, timeout=120)
    TIMES[f"push_gather_{backend}"] = time.perf_counter() - t0
    assert_delivered(cluster, version)
