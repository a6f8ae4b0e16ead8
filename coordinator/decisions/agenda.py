"""The scheduler's agenda (coordinator/decisions/scheduler.py): the goals the driver asks for and their tasks.

Goals. The driver asks for one goal at a time (``Scheduler.begin``): evaluate (``eval.protocol``'s
benchmarks if set, then the held-out rows), train (to ``run.steps``), drain (let admitted rollouts
land), checkpoint, restore (push restored weights). A goal is an agenda of tasks; the task at its
head decides what may happen now. While ``train`` is at the head, rollouts are admitted up to the
staleness bound and a batch is trained as soon as the buffer holds one; a finished step puts
``push`` and ``finish`` in front of it (``finish`` records the step and adds what ``due_after``
names: ``checkpoint``, ``protocol``, ``evaluate`` and ``poll`` when they are due), so nothing is
admitted between a step's end and its weights being out.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from stabledrl.common.config.job import JobConfig

Goal = Literal["evaluate", "train", "drain", "checkpoint", "restore"]
GOALS: dict[str, tuple[str, ...]] = {"restore": ("push", "drain"), "train": ("train",), "drain": ("drain",),
                                     "evaluate": ("protocol", "evaluate"), "checkpoint": ("checkpoint",)}


@dataclass
class Task:
    name: str  # train | push | finish | checkpoint | protocol | evaluate | poll | drain
    started: bool = False
    sent: bool = False  # its command is out (checkpoint)
    done: bool = False


def goal_tasks(goal: Goal) -> list[Task]:
    """The agenda of ``goal``: its tasks, in order."""
    return [Task(name) for name in GOALS[goal]]


def due_after(step: int, cfg: JobConfig) -> list[Task]:
    """What runs after step ``step``'s weights are out, before training goes on: a checkpoint, the
    protocol and held-out evaluations when due (none after the last step: the driver's goals do
    them), and a poll of the control actor."""
    run, every_eval = cfg.run, cfg.eval.every
    due = [Task("checkpoint")] if run.checkpoint_every and step % run.checkpoint_every == 0 else []
    due += [Task("protocol"), Task("evaluate")] if every_eval and step % every_eval == 0 else []
    return (due if step < run.steps else []) + [Task("poll")]
