"""The scheduler's agenda (coordinator/decisions/scheduler.py): the goals the driver asks for and their tasks.

Goals. The driver asks for one goal at a time (``Scheduler.begin``): evaluate (``eval.protocol``'s
benchmarks if set, then the held-out rows), train (to ``run.steps``), drain (let admitted rollouts
land), checkpoint, restore (push restored weights). A goal is an agenda of tasks; the task at its
head decides what may happen now. While ``train`` is at the head, rollouts are admitted up to the
staleness bound and a batch is trained as soon as the buffer holds one; a finished step puts
``push`` and ``finish`` in front of it (``finish`` records the step and adds what ``due_after``
names: ``checkpoint``, ``protocol``, ``evaluate`` and ``poll`` when they are due), so nothing is
admitted between a step's end and its weights being out.

Tasks. A task is its kind (``TaskKind``) and its own state (``TaskState``): pending until it
reaches the head of the agenda, started when its handler first runs, sent while its one command
is out (a checkpoint), done when it may be popped; ``Task`` refuses any other order
(``TASK_TRANSITIONS``).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

from stabledrl.common.config.job import JobConfig


class TaskKind(enum.Enum):
    TRAIN = "train"  # admit rollouts, train a batch as soon as the buffer holds one
    PUSH = "push"  # the step's (or the restored) weights out to the workers
    FINISH = "finish"  # record the step, queue what is due after it
    CHECKPOINT = "checkpoint"
    PROTOCOL = "protocol"  # eval.protocol's benchmark table
    EVALUATE = "evaluate"  # the held-out rows
    POLL = "poll"  # the control actor: a requested size, room for one more worker
    DRAIN = "drain"  # let admitted rollouts, weight loads and starting workers land


class TaskState(enum.Enum):
    PENDING = "pending"  # not at the head of the agenda yet
    STARTED = "started"  # at the head: its handler has run at least once
    SENT = "sent"  # its one command is out (a checkpoint), waiting for the answer
    DONE = "done"  # popped off the agenda


# a task's life: the state -> the states it may go to (DONE again: finishing twice is harmless)
TASK_TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    TaskState.PENDING: frozenset({TaskState.STARTED}),
    TaskState.STARTED: frozenset({TaskState.SENT, TaskState.DONE}),
    TaskState.SENT: frozenset({TaskState.DONE}),
    TaskState.DONE: frozenset({TaskState.DONE}),
}

Goal = Literal["evaluate", "train", "drain", "checkpoint", "restore"]
GOALS: dict[str, tuple[TaskKind, ...]] = {
    "restore": (TaskKind.PUSH, TaskKind.DRAIN), "train": (TaskKind.TRAIN,), "drain": (TaskKind.DRAIN,),
    "evaluate": (TaskKind.PROTOCOL, TaskKind.EVALUATE), "checkpoint": (TaskKind.CHECKPOINT,),
}


@dataclass
class Task:
    kind: TaskKind
    state: TaskState = TaskState.PENDING

    def _go(self, to: TaskState) -> None:
        if to not in TASK_TRANSITIONS[self.state]:
            raise RuntimeError(f"agenda task {self.kind.value}: {self.state.value} -> {to.value} is not a transition")
        self.state = to

    def start(self) -> bool:
        """The task is at the head of the agenda; True the first time (its handler starts it)."""
        first = self.state is TaskState.PENDING
        if first:
            self._go(TaskState.STARTED)
        return first

    def send(self) -> None:
        """Its command is out."""
        self._go(TaskState.SENT)

    def finish(self) -> None:
        self._go(TaskState.DONE)

    @property
    def sent(self) -> bool:
        return self.state is TaskState.SENT

    @property
    def done(self) -> bool:
        return self.state is TaskState.DONE


def goal_tasks(goal: Goal) -> list[Task]:
    """The agenda of ``goal``: its tasks, in order."""
    return [Task(kind) for kind in GOALS[goal]]


def due_after(step: int, cfg: JobConfig) -> list[Task]:
    """What runs after step ``step``'s weights are out, before training goes on: a checkpoint, the
    protocol and held-out evaluations when due (none after the last step: the driver's goals do
    them), and a poll of the control actor."""
    run, every_eval = cfg.run, cfg.eval.every
    due = [Task(TaskKind.CHECKPOINT)] if run.checkpoint_every and step % run.checkpoint_every == 0 else []
    due += [Task(TaskKind.PROTOCOL), Task(TaskKind.EVALUATE)] if every_eval and step % every_eval == 0 else []
    return (due if step < run.steps else []) + [Task(TaskKind.POLL)]
