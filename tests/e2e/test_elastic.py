"""Elastic rollout on a simulated multi-node cluster (ray.cluster_utils.Cluster: one head with room
for the learner rank and one worker, nodes added and removed while the job trains).

A node joins: with rollout.autoscale the driver sees room for a worker between steps and starts
one there; it loads the current weights and its groups reach the learner. The node leaves: the
worker dies with it, its requests are re-queued, it is not replaced (the cluster shrank, and
rollout.min_workers still run), and the job trains to the end. Every prompt is trained exactly
once (η = 0: step s trains prompts 4(s-1) .. 4s-1)."""
from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

import harness  # noqa: E402
import warm_workers  # noqa: E402  (tests/helpers, on the path: tests/conftest.py)
from stabledrl.coordinator.driver import Driver  # noqa: E402
from harness import job_config, read_records, recording_learner, recording_rollout, wait_until  # noqa: E402

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.cloudpickle.register_pickle_by_value(harness)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    # the workers of every node (one machine) fork from the warm process, as local_ray's do
    ray.init(address=cluster.address, log_to_driver=False, runtime_env=warm_workers.runtime_env())
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def operator(cluster, driver: Driver, records: Path, events: dict) -> None:
    """Add a node after step 1; once its worker's groups were trained on, remove the node. Gates
    hold the learner so that each act lands while the job trains."""
    if not wait_until(lambda: len(driver.history) >= 1, "step 1", events):
        return
    node = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    events["node"] = node.node_id
    (records / "node_added").touch()  # step 2 trains now; its end sees the room
    fleet = driver.scheduler.fleet
    if not wait_until(lambda: getattr(fleet.get(1), "state", None) == "active", "worker 1 active", events):
        return
    (records / "worker1_active").touch()
    if not wait_until(
        lambda: any(e.worker == 1 for b in driver.batches for e in b), "a batch with worker 1's groups", events
    ):
        return
    cluster.remove_node(node)
    events["removed_at_step"] = len(driver.history)
    (records / "node_removed").touch()


def test_a_node_that_joins_gets_a_worker_and_one_that_leaves_loses_it(cluster, tmp_path):
    records = tmp_path / "records"
    records.mkdir()
    cfg = job_config(tmp_path / "run", task={"source": {"kind": "generated", "n": 64}}, learner={"num_ranks": 1},
                     rollout={"num_workers": 1, "max_workers": 2, "autoscale": True},
                     cluster={"learner": {"num_cpus": 0.5}, "rollout": {"num_cpus": 0.5}, "start_timeout_s": 240},
                     run={"steps": 8})
    gates = {1: records / "node_added", 2: records / "worker1_active", 6: records / "node_removed"}
    driver = Driver(cfg, rollout_cls=recording_rollout(records), learner_cls=recording_learner(records, gates=gates),
                    record_batches=True)
    events: dict = {}
    driver.setup()

    def train() -> None:  # the driver trains in a thread: Cluster.add_node must run on the main thread
        try:
            driver.train()
            driver.drain()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            events["failure"] = e

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    try:
        operator(cluster, driver, records, events)
        thread.join(timeout=600)
    finally:
        driver.close()
    assert not thread.is_alive() and "failure" not in events, events.get("failure")
    assert "error" not in events, events.get("error")

    calls = read_records(records, "rollout_")
    assert {c["node"] for c in calls if c["worker"] == 1} == {events["node"]}, "worker 1 ran on the node that joined"
    assert any(e.worker == 1 for batch in driver.batches for e in batch), "and its groups were trained on"
    workers = [r["rollout/workers"] for r in driver.history]
    assert workers[0] == 1 and 2 in workers and workers[-1] == 1, workers
    last = driver.history[-1]
    assert last["elastic/workers_added"] == 1
    assert last["faults/rollout_worker_deaths"] == 1 and last["faults/rollout_workers_dropped"] == 1
    assert last["faults/rollout_workers_replaced"] == 0
    assert [r["version"] for r in driver.history] == [float(s) for s in range(1, 9)]
    for s, batch in enumerate(driver.batches):
        assert [e.uid for e in batch] == list(range(4 * s, 4 * s + 4))
        assert {x.policy_version for e in batch for x in e.group.samples} == {s}


def test_a_custom_resource_pins_a_role_to_its_nodes_and_a_node_that_left_holds_nothing(cluster):
    """cluster.learner.resources = {learner_node: 1}: the learner ranks' bundles land on the node
    started with that resource, for any strategy, never on the head or another node; once that
    node is gone no node can hold such a bundle (what fails a lost worker's replacement fast)."""
    import time

    from ray.util.placement_group import placement_group_table, remove_placement_group

    from stabledrl.common.config.job import ActorResources
    from stabledrl.coordinator.runtime.placement import bundle, reserve
    from stabledrl.coordinator.runtime.pool import can_hold

    pinned = cluster.add_node(num_cpus=1, resources={"learner_node": 2})
    other = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    resources = ActorResources(num_cpus=0.25, resources={"learner_node": 1})
    assert bundle(resources) == {"CPU": 0.25, "learner_node": 1}
    for strategy in ("PACK", "SPREAD"):
        group = reserve("stabledrl-learner-test", resources, 2, strategy, 60)
        nodes = set(placement_group_table(group)["bundles_to_node_id"].values())
        assert nodes == {pinned.node_id}, strategy
        # the learner's own bundles leave no room for a third on that node (a replacement is not placeable there)
        assert can_hold(bundle(resources)) and not can_hold(bundle(resources), [group])
        remove_placement_group(group)
    cluster.remove_node(pinned)
    deadline = time.monotonic() + 60
    while can_hold(bundle(resources)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not can_hold(bundle(resources)) and can_hold({"CPU": 0.25})
    cluster.remove_node(other)
