"""The calls the runtime waits for, queued per actor, each with its deadline.

An actor runs its calls one at a time, in the order they were made, so a call's clock starts when
the call before it on the same actor finished (or when it was made, if that actor was idle): a
deadline then bounds the call itself, not the queue in front of it. A staged push's receive runs
on the worker's "weights" thread, beside its requests, so it has a queue of its own
(``<actor>/weights``). A member of a call group (coordinator/runtime/call_groups.py) whose group failed
is late once the group's grace is over.

Each call carries its own answer: ``answer`` turns the call's value into the events it means
(a rollout's RolloutResult into RolloutDone, a start's WorkerInfo into WorkerStarted, ...), built
by the runtime where it makes the call, so nothing reads what kind of call came back.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Optional

from stabledrl.coordinator.runtime.call_groups import CallGroup
from stabledrl.coordinator.decisions.commands import CallId
from stabledrl.coordinator.decisions.events import Event


@dataclass
class Waiting:
    call: Optional[CallId]  # the scheduler's id; None for a group member or a set-up call
    actor: str  # the actor whose calls run in order
    timeout_s: float
    answer: Callable[[Any], list[Event]]  # the call's value -> the events it means
    worker: int = -1
    group: Optional[CallGroup] = None
    started: Optional[float] = None  # when the call reached the front of its actor's queue
    late: Optional[Callable[[], str]] = None  # what a CallFailed past the deadline says (None: the timeout)

    @property
    def deadline(self) -> float:
        grace = self.group.grace_until if self.group is not None else float("inf")
        return min(grace, float("inf") if self.started is None else self.started + self.timeout_s)


class ActorCalls:
    def __init__(self) -> None:
        self.waiting: dict[Any, Waiting] = {}  # object reference -> its call, in the order the calls were made
        self.queues: dict[str, deque] = {}  # actor -> its calls' references, in order

    def __bool__(self) -> bool:
        return bool(self.waiting)

    def track(self, ref: Any, waiting: Waiting) -> None:
        queue = self.queues.setdefault(waiting.actor, deque())
        if not queue:
            waiting.started = time.perf_counter()
        queue.append(ref)
        self.waiting[ref] = waiting

    def next_deadline(self) -> float:
        return min(w.deadline for w in self.waiting.values())

    def pop(self, ref: Any) -> Optional[Waiting]:
        """Stop waiting for ``ref`` (back, or given up); the next call on its actor starts its clock."""
        waiting = self.waiting.pop(ref, None)
        queue = self.queues.get(waiting.actor) if waiting is not None else None
        if queue is None or ref not in queue:
            return waiting
        queue.remove(ref)
        if queue and queue[0] in self.waiting and self.waiting[queue[0]].started is None:
            self.waiting[queue[0]].started = time.perf_counter()
        return waiting

    def forget(self, actor: str) -> list[tuple[Any, Waiting]]:
        """Every call of ``actor`` (its process is gone), on both of its queues."""
        refs = [*self.queues.pop(actor, ()), *self.queues.pop(actor + "/weights", ())]
        return [(ref, w) for ref, w in ((ref, self.waiting.pop(ref, None)) for ref in refs) if w is not None]
