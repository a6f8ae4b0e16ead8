"""A rollout node that leaves the cluster takes every worker on it at once (coordinator/decisions/fleet.py):
the scheduler handles them together when the first loss is reported, counts only the workers
still on live nodes, and stops at once, saying why, when a worker must be replaced and no node
left could hold one (instead of waiting cluster.start_timeout_s for a placement that cannot come)."""
from __future__ import annotations

from stabledrl.coordinator.decisions import events as ev
from scheduler_sim import Sim, job


def on_node(sim: Sim, node: str, *workers: int) -> None:
    for index in workers:
        sim.scheduler.fleet[index].info["node_id"] = node


def test_the_workers_of_a_node_that_left_go_together_and_the_count_is_of_the_live_ones():
    sim = Sim(job(rollout={"num_workers": 3}))
    on_node(sim, "nodeB", 1, 2)
    sim.begin("train")
    dead = sim.take(ev.Generate, worker=1)
    later = sim.pending(ev.Generate, worker=2)
    sim.send(ev.CallFailed(dead[0].call, "died", "node died", node_alive=False))
    assert sorted(c.worker for c in sim.commands if isinstance(c, ev.RemoveWorker)) == [1, 2]
    drops = [line for line in sim.logs() if "continuing with" in line]
    assert drops == ["rollout worker 1 lost with its node (node died); prompts 1 re-queued; continuing with 1 workers",
                     "rollout worker 2 lost with its node (its node left with rollout worker 1); prompts 2 re-queued; "
                     "continuing with 1 workers"], drops
    snap = sim.scheduler.snapshot()
    assert snap.counts["faults/rollout_workers_dropped"] == 2 and snap.requeued == (1, 2)
    sim.send(ev.CallFailed(later[0].call, "died", "node died", node_alive=False))  # worker 2's own report: handled
    assert sim.scheduler.snapshot().counts["faults/rollout_workers_dropped"] == 2 and sim.stop() is None
    for _ in range(4):
        sim.finish_rollouts()
    assert sorted(sim.trained()[0]) == [0, 1, 2, 3]  # worker 0 trains the re-queued prompts: nothing lost


def test_no_node_left_for_a_replacement_stops_the_job_at_once_saying_why():
    sim = Sim(job())
    on_node(sim, "nodeB", 0, 1)
    sim.begin("train")
    dead = sim.take(ev.Generate, worker=0)
    sim.send(ev.CallFailed(dead[0].call, "died", "node died", node_alive=False, placeable=False))
    assert (
        "no node left in the cluster can hold a rollout worker (cluster.rollout: 0.5 CPU, 0.0 GPU each)" in sim.stop()
    )
    assert "stabledrl train --resume /tmp/sim-run" in sim.stop()
    assert not sim.pending(ev.StartWorker)


def test_a_node_that_left_with_room_elsewhere_gets_one_replacement_and_the_rest_dropped():
    sim = Sim(job())
    on_node(sim, "nodeB", 0, 1)
    sim.begin("train")
    dead = sim.take(ev.Generate, worker=0)
    sim.send(ev.CallFailed(dead[0].call, "died", "node died", node_alive=False))
    (start,) = sim.pending(ev.StartWorker)
    assert start.worker == 0 and start.replaces  # rollout.min_workers = 1: one must run
    assert any("replacement 1 of at most 2 starting (its node left: it waits at most cluster.start_timeout_s = 600 s "
               "for room on another node)" in line for line in sim.logs()), sim.logs()
    assert sim.logs()[-1].endswith("continuing with 1 workers") and "rollout worker 1" in sim.logs()[-1]
    assert sim.stop() is None


def test_a_custom_resource_the_cluster_lacks_is_refused_before_any_actor_starts():
    import pytest

    from stabledrl.common.config.base import ConfigError
    from stabledrl.common.config.job import check_resources

    cfg = job(cluster={"learner": {"num_cpus": 0.5, "resources": {"learner_node": 1}}})
    check_resources(cfg, {"CPU": 4, "learner_node": 2})
    with pytest.raises(ConfigError, match=r"cluster.learner.resources.learner_node: learner.num_ranks \(2\) × 1 = 2, "
                                          r"but the Ray cluster has 1 learner_node \(start the nodes"):
        check_resources(cfg, {"CPU": 4, "learner_node": 1})
    with pytest.raises(ValueError, match="resources.GPU: set num_cpus / num_gpus instead"):
        job(cluster={"rollout": {"resources": {"GPU": 1}}})
