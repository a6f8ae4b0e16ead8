"""Each call the runtime waits for answers with its own event, bound where the call is made
(coordinator/runtime/executor.py): nothing reads what kind of call came back. Actor handles are
stand-ins and ``ray.get`` returns the value a test gives, so no cluster is needed."""
from __future__ import annotations

import itertools
import types
from typing import Any

import pytest

from stabledrl.common.stats import Reduce, Stat
from stabledrl.common.types import EvalResult, RolloutResult, StepResult
from stabledrl.coordinator.decisions import events as ev
from stabledrl.coordinator.runtime import executor
from stabledrl.coordinator.runtime.actors import Actors
from stabledrl.coordinator.runtime.call_groups import PushGroup, StepGroup
from stabledrl.coordinator.runtime.executor import RayRuntime


CALLS = itertools.count()


class _Actor:
    """An actor handle: ``x.method.remote(...)`` returns a token naming the call (its object reference)."""

    def __init__(self, name: str) -> None:
        self.name, self._actor_id = name, types.SimpleNamespace(hex=lambda: name)

    def __getattr__(self, method: str) -> Any:
        return types.SimpleNamespace(remote=lambda *args: f"{self.name}.{method} #{next(CALLS)}")


class _Sync:
    def load(self, worker: int, version: int) -> str:
        return f"worker{worker}.load {version} #{next(CALLS)}"

    def setup_worker(self, worker: int) -> str:
        return f"worker{worker}.setup #{next(CALLS)}"


class _Protocol:
    """The ProtocolRunner: records what it grades."""

    def __init__(self) -> None:
        self.recorded: list = []

    def request(self, unit: int) -> tuple:
        return ([[1, 2]], [unit], None)

    def graded(self, unit: int, completions: list) -> None:
        self.recorded.append((unit, completions))


@pytest.fixture
def runtime(tmp_path) -> RayRuntime:
    protocol = _Protocol()
    actors = Actors([_Actor("learner0"), _Actor("learner1")], [_Actor("worker0"), _Actor("worker1")])
    return RayRuntime(actors, _Sync(), control=_Actor("control"), output_dir=tmp_path, config={}, start_timeout_s=5.0,
                      autoscale=False, protocol=protocol)


def answer(runtime: RayRuntime, monkeypatch, command: Any, value: Any) -> list:
    """Carry ``command`` out, then have its call come back with ``value``: the events it means."""
    before = set(runtime.calls.waiting)
    assert runtime.execute(command) == []
    (ref,) = set(runtime.calls.waiting) - before
    monkeypatch.setattr(executor.ray, "get", lambda r: value if r == ref else pytest.fail(f"ray.get({r})"))
    return runtime._finished(ref, runtime.calls.pop(ref))


def test_every_worker_call_answers_with_its_own_event(runtime, monkeypatch):
    result = RolloutResult([], {"calls": 2.0}, clock={"wall": 1.0, "generate": 0.5})
    assert answer(runtime, monkeypatch, ev.Generate(7, 1, (), 10.0), result) == [ev.RolloutDone(7, [], {"calls": 2.0})]
    assert runtime.times.latest["rollout1"] == {"wall": 1.0, "generate": 0.5}  # the worker's clock is kept
    assert answer(runtime, monkeypatch, ev.LoadWeights(8, 0, 3, 10.0), 3) == [ev.WeightsLoaded(8, 3)]
    held_out = EvalResult(2, 1, {1: 0.5}, 0.5, [])
    assert answer(runtime, monkeypatch, ev.Evaluate(9, 0, [], 1, 0, None, 10.0), (4, held_out)) == [
        ev.EvalDone(9, 4, held_out)]
    assert answer(runtime, monkeypatch, ev.Complete(10, 1, 5, 10.0), ["7"]) == [ev.UnitDone(10)]
    assert runtime.protocol.recorded == [(5, ["7"])]  # graded as it came back
    assert answer(runtime, monkeypatch, ev.PollControl(11, {}, 5.0), 3) == [ev.ControlPolled(11, 3, False)]
    assert answer(runtime, monkeypatch, ev.SetupWorkerPush(0), None) == []  # a failure shows in the load behind it


def test_a_started_worker_answers_with_its_info_and_a_late_start_names_the_free_resources(runtime, monkeypatch):
    monkeypatch.setattr(runtime.actors.pool, "launch", lambda index, replaces: _Actor(f"new{index}"))
    info = {"node_id": "node-a", "pid": 12}
    assert answer(runtime, monkeypatch, ev.StartWorker(12, 2, False, 30.0), info) == [ev.WorkerStarted(12, info)]
    assert runtime.nodes[2] == "node-a"
    monkeypatch.setattr(executor.ray, "available_resources", lambda: {"CPU": 0.5})
    runtime.execute(ev.StartWorker(13, 3, False, 30.0))
    ((ref, waiting),) = [(r, w) for r, w in runtime.calls.waiting.items() if w.call == 13]
    assert runtime._late(ref, waiting) == [ev.CallFailed(13, "timed_out", "the cluster has {'CPU': 0.5} free")]
    runtime.execute(ev.Generate(14, 0, (), 10.0))
    ((ref, waiting),) = [(r, w) for r, w in runtime.calls.waiting.items() if w.call == 14]
    assert runtime._late(ref, waiting) == [ev.CallFailed(14, "timed_out", "10 s")]


def test_a_step_group_answers_once_every_rank_is_back_and_a_push_group_with_its_own_events():
    step = StepGroup({"r0": "learner rank 0", "r1": "learner rank 1"}, {}, 60.0, step=4, started=1.0)
    stat = {"train/loss": Stat(0.5, Reduce.MEAN)}
    step.results = {"r1": StepResult(stat), "r0": StepResult(stat)}
    done = step.outcome([], now=3.0)
    assert done == ev.StepDone(4, [stat, stat], 2.0, at=3.0)
    step.failures = {"r1": ("died", "killed")}
    assert step.outcome(["r0"], now=3.0) == ev.LearnerFailed(
        "step 4", [ev.RankOutcome(1, "died", "killed"), ev.RankOutcome(0, "running")], None)
    push = PushGroup({"s0": "learner rank 0", "w3": "rollout worker 3"}, {"w3": 3}, 20.0, version=5, started=1.0,
                     staged=True)
    assert push.outcome([], now=1.5) == ev.PushDone(5, 0.5, at=1.5, staged=True)
    push.failures = {"w3": ("died", "gone")}
    assert push.outcome([], now=2.0) == ev.PushFailed(5, (3,), "rollout worker 3 died: gone")
    object_store = PushGroup({"s0": "learner rank 0"}, {}, 20.0, version=6)
    object_store.failures = {"s0": ("raised", "out of memory")}
    assert object_store.outcome([], now=2.0) == ev.LearnerFailed(
        "weights version 6", [ev.RankOutcome(0, "raised", "out of memory")], None)
