"""The weight push end to end on real Ray actors: 3 learner ranks of a real DeepSpeed ZeRO-3 engine
(CPU, gloo) push to 2 receiver actors, each loading through the engine a rollout worker uses
(TorchRolloutEngine.update_weights), as a rollout worker does. The learner end is ``LearnerWorker``'s
own set-up and push, the calls the driver's own (coordinator/runtime/weight_sync.push_calls); what
a receiver holds after each push equals the full weights gathered by DeepSpeed, bit for bit.

- sharded: each rank broadcasts its own partitions, straight from the engine's memory, to a
  receiver that puts the full parameters together; with 3 ranks and the tiny model's sizes (64,
  97·64, 64·64, 32·64, ...) most element counts do not divide by 3, so the last partitions carry
  padding; the input and output embeddings are tied (one parameter, one name); parameters under
  2,000 elements (the norms) stay gathered (ZeRO-3's persistent ones), the others not. Again over
  the pull push (``weights.backend: peer``): the receiver reads each rank's buffer instead.
- gathered: rank 0 gathers and sends (the path of a merged LoRA push), the other ranks taking part
  in the gathers, to both receivers: through the collective broadcast group (gloo: the code path
  NCCL takes on GPU) and the pull, the group built once and reused, and through the Ray object store.
- a receiver that never joins the broadcast group fails the sender in time, naming it; the
  receivers that came fail too."""
from __future__ import annotations

import functools
import time

import pytest
import torch

ray = pytest.importorskip("ray")

from stabledrl.common.config.learner import DeepSpeedConfig, LearnerConfig, OptimizerConfig  # noqa: E402
from stabledrl.common.models.presets import build_tiny_policy  # noqa: E402
from stabledrl.common.transport.base import WeightHandle, WeightPushConfig  # noqa: E402
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
    """The learner ranks (started, their gloo group joined) and 2 receivers. A receiver's versions
    only grow: each test pushes versions above the ones before it."""
    t0 = time.perf_counter()
    with harness.local_ray(__name__):  # this module and the harness (PushReceiver) pickled by value
        TIMES["ray_start"] = time.perf_counter() - t0
        learners = [LearnerRank.remote(r, RANKS) for r in range(RANKS)]
        receivers = [Receiver.remote(OTHER_WEIGHTS) for _ in range(2)]
        addr, port = ray.get(learners[0].rendezvous_address.remote())
        t0 = time.perf_counter()
        ray.get([a.start.remote(addr, port) for a in learners])
        TIMES["learner_start"] = time.perf_counter() - t0
        yield learners, receivers
    print("\ntimes (s):", {k: round(v, 2) for k, v in TIMES.items()})


def setup(learners, receivers, cfg: WeightPushConfig, sources: int, names: list[str]) -> None:
    """The driver's set-up (coordinator/runtime/weight_sync.py): every learner rank gets the same
    call; ``names`` the receivers that should join (more than ``receivers``: some never do)."""
    addr, port = ray.get(learners[0].rendezvous_address.remote())  # the push's own store, not the learner's
    first = max(sources, 1)
    world = first + len(names)
    ray.get([a.setup_weight_push.remote(cfg, rank=0, world_size=world, master_addr=addr, master_port=port,
                                        peer_names=names, sources=sources) for a in learners]
            + [r.setup_push.remote(cfg, rank=first + i, world_size=world, master_addr=addr, master_port=port,
                                   sources=sources) for i, r in enumerate(receivers)])


def push(learners, receivers, backend: str, version: int, timing: str, every_rank_sends: bool = False) -> None:
    """The driver's calls of one push; rank 0 sends in every push, every rank where each sends its
    own partitions (``every_rank_sends``)."""
    t0 = time.perf_counter()
    sends, receives = push_calls(backend, learners, receivers, version)
    assert ray.get(receives, timeout=120) == [version] * len(receivers)
    handles = ray.get(sends, timeout=120)
    senders = handles if every_rank_sends else handles[:1]
    assert all(h.version == version for h in senders), handles
    TIMES[timing] = time.perf_counter() - t0


def assert_delivered(learners, receivers, version: int) -> None:
    """Every receiver holds rank 0's gathered parameters (every rank is called: the gather is collective)."""
    expected = ray.get([a.gathered.remote() for a in learners], timeout=60)[0]
    for received in ray.get([r.weights.remote() for r in receivers], timeout=60):
        harness.assert_received(received, expected, version)


@pytest.mark.parametrize("backend", ["gloo", "peer"])
def test_three_zero3_ranks_push_their_partitions_and_the_receiver_holds_the_gathered_weights(cluster, backend):
    """gloo: each rank broadcasts its partitions; peer: the receiver pulls them from each rank's buffer."""
    learners, (receiver, _) = cluster
    assert all(ray.get([a.tied.remote() for a in learners]))
    learner_cfg = LearnerConfig(num_ranks=RANKS, deepspeed=DeepSpeedConfig(zero_stage=3))
    cfg = WeightPushConfig(backend=backend, timeout_s=60, bucket_mb=0.05)  # several rounds
    sources = plan_push(PushInputs(cfg, learner_cfg)).sources
    assert sources == RANKS
    setup(learners, [receiver], cfg, sources, ["rollout-0"])
    before = ray.get(receiver.weights.remote())[1]
    base = 0 if backend == "gloo" else 10
    for version in (base + 1, base + 2):  # the group and its buffers are reused
        ray.get([a.train_once.remote(version) for a in learners])
        push(learners, [receiver], backend, version, f"push_shards_{backend}_v{version}", every_rank_sends=True)
        assert_delivered(learners, [receiver], version)
    after = ray.get(receiver.weights.remote())[1]
    assert not all(torch.equal(before[n], after[n]) for n in before)
    # staged beside a running request (weights.staging), then swapped in
    ray.get([a.train_once.remote(base + 3) for a in learners])
    sends = [a.push_weights.remote(base + 3) for a in learners]
    assert ray.get(receiver.stage_and_apply.remote(WeightHandle(base + 3, backend)), timeout=120) == base + 3
    ray.get(sends, timeout=120)
    assert_delivered(learners, [receiver], base + 3)


@pytest.mark.parametrize("backend", ["gloo", "peer"])
def test_the_gathered_path_of_a_zero3_learner_delivers_the_same_weights(cluster, backend):
    """Rank 0 gathers and sends (sources 0), the path of a merged LoRA push and of the object store,
    to both receivers; 0.05 MiB buckets: the tiny policy (~0.4 MiB) travels in several."""
    learners, receivers = cluster
    cfg = WeightPushConfig(backend=backend, timeout_s=60, bucket_mb=0.05)
    setup(learners, receivers, cfg, 0, ["rollout-0", "rollout-1"])
    base = 20 if backend == "gloo" else 30
    for version in (base + 1, base + 2):  # the group is built once and reused
        ray.get([a.train_once.remote(version) for a in learners])
        push(learners, receivers, backend, version, f"push_gather_{backend}_v{version}")
        assert_delivered(learners, receivers, version)


def test_object_store_push_delivers_identical_weights(cluster):
    learners, receivers = cluster
    cfg = WeightPushConfig(backend="object_store", timeout_s=30)
    ray.get([a.setup_weight_push.remote(cfg) for a in learners] + [r.setup_push.remote(cfg) for r in receivers])
    before = ray.get(receivers[0].weights.remote())[1]
    ray.get([a.train_once.remote(40) for a in learners])
    push(learners, receivers, "object_store", 40, "push_object_store")
    assert_delivered(learners, receivers, 40)
    after = ray.get(receivers[0].weights.remote())[1]
    assert not all(torch.equal(before[n], after[n]) for n in before)


def test_missing_receiver_fails_the_sender_in_time_and_names_it(cluster):
    learners, receivers = cluster
    cfg = WeightPushConfig(backend="gloo", timeout_s=4)
    setup(learners, receivers, cfg, 0, ["rollout-0", "rollout-1", "rollout-ghost"])  # the ghost never joins
    t0 = time.perf_counter()
    sends = [a.push_weights.remote(50) for a in learners]
    receives = [r.receive_weights.remote(WeightHandle(50, "gloo")) for r in receivers]
    with pytest.raises(ray.exceptions.RayTaskError, match="never joined: rollout-ghost"):
        ray.get(sends[0], timeout=60)
    TIMES["sender_timeout"] = elapsed = time.perf_counter() - t0
    assert cfg.timeout_s <= elapsed < cfg.timeout_s + 15
    # the other learner ranks finished their gathers with rank 0
    assert ray.get(sends[1:], timeout=60) == [None] * (RANKS - 1)
    for ref in receives:  # the receivers that came fail too, naming whom they waited for
        with pytest.raises(ray.exceptions.RayTaskError, match="learner rank 0"):
            ray.get(ref, timeout=60)


def test_the_tests_ray_instance_runs_without_its_monitors(cluster):
    """harness.local_ray starts the instance without the log monitor, the autoscaler's monitor and the
    dashboard's API server (the tests read no worker logs, scale no nodes and query no dashboard);
    the raylet, GCS and workers run as always."""
    from ray._private import ray_constants

    started = set(ray._private.worker._global_node.all_processes)
    assert ray_constants.PROCESS_TYPE_RAYLET in started and ray_constants.PROCESS_TYPE_GCS_SERVER in started
    assert ray_constants.PROCESS_TYPE_LOG_MONITOR not in started
    assert ray_constants.PROCESS_TYPE_MONITOR not in started
    assert ray_constants.PROCESS_TYPE_DASHBOARD not in started
    assert ray.get(ray.remote(lambda: 1).remote()) == 1
