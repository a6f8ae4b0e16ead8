"""The calls the coordinator's loop waits for: each named, timed, and tied to its worker.

Every cross-actor call the loop issues (a rollout request, a learner step, a weight
acknowledgement, a worker's start) is registered here with what it is; ``wait_any`` returns the
finished ones and the late ones, each late call judged by the timeout of its kind, so an error
can always say what was waited for and for how long. When a worker dies, ``pop_worker`` hands
back its calls, so that its requests are re-queued and nothing else waits on it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import ray

from rollout.workflow import PromptRequest


@dataclass
class Pending:
    """A call the loop waits for; ``what`` names it when it times out or fails."""

    kind: str  # "rollout" | "train" | "ack" | "start"
    what: str
    since: float = field(default_factory=time.perf_counter)
    worker: int = -1  # the rollout worker's index (rollout, ack, start)
    incarnation: int = 0  # which process of that index (its restarts when the call was made)
    requests: tuple[PromptRequest, ...] = ()


class Inflight:
    def __init__(self, timeouts: dict[str, float]) -> None:
        self.timeouts = timeouts  # seconds per kind
        self.jobs: dict[ray.ObjectRef, Pending] = {}

    def __len__(self) -> int:
        return len(self.jobs)

    def __contains__(self, ref: ray.ObjectRef) -> bool:
        return ref in self.jobs

    def __iter__(self) -> Iterator[Pending]:
        return iter(self.jobs.values())

    def add(self, ref: ray.ObjectRef, job: Pending) -> None:
        self.jobs[ref] = job

    def of_worker(self, index: int) -> list[Pending]:
        return [j for j in self.jobs.values() if j.worker == index]

    def pop_worker(self, index: int) -> list[Pending]:
        """Forget every call of worker ``index`` (it died); returns them."""
        refs = [r for r, j in self.jobs.items() if j.worker == index]
        return [self.jobs.pop(r) for r in refs]

    def queued(self, index: int) -> int:
        return sum(1 for j in self.jobs.values() if j.kind == "rollout" and j.worker == index)

    def requests(self) -> list[PromptRequest]:
        return [r for j in self.jobs.values() if j.kind == "rollout" for r in j.requests]

    def describe(self, jobs: list[Pending]) -> str:
        now = time.perf_counter()
        return "; ".join(f"{j.what} for {now - j.since:.0f} s" for j in jobs)

    def wait_any(self) -> tuple[list[tuple[ray.ObjectRef, Pending]], list[tuple[ray.ObjectRef, Pending]]]:
        """(finished calls, late calls): blocks until a call finishes or the first deadline passes."""
        now = time.perf_counter()
        deadline = min(j.since + self.timeouts[j.kind] for j in self.jobs.values())
        ray.wait(list(self.jobs), num_returns=1, timeout=max(0.0, deadline - now))
        ready, _ = ray.wait(list(self.jobs), num_returns=len(self.jobs), timeout=0)
        ready_set = set(ready)
        now = time.perf_counter()
        late = [(r, j) for r, j in self.jobs.items() if r not in ready_set and now - j.since > self.timeouts[j.kind]]
        return [(r, self.jobs.pop(r)) for r in ready], late
