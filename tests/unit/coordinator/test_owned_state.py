"""Each piece of the control plane's state has one owner: the fleet alone moves a worker through
its diagram, an agenda task carries its own state through its own, and the driver and the tests
read the scheduler through one frozen snapshot. No Ray, no model."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from stabledrl.coordinator.decisions import events as ev
from stabledrl.coordinator.decisions.agenda import GOALS, Task, TaskKind, TaskState
from stabledrl.coordinator.decisions.fleet import TRANSITIONS, Fleet, IllegalTransition
from stabledrl.coordinator.decisions.scheduler import Scheduler
from scheduler_sim import Sim, job

ROOT = Path(__file__).resolve().parents[3]
WORKER_FIELDS = {"state", "version", "info", "restarts", "index"}


def fleet() -> Fleet:
    return Fleet(target=2, min_workers=1, max_workers=4, max_restarts=1, autoscale=False)


def test_the_fleet_moves_a_worker_only_along_its_diagram():
    f = fleet()
    worker = f.add()
    with pytest.raises(IllegalTransition, match="rollout worker 0: starting -> starting"):
        f.move(worker, "starting")
    f.move(worker, "syncing")
    f.move(worker, "active")
    for wrong in ("starting", "syncing", "active"):
        with pytest.raises(IllegalTransition):
            f.move(worker, wrong)  # an active worker only retires
    f.move(worker, "retiring")
    assert worker.state == "retiring" and not TRANSITIONS["retiring"]
    with pytest.raises(IllegalTransition, match="retiring -> active"):
        f.move(worker, "active")
    replaced = f.replace(worker)  # a new process of the index starts over
    assert replaced.state == "starting" and replaced.restarts == 1 and f[0] is replaced


@pytest.mark.parametrize("state", ["starting", "syncing", "active", "retiring"])
def test_a_worker_takes_only_the_edges_of_its_diagram(state):
    """fleet.py's diagram, edge by edge: starting -> syncing, active or retiring; syncing -> active
    or retiring; active -> retiring; retiring -> none (removal only)."""
    edges = {("starting", "syncing"), ("starting", "active"), ("starting", "retiring"), ("syncing", "active"),
             ("syncing", "retiring"), ("active", "retiring")}
    for to in ("starting", "syncing", "active", "retiring"):
        f = fleet()
        worker = f.add()
        worker.state = state  # the test puts it there: a worker in each state
        if (state, to) in edges:
            f.move(worker, to)
            assert worker.state == to
        else:
            with pytest.raises(IllegalTransition, match=f"{state} -> {to} is not a transition"):
                f.move(worker, to)


def worker_writes(path: Path) -> list[str]:
    """Assignments to a worker's fields (``x.state = ...``, ``x.version += ...``) in ``path``, as
    'line: .field'."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(t, ast.Attribute) and t.attr in WORKER_FIELDS and not (
                        isinstance(t.value, ast.Name) and t.value.id == "self"):
                    out.append(f"{node.lineno}: .{t.attr}")
    return out


def test_only_the_fleet_writes_a_worker():
    """The decisions hold the workers (coordinator/decisions/fleet.py's WorkerState); the runtime
    has none."""
    decisions = ROOT / "coordinator" / "decisions"
    writes = [f"{p.name}:{w}" for p in sorted(decisions.glob("*.py")) if p.name != "fleet.py" for w in worker_writes(p)]
    assert not writes, "a worker's state written outside Fleet:\n" + "\n".join(writes)
    assert len(worker_writes(decisions / "fleet.py")) == 3  # move, came_up, holds


def test_the_write_check_sees_a_write_outside_the_fleet(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text("def f(worker, w):\n    worker.state = 'active'\n    w.version, n = 3, 1\n    self.state = 1\n")
    assert worker_writes(bad) == ["2: .state", "3: .version"]


def test_an_agenda_task_goes_pending_started_sent_done_and_no_other_way():
    task = Task(TaskKind.CHECKPOINT)
    with pytest.raises(RuntimeError, match="checkpoint: pending -> done"):
        task.finish()
    assert task.start() and not task.start()  # True the first time only
    task.send()
    with pytest.raises(RuntimeError, match="sent -> sent"):
        task.send()
    task.finish()
    task.finish()  # finishing twice is harmless
    assert task.done and task.state is TaskState.DONE
    with pytest.raises(RuntimeError, match="done -> sent"):
        task.send()


@pytest.mark.parametrize("state", list(TaskState))
def test_a_task_takes_only_the_edges_of_its_diagram(state):
    """pending -> started -> (sent ->) done, done again harmless: every other edge is refused."""
    edges = {(TaskState.PENDING, TaskState.STARTED), (TaskState.STARTED, TaskState.SENT),
             (TaskState.STARTED, TaskState.DONE), (TaskState.SENT, TaskState.DONE), (TaskState.DONE, TaskState.DONE)}
    for to in TaskState:
        task = Task(TaskKind.CHECKPOINT, state=state)
        if (state, to) in edges:
            task._go(to)
            assert task.state is to
        else:
            with pytest.raises(RuntimeError, match=f"{state.value} -> {to.value} is not a transition"):
                task._go(to)


def test_every_task_kind_has_a_handler_and_every_goal_names_kinds():
    scheduler = Sim(job()).scheduler
    assert set(scheduler._tasks) == set(TaskKind)
    assert all(isinstance(kind, TaskKind) for kinds in GOALS.values() for kind in kinds)


def test_a_snapshot_is_frozen_and_does_not_follow_the_scheduler():
    sim = Sim(job())
    sim.begin("train")
    before = sim.scheduler.snapshot()
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.step = 3
    with pytest.raises(TypeError):
        before.counts["faults/rollout_worker_deaths"] = 1  # read-only
    dead = sim.take(ev.Generate, worker=1)
    sim.send(ev.CallFailed(dead[0].call, "died", "killed"))
    after = sim.scheduler.snapshot()
    assert before.requeued == () and before.counts["faults/rollout_worker_deaths"] == 0
    assert after.requeued == (1, 3) and after.counts["faults/rollout_worker_deaths"] == 1
    assert [w.state for w in after.workers] == ["active", "starting"] and after.worker_versions == [0]


def test_the_scheduler_keeps_no_forwarding_properties():
    forwarding = [name for name, value in vars(Scheduler).items() if isinstance(value, property)]
    assert forwarding == ["done"]
