"""Weight push end to end on real Ray actors: a 2-rank ZeRO-3 learner (DeepSpeed on CPU) streams
its gathered parameters from rank 0 to 2 receiver actors, through the Ray object store and through
the collective broadcast group (gloo: the code path NCCL takes on GPU). The calls are the driver's
own (stabledrl.coordinator.runtime.weight_sync.push_calls) and each receiver loads through its rollout engine
(TorchRolloutEngine.update_weights), as a rollout worker does."""
from __future__ import annotations

import functools
import time

import pytest
import torch

ray = pytest.importorskip("ray")

from stabledrl.common.config.learner import DeepSpeedConfig, LearnerConfig, OptimizerConfig  # noqa: E402
from stabledrl.common.models.presets import build_tiny_policy  # noqa: E402
from stabledrl.common.transport.base import WeightPushConfig  # noqa: E402
from stabledrl.coordinator.runtime.weight_sync import push_calls  # noqa: E402
import harness  # noqa: E402

pytestmark = pytest.mark.e2e

VOCAB = 97
TIMES: dict[str, float] = {}


def ce_loss(model, mb: dict):
    logits = model(mb["input_ids"]).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), mb["input_ids"].flatten(), reduction="sum")
    return loss / mb["denominator"], {}


@ray.remote(num_cpus=0.25)
class LearnerRank:
    def __init__(self, rank: int) -> None:
        torch.set_num_threads(1)
        self.rank = rank
        self.push_end = None

    def rendezvous_address(self):
        from stabledrl.learner.group import rendezvous_address

        return rendezvous_address()

    def start(self, addr: str, port: int, world: int) -> None:
        from stabledrl.learner.engine import LearnerEngine
        from stabledrl.learner.group import init_learner_group

        init_learner_group(addr, port, self.rank, world, backend="gloo", timeout_s=60)
        cfg = LearnerConfig(num_ranks=world, optimizer=OptimizerConfig(lr=1e-2, eps=1e-3),
                            deepspeed=DeepSpeedConfig(zero_stage=3, dtype="fp32", param_persistence_threshold=0))
        self.engine = LearnerEngine(build_tiny_policy("llada", vocab_size=VOCAB, seed=0), cfg)

    def train(self, seed: int) -> None:
        ids = torch.randint(3, VOCAB, (2, 8), generator=torch.Generator().manual_seed(seed * 10 + self.rank))
        self.engine.train_step([{"input_ids": ids, "denominator": 32.0}], ce_loss)

    def setup_push(self, cfg: WeightPushConfig, **kwargs) -> None:
        from stabledrl.common.transport import setup_weight_push

        if getattr(self, "push_end", None) is not None:
            self.push_end.close()
        self.push_end = setup_weight_push(cfg, **kwargs) if self.rank == 0 else None

    def push_weights(self, version: int):
        named = self.engine.named_parameters_for_push()
        if self.push_end is None:
            for _ in named:  # ZeRO-3 gathers are collective: take part, keep nothing
                pass
            return None
        return self.push_end.send(named, version)

    def weights(self) -> dict:
        return self.engine.state_dict_for_push(all_ranks=True)


# other weights than the learner's, behind the engine a rollout worker uses
Receiver = ray.remote(num_cpus=0.25)(harness.PushReceiver)
OTHER_WEIGHTS = functools.partial(build_tiny_policy, "llada", vocab_size=VOCAB, seed=1)


@pytest.fixture(scope="module")
def cluster():
    t0 = time.perf_counter()
    with harness.local_ray(__name__):  # this module and the harness (PushReceiver) pickled by value
        TIMES["ray_start"] = time.perf_counter() - t0
        learners = [LearnerRank.remote(r) for r in range(2)]
        receivers = [Receiver.remote(OTHER_WEIGHTS) for _ in range(2)]
        t0 = time.perf_counter()
        addr, port = ray.get(learners[0].rendezvous_address.remote())
        TIMES["first_actor_call"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        ray.get([a.start.remote(addr, port, 2) for a in learners])
        TIMES["learner_start"] = time.perf_counter() - t0
        yield learners, receivers
    print("\ntimes (s):", {k: round(v, 2) for k, v in TIMES.items()})


def push(cluster, cfg: WeightPushConfig, version: int) -> None:
    learners, receivers = cluster
    t0 = time.perf_counter()
    sends, receives = push_calls(cfg.backend, learners, receivers, version)
    assert ray.get(receives, timeout=120) == [version] * len(receivers)
    ray.get(sends, timeout=120)
    TIMES[f"push_{cfg.backend}"] = time.perf_counter() - t0


def weights_of(learners) -> dict:
    """Rank 0's gathered parameters (both ranks are called: the ZeRO-3 gather is collective)."""
    return ray.get([a.weights.remote() for a in learners], timeout=60)[0]


def assert_delivered(cluster, version: int) -> None:
    learners, receivers = cluster
    expected = weights_of(learners)
    for received in ray.get([r.weights.remote() for r in receivers]):
        harness.assert_received(received, expected, version)




def test_object_store_push_delivers_identical_weights(cluster):
    learners, receivers = cluster
    cfg = WeightPushConfig(backend="object_store", timeout_s=30)
    ray.get([a.setup_push.remote(cfg) for a in learners] + [r.setup_push.remote(cfg) for r in receivers])
    before = ray.get(receivers[0].weights.remote())[1]
    ray.get([a.train.remote(1) for a in learners])
    push(cluster, cfg, version=1)
    assert_delivered(cluster, version=1)
    after = ray.get(receivers[0].weights.remote())[1]
    assert not all(torch.equal(before[n], after[n]) for n in before)


def setup_broadcast(cluster, cfg: WeightPushConfig, names: list[str]) -> None:
    learners, receivers = cluster
    addr, port = ray.get(learners[0].rendezvous_address.remote())
    world = 1 + len(names)
    ray.get([a.setup_push.remote(cfg, rank=0, world_size=world, master_addr=addr, master_port=port,
                                 peer_names=names) for a in learners]
            + [r.setup_push.remote(cfg, rank=i + 1, world_size=world, master_addr=addr, master_port=port)
               for i, r in enumerate(receivers)])


def test_gloo_broadcast_push_delivers_identical_weights(cluster):
    learners, _ = cluster
    # 0.05 MiB buckets: the tiny policy (~0.4 MiB) travels in several buckets
    cfg = WeightPushConfig(backend="gloo", timeout_s=30, bucket_mb=0.05)
    setup_broadcast(cluster, cfg, ["rollout-0", "rollout-1"])
    for version in (2, 3):  # the group is built once and reused
        ray.get([a.train.remote(version) for a in learners])
        push(cluster, cfg, version)
        assert_delivered(cluster, version)


def test_missing_receiver_fails_the_sender_in_time_and_names_it(cluster):
    learners, receivers = cluster
    cfg = WeightPushConfig(backend="gloo", timeout_s=4)
    setup_broadcast(cluster, cfg, ["rollout-0", "rollout-1", "rollout-ghost"])  # the ghost never joins
    from stabledrl.common.transport.base import WeightHandle

    t0 = time.perf_counter()
    sends = [a.push_weights.remote(4) for a in learners]
    receives = [r.receive_weights.remote(WeightHandle(4, "gloo")) for r in receivers]
    with pytest.raises(ray.exceptions.RayTaskError, match="never joined: rollout-ghost"):
        ray.get(sends[0], timeout=60)
    TIMES["sender_timeout"] = elapsed = time.perf_counter() - t0
    assert cfg.timeout_s <= elapsed < cfg.timeout_s + 15
    assert ray.get(sends[1], timeout=60) is None  # learner rank 1 finished its gathers with rank 0
    for ref in receives:  # the receivers that came fail too, naming whom they waited for
        with pytest.raises(ray.exceptions.RayTaskError, match="learner rank 0"):
            ray.get(ref, timeout=60)
