"""``cluster.colocate`` on real Ray actors and DeepSpeed (CPU): rollout worker i runs in learner
rank i's bundle of one placement group, and the run trains exactly as with separate placements.

The reference run places both roles apart (two placement groups) with 1 rollout worker; the
colocated run puts 2 learner ranks (ZeRO-2) and 2 workers into one group of 2 shared bundles, each
holding a rank's and a worker's CPUs (on GPUs: the one GPU they share, half each), and its worker 1
SIGKILLs itself in its second request: the replacement takes the same shared bundle. With η = 0
every step's metrics and the final weights equal the reference's, bit for bit (samples are seeded
by prompt, not by worker, so the fleets may differ), with the weights pushed through the object
store and through the same-device push (ipc). (ZeRO-3 ranks colocated through ipc, each pushing
its own partitions: tests/e2e/test_system.py.)
"""
from __future__ import annotations

import pytest
import torch

ray = pytest.importorskip("ray")

from ray.util.placement_group import placement_group_table  # noqa: E402

from stabledrl.coordinator.driver import Driver  # noqa: E402
import harness  # noqa: E402
from harness import DETERMINISTIC, InspectedLearner, job_config, read_records, recording_rollout  # noqa: E402
from job_lines import job_lines  # noqa: E402

pytestmark = pytest.mark.e2e


def config(out, colocate: bool, backend: str = "auto", ipc: str = "auto", **extra):
    return job_config(out, run={"steps": 3}, cluster={"colocate": colocate, "learner": {"num_cpus": 0.5},
                                                       "rollout": {"num_cpus": 0.5}},
                      weights={"backend": backend, "ipc": ipc}, **extra)


def placements(driver: Driver) -> tuple[list[dict], list[dict], dict]:
    actors = driver.runtime.actors
    learners = ray.get([a.placement.remote() for a in actors.learners], timeout=60)
    workers = ray.get([w.placement.remote() for w in driver.active_rollouts()], timeout=60)
    groups = {g["placement_group_id"]: g for g in placement_group_table().values() if g["state"] == "CREATED"}
    return learners, workers, groups


def run(cfg, rollout_cls: type, learner_cls: type = InspectedLearner) -> dict:
    """The job to its end, with where its actors ran before and after training, worker i's bundle
    index, and learner rank 0's final weights."""
    driver = Driver(cfg, rollout_cls=rollout_cls, learner_cls=learner_cls, record_batches=True)
    driver.setup()
    try:
        before = placements(driver)
        driver.train()
        driver.drain()
        after = placements(driver)
        bundles = [p.placement.bundle for _, p in sorted(driver.runtime.actors.pool.processes.items())]
        segments = {"learners": ray.get([a.segments.remote() for a in driver.actors.learners], timeout=60),
                    "workers": dict(ray.get([w.segments.remote() for w in driver.active_rollouts()], timeout=60))}
        weights = ray.get([a.weights.remote() for a in driver.actors.learners], timeout=120)[0]
    finally:
        driver.close()
    return {"driver": driver, "weights": weights, "before": before, "after": after, "bundles": bundles,
            "segments": segments}


@pytest.fixture(scope="module")
def reference(cluster, tmp_path_factory):
    """Placed apart, the push through the object store, 1 rollout worker."""
    return run(config(tmp_path_factory.mktemp("reference"), False, rollout={"num_workers": 1}),
               harness.InspectedRollout)


@pytest.fixture(scope="module", params=[("auto", "auto"), ("ipc", "auto"), ("ipc", "copy")],
                ids=["object_store", "ipc_view", "ipc_copy"])
def colocated(cluster, tmp_path_factory, request):
    """auto: the object store on CPU actors; ipc (auto: view, the models' dtypes being the learner's):
    each worker's parameters are views of its learner rank's (shared-memory segments on the CPU, as
    CUDA IPC on a GPU), the replacement's its predecessor's rank's; ipc copy: each worker maps its
    rank's push buffer and copies it into its own model."""
    records = tmp_path_factory.mktemp("records")
    backend, ipc = request.param
    with job_lines() as lines:
        out = run(config(tmp_path_factory.mktemp("colocated"), True, backend, ipc),
                  recording_rollout(records, die_on_call=2, die_index=1, hold_index=0))
    return {**out, "records": records, "lines": lines, "views": backend == "ipc" and ipc == "auto"}


def test_each_worker_shares_its_learner_ranks_bundle_and_a_replacement_takes_it_again(reference, colocated):
    ref_learners, ref_workers, _ = reference["before"]
    (learners, workers, groups), (_, workers_after, _) = colocated["before"], colocated["after"]
    driver, bundles = colocated["driver"], colocated["bundles"]
    records, lines = colocated["records"], colocated["lines"]
    assert len({p["group"] for p in ref_learners + ref_workers}) == 2  # apart: a group for each role
    assert not any(p["share_gpu"] for p in ref_learners + ref_workers)
    shared = {p["group"] for p in learners + workers + workers_after}
    assert len(shared) == 1, "both roles, and the replacement, in one placement group"
    group = groups[shared.pop()]
    assert group["name"] == "stabledrl-colocated"
    assert list(group["bundles"].values()) == [{"CPU": 1.0}] * 2  # a rank's 0.5 CPU + a worker's 0.5 each
    assert all(p["share_gpu"] for p in learners + workers + workers_after)
    assert [p["push_sources"] for p in learners] == [0, 0]  # ZeRO-2: each rank copies its whole parameters
    calls = read_records(records, "rollout_")
    assert len({c["pid"] for c in calls if c["worker"] == 1}) == 2, "worker 1 died and was replaced"
    assert driver.history[-1]["faults/rollout_workers_replaced"] == 1
    assert bundles == [0, 1]  # worker i, its replacement included, in rank i's bundle
    assert any("each beside its learner rank (cluster.colocate)" in line for line in lines), lines


def test_a_colocated_run_trains_exactly_as_one_placed_apart(reference, colocated):
    assert_trained_alike(colocated, reference)


def test_a_viewing_worker_holds_no_copy_of_the_weights(colocated):
    """With views, worker i's parameters lie in learner rank i's shared-memory segments, each at the
    rank's own offset (the replacement of worker 1 too): one copy of the weights per device. The
    other transports leave every worker its own private copy. (Both train exactly as the reference.)"""
    learners, workers = colocated["segments"]["learners"], colocated["segments"]["workers"]
    assert sorted(workers) == [0, 1]
    for index, mine in workers.items():
        if colocated["views"]:
            assert mine == learners[index] and all(name for name, _ in mine.values()), index
            assert not set(n for n, _ in mine.values()) & set(n for n, _ in learners[1 - index].values())
        else:
            assert all(name is None for name, _ in mine.values()), index


def assert_trained_alike(got: dict, want: dict, timed: tuple[str, ...] = ()) -> None:
    """Two runs (``run``'s results) logged the same deterministic metrics at every step (NaN equal to
    NaN) but ``timed`` (those that depend on timing in these runs) and ended with the same weights, bit
    for bit."""
    assert [r["version"] for r in got["driver"].history] == [1.0, 2.0, 3.0]
    for mine, theirs in zip(got["driver"].history, want["driver"].history, strict=True):
        for key in (k for k in DETERMINISTIC if k not in timed):
            if key in theirs:
                assert mine[key] == theirs[key] or (mine[key] != mine[key] and theirs[key] != theirs[key]), key
    assert want["weights"].keys() == got["weights"].keys()
    for name, tensor in want["weights"].items():
        assert torch.equal(got["weights"][name], tensor), name



def test_the_learners_push_is_reported_in_its_parts(colocated):
    """The push's clock splits into the GPU work it waited for, the gathers with the copies, and the
    memory handed back; the parts sit inside the push and are not counted twice in the idle time."""
    # a step's push shows in the next step's record; with views the set-up's push (version 0) in the first
    pushed = [r for r in colocated["driver"].history if "time/learner0/push" in r]
    assert len(pushed) == len(colocated["driver"].history) - (0 if colocated["views"] else 1)
    for record in pushed:
        for rank in (0, 1):
            parts = [record[f"time/learner{rank}/push_{p}"] for p in ("pending", "send", "release")]
            push = record[f"time/learner{rank}/push"]
            assert all(p >= 0 for p in parts) and parts[1] > 0
            assert sum(parts) <= push + 1e-6
            busy = sum(v for k, v in record.items() if k.startswith(f"time/learner{rank}/")
                       and k.split("/")[-1] in ("train", "push", "release", "load", "checkpoint"))
            assert record[f"time/learner{rank}/idle"] == pytest.approx(
                max(0.0, record[f"time/learner{rank}/wall"] - busy), abs=1e-6)
