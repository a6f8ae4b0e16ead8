"""Each of the scheduler's state machines alone (coordinator/decisions/admission.py, weights.py, evaluation.py,
fleet_policy.py), fed its own events: no scheduler, no Ray, no model; and the one metric type
(common/stats.py) they and the learner share. Milliseconds each."""
from __future__ import annotations

import pickle

from stabledrl.common.stats import Reduce, Stat, combine
from stabledrl.common.tasks import PromptStream
from stabledrl.common.types import EvalResult
from stabledrl.coordinator.decisions import events as ev
from stabledrl.coordinator.decisions.admission import Admission
from stabledrl.coordinator.decisions.evaluation import Evaluation
from stabledrl.coordinator.decisions.fleet import Fleet
from stabledrl.coordinator.decisions.fleet_policy import FleetPolicy
from stabledrl.coordinator.decisions.versions import WeightVersions
from scheduler_sim import ROWS, episode, job


def fleet(workers: int = 2, **kwargs: int) -> Fleet:
    out = Fleet(**{"target": workers, "min_workers": 1, "max_workers": 4, "max_restarts": 1, "autoscale": False,
                   **kwargs})
    for _ in range(workers):
        out.move(out.add(), "active")
    return out


def test_admission_feeds_up_to_the_bound_and_samples_a_lost_workers_requests_again_first():
    cfg = job(algorithm={"max_staleness": 0, "groups_per_step": 4})
    workers = fleet()
    admission = Admission(cfg, PromptStream(ROWS[:8], seed=3), workers)
    sent = admission.feed()
    assert [(c.worker, [r.uid for r in c.requests]) for c in sent] == [(0, [0]), (1, [1]), (0, [2]), (1, [3])]
    assert admission.feed() == [] and admission.staleness.capacity() == 0  # (η + v + 1) · B admitted
    assert admission.feed(held={0, 1}) == []
    lost = [c for _, c in workers.forget(1)]  # worker 1's process died
    admission.lost([r for c in lost for r in c.requests])
    assert [r.uid for r in admission.requeue] == [1, 3] and admission.outstanding() == [0, 1, 2, 3]
    again = admission.feed()
    assert [[r.uid for r in c.requests] for c in again] == [[1], [3]]  # re-queued uids first, same uids
    assert admission.next_uid == 4


def test_admission_buffers_a_delivered_request_once_and_counts_its_reward_calls():
    cfg = job()
    admission = Admission(cfg, PromptStream(ROWS[:8], seed=3), fleet())
    (first, *_) = admission.feed()
    answer = ev.RolloutDone(first.call, [episode(r.uid, r.row, 0, 0) for r in first.requests], {"calls": 2.0})
    assert admission.rollout_done(answer) == []
    assert admission.rollout_done(answer) == []  # a late duplicate: its call is no longer waited for
    assert len(admission.buffer) == 1 and admission.totals() == {"rollout/reward_calls/calls": 2.0}


def test_admission_stops_the_job_when_too_many_reward_calls_fail():
    cfg = job(task={"reward": {"max_failed_fraction": 0.1, "failure_check_after": 1}})
    admission = Admission(cfg, PromptStream(ROWS[:8], seed=3), fleet())
    (first, *_) = admission.feed()
    out = admission.rollout_done(ev.RolloutDone(first.call, [], {"calls": 4.0, "failed": 4.0}))
    assert len(out) == 1 and isinstance(out[0], ev.Stop)


def test_weight_versions_object_store_push_loads_the_version_it_names_and_a_new_worker_loads_the_newest():
    workers = fleet()
    weights = WeightVersions(workers, collective=False, timeout_s=10.0)
    out = weights.start(3)
    assert [type(c) for c in out] == [ev.Push, ev.LoadWeights, ev.LoadWeights]
    assert {c.version for c in out} == {3} and weights.held() == {}  # object store: nobody waits
    weights.done(ev.PushDone(3, 0.1))
    new = workers.add()
    commands, text = weights.join(new)
    assert [type(c) for c in commands] == [ev.SetupWorkerPush, ev.LoadWeights] and commands[1].version == 3
    assert new.state == "active" and text == "weights version 3"
    weights.loaded(ev.WeightsLoaded(commands[1].call, 3))
    assert new.version == 3


def test_weight_versions_collective_push_holds_its_receivers_and_skips_a_replaced_one():
    workers = fleet()
    weights = WeightVersions(workers, collective=True, timeout_s=10.0)
    (push,) = weights.start(1)
    assert push.barrier and push.receivers == (0, 1) and set(weights.held()) == {0, 1}
    workers.replace(workers[1])  # its process died during the push: the replacement did not receive it
    _, out = weights.done(ev.PushDone(1, 0.1))
    assert out == [] and workers[0].version == 1 and workers[1].version == 0
    weights.start(2)
    _, loads = weights.done(ev.PushDone(2, 0.1, staged=True))
    assert [c.worker for c in loads] == [0] and workers[0].version == 1  # held once applied (WeightsLoaded)


def test_evaluation_deals_parts_runs_a_lost_workers_part_again_and_merges_once():
    cfg = job(eval={"num_prompts": 4})
    workers = fleet()
    evaluation = Evaluation(cfg, ROWS[:4], workers)
    out, done = evaluation.evaluate(step=0, first=True)
    assert not done and [c.worker for c in out] == [0, 1] and [len(c.rows) for c in out] == [2, 2]
    evaluation.eval_done(ev.EvalDone(out[0].call, 0, EvalResult(2, 1, {1: 0.5}, 0.5, [1, 0])))
    workers.forget(1)
    evaluation.lost_worker(1)
    again, done = evaluation.evaluate(step=0, first=False)
    assert not done and [c.worker for c in again] == [0] and again[0].rows == out[1].rows  # the same part
    evaluation.eval_done(ev.EvalDone(again[0].call, 0, EvalResult(2, 1, {1: 1.0}, 1.0, [1, 1])))
    final, done = evaluation.evaluate(step=0, first=False)
    assert done and evaluation.last_eval.pass_at_1 == 0.75 and [type(c) for c in final] == [ev.Record, ev.Log]
    assert "1 part(s) run again" in final[1].line


def test_fleet_policy_replaces_a_lost_worker_then_gives_up_after_its_restarts():
    cfg = job(rollout={"max_restarts": 1})
    workers = fleet(max_restarts=1)
    policy = FleetPolicy(cfg, workers)
    call = workers.call("rollout", "rollout worker 1 (prompts 7)", workers[1])
    worker, failed_call, out = policy.call_failed(ev.CallFailed(call, "died", "SIGKILL"))
    assert worker is workers[1] and out == []
    requests, out = policy.lost(worker, "died", "SIGKILL", True, failed_call)
    assert [type(c) for c in out] == [ev.StartWorker, ev.Log] and out[0].replaces and workers[1].restarts == 1
    assert policy.counts["faults/rollout_worker_deaths"] == 1 and policy.counts["faults/rollout_workers_replaced"] == 1
    _, out = policy.lost(workers[1], "timed_out", "5 s", True)
    assert isinstance(out[0], ev.Stop) and "giving up (rollout.max_restarts = 1)" in out[0].reason
    assert "`stabledrl train --resume /tmp/sim-run` continues from its last checkpoint" in out[0].reason


def test_fleet_policy_drops_a_worker_lost_with_its_node_and_retires_the_newest_on_a_smaller_size():
    cfg = job()
    workers = fleet(3)
    policy = FleetPolicy(cfg, workers)
    _, out = policy.lost(workers[2], "died", "node gone", node_alive=False)
    assert isinstance(out[0], ev.RemoveWorker) and workers.target == 2 and 2 not in workers.workers
    out = policy.control_polled(ev.ControlPolled(workers.call("poll", "control"), requested=1, room=False))
    assert workers[1].state == "retiring" and "retiring" in out[-1].line
    out = policy.retire_idle(receivers={})
    assert [type(c) for c in out] == [ev.RemoveWorker, ev.Log] and policy.counts["elastic/workers_retired"] == 1


def test_a_stat_carries_its_reduction_through_pickling_and_one_combine_serves_iterations_and_ranks():
    stat = pickle.loads(pickle.dumps(Stat(2.0, Reduce.MAX, replicated=True)))
    assert stat == 2.0 and stat.reduce is Reduce.MAX and stat.replicated
    iterations = combine([{"m": Stat(1.0, weight=1.0), "n": Stat(1.0, Reduce.COUNT), "l": Stat(1.0, Reduce.LAST)},
                          {"m": Stat(4.0, weight=3.0), "n": Stat(2.0, Reduce.COUNT), "l": Stat(5.0, Reduce.LAST)}],
                         across="iterations")
    assert iterations == {"m": 13.0 / 4.0, "n": 3.0, "l": 5.0} and iterations["m"].weight == 4.0
    ranks = combine([{"g": Stat(1.0, replicated=True), "x": Stat(1.0, Reduce.MAX)},
                     {"g": Stat(9.0, replicated=True), "x": Stat(3.0, Reduce.MAX)}], across="ranks")
    assert ranks == {"g": 1.0, "x": 3.0}
