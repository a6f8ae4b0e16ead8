"""What the scheduler knows, as one value: ``Scheduler.snapshot()`` returns it, frozen, so the
driver and the tests read the job's state without reaching into the state machines that own it
(and cannot change it by mistake). No Ray here.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Optional

from stabledrl.common.tasks.stream import DataCursor
from stabledrl.coordinator.decisions.held_out import HeldOutResult


@dataclass(frozen=True)
class WorkerView:
    """A rollout worker as the fleet books it (coordinator/decisions/fleet.py)."""

    index: int
    state: str  # starting | syncing | active | retiring
    restarts: int
    version: int  # the weights version it acknowledged


@dataclass(frozen=True)
class SchedulerSnapshot:
    step: int
    version: int  # the learner's weights version
    next_uid: int  # the uid the next new request gets
    requeued: tuple[int, ...]  # uids waiting to be sampled again (a lost worker's), in the order they go out
    outstanding: tuple[int, ...]  # uids admitted and not back: being sampled or re-queued
    buffered: tuple[int, ...]  # uids whose groups wait in the buffer
    delivered: frozenset[int]  # uids ever delivered to the buffer (exactly-once accounting)
    duplicates: int  # deliveries of a uid already delivered (ignored)
    dropped_total: int  # groups dropped as too stale
    cursor: DataCursor  # the prompt stream's position
    reward_calls: Mapping[str, float]  # reward_calls/<outcome>, counted over delivered requests
    reward_totals: Mapping[str, float]  # the same as metrics.jsonl records them (rollout/reward_calls/*)
    counts: Mapping[str, int]  # faults/* and elastic/*
    worker_metrics: Mapping[str, float]  # rollout/workers, rollout/worker_version_min and the counts
    workers: tuple[WorkerView, ...]  # by index
    last_eval: Optional[HeldOutResult]  # the last held-out evaluation (None: none yet, or no held-out rows)
    evaluations: tuple[HeldOutResult, ...]  # every held-out evaluation of this process, in order

    @property
    def worker_versions(self) -> list[int]:
        """The weights version each active worker acknowledged, by index."""
        return [w.version for w in self.workers if w.state == "active"]


def frozen(mapping: Mapping) -> Mapping:
    """A read-only copy (compares equal to the dict it was made from)."""
    return MappingProxyType(dict(mapping))
