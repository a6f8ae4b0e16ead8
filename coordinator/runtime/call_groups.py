"""Calls that finish together: the learner ranks of a step, or the sends (and, for a collective
push, the receives) of a weight push. The runtime (coordinator/runtime/executor.py) waits for every member;
``outcome`` turns the members' answers into the group's one event. When one member fails, the
others get a few seconds to fail too, so that the rank that died is the one named, not its peers
stuck in a collective with it. No Ray calls here (the members are object references).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

from stabledrl.coordinator.decisions import events as ev

PEER_GRACE_S = 5.0  # how long the other members of a failed group may take to fail too


@dataclass
class CallGroup:
    """Members that finish together; ``outcome`` (each kind of group its own) is their one event."""

    names: dict[Any, str]  # member (an object reference) -> "learner rank 0" / "rollout worker 3"
    receivers: dict[Any, int]  # collective push: a worker's call -> its index
    timeout_s: float
    started: float = field(default_factory=time.perf_counter)
    open: set = field(default_factory=set)  # members not back
    results: dict[Any, Any] = field(default_factory=dict)
    failures: dict[Any, tuple[str, str]] = field(default_factory=dict)  # outcome, detail
    failed_at: Optional[float] = None
    late: bool = False
    staged: bool = False  # a push the receivers stage on their "weights" thread (beside their requests)

    @property
    def grace_until(self) -> float:
        return self.failed_at + PEER_GRACE_S if self.failed_at is not None else float("inf")

    def outcome(self, running: list[Any], now: float) -> ev.Event:
        """The group's event once its members are back (``running``: those still out, when it is
        settled early: a failure's grace is over, or a member was late)."""
        raise NotImplementedError

    def _learner_failed(self, what: str, running: list[Any]) -> ev.LearnerFailed:
        rank = lambda ref: int(self.names[ref].rsplit(" ", 1)[1])  # noqa: E731
        ranks = [ev.RankOutcome(rank(r), *self.failures[r]) for r in self.names if r in self.failures]
        ranks += [ev.RankOutcome(rank(r), "running") for r in running]
        return ev.LearnerFailed(what, ranks, self.timeout_s if self.late else None)


@dataclass
class StepGroup(CallGroup):
    """The learner ranks' ``train`` of one step; their results are StepResults (common/types.py)."""

    step: int = 0

    def outcome(self, running: list[Any], now: float) -> ev.Event:
        if self.failures or running:
            return self._learner_failed(f"step {self.step}", running)
        results = [self.results[ref] for ref in self.names]  # rank order
        return ev.StepDone(self.step, [r.metrics for r in results], now - self.started, at=now)


@dataclass
class PushGroup(CallGroup):
    """A weight push: the learner ranks' sends and, for a collective push, the receivers' receives."""

    version: int = 0

    def outcome(self, running: list[Any], now: float) -> ev.Event:
        if not self.failures and not running:
            return ev.PushDone(self.version, now - self.started, at=now, staged=self.staged)
        if self.receivers:  # collective: the scheduler may push again without the dead
            died = tuple(i for r, i in self.receivers.items() if self.failures.get(r, ("",))[0] == "died")
            problems = [f"{self.names[r]} {o}: {d}" for r, (o, d) in self.failures.items()]
            problems += [f"{self.names[r]} still running after {self.timeout_s:.0f} s" for r in running if self.late]
            return ev.PushFailed(self.version, died, "; ".join(problems))
        return self._learner_failed(f"weights version {self.version}", running)
