"""Weight versions on the rollout workers: the push in flight, which version each worker holds, and
what a worker that starts later loads. A piece of the scheduler (coordinator/decisions/scheduler.py); no Ray.

Object store: ``start`` sends Push (learner rank 0 puts the weights once) and a LoadWeights of
that version to every active worker, queued behind its requests; a worker that starts later sets
up its end and loads the newest version. Collective (``barrier``): every active or syncing worker
is a receiver; the scheduler sends them no requests until PushDone (``held``); a receiver that
died is replaced and the push repeated without it; with staging, PushDone is followed by a
LoadWeights on each receiver, which swaps the staged copy in, in order with its requests.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from stabledrl.coordinator.decisions import events as ev
from stabledrl.coordinator.decisions.agenda import Task
from stabledrl.coordinator.decisions.fleet import Fleet, WorkerState


@dataclass
class PushInFlight:
    version: int
    receivers: dict[int, int]  # worker index -> incarnation (collective push)
    task: Optional[Task] = None  # the agenda task waiting for it; None: a push of its own, to bring syncing workers in


class WeightVersions:
    def __init__(self, fleet: Fleet, *, collective: bool, timeout_s: float) -> None:
        self.fleet, self.collective, self.timeout_s = fleet, collective, timeout_s
        self.push: Optional[PushInFlight] = None
        self.latest: Optional[int] = None  # newest version pushed through the object store (a new worker loads it)

    def held(self) -> dict[int, int]:
        """Workers that get no requests now: the receivers of a collective push still out."""
        return self.push.receivers if self.push is not None and self.collective else {}

    def receivers(self) -> dict[int, int]:
        return self.push.receivers if self.push is not None else {}

    def start(self, version: int, task: Optional[Task] = None) -> list[ev.Command]:
        """Push ``version`` to every worker (object store: each then loads it; collective: to every
        active or syncing worker at once)."""
        if not self.collective:
            self.push = PushInFlight(version, {}, task)
            out: list[ev.Command] = [ev.Push(version, (), False, self.timeout_s)]
            for worker in self.fleet.active():
                out += self.load(worker, version)
            return out
        targets = sorted((w for w in self.fleet.workers.values() if w.state in ("active", "syncing")),
                         key=lambda w: w.index)
        self.push = PushInFlight(version, {w.index: w.restarts for w in targets}, task)
        return [ev.Push(version, tuple(w.index for w in targets), True, 10 * self.timeout_s)]

    def load(self, worker: WorkerState, version: int) -> list[ev.Command]:
        call = self.fleet.call("load", f"{worker.name} (weights version {version})", worker)
        return [ev.LoadWeights(call, worker.index, version, 2 * self.timeout_s)]

    def done(self, event: ev.PushDone) -> tuple[PushInFlight, list[ev.Command]]:
        """The push is over: every receiver still of the incarnation it was sent to holds the
        version (staged: a LoadWeights applies it). Returns the push and the commands."""
        push, self.push = self.push, None
        out: list[ev.Command] = []
        for index, incarnation in push.receivers.items():
            worker = self.fleet.get(index)
            if worker is not None and worker.restarts == incarnation:
                if worker.state == "syncing":
                    self.fleet.move(worker, "active")
                if event.staged:  # received beside its running request: applied in order with its requests
                    out += self.load(worker, event.version)
                else:
                    self.fleet.holds(worker, event.version)
        self.latest = event.version if not self.collective else self.latest
        return push, out

    def failed(self, event: ev.PushFailed) -> tuple[PushInFlight, list[WorkerState]]:
        """A collective push failed: (the push, the receivers of it whose processes died)."""
        push, self.push = self.push, None
        died = [w for w in (self.fleet.get(i) for i in event.died)
                if w is not None and w.restarts == push.receivers.get(w.index)]
        return push, died

    def loaded(self, event: ev.WeightsLoaded) -> None:
        taken = self.fleet.take(event.call)
        if taken is not None and taken[1] is not None:
            self.fleet.holds(taken[1], event.version)

    def join(self, worker: WorkerState) -> tuple[list[ev.Command], str]:
        """A worker that started later: (its commands, what weights it gets, in words). Collective:
        it waits, syncing, for the next push (the group is rebuilt with it); object store: it sets
        up its end and loads the newest version (a push still out: that one)."""
        if self.collective:
            self.fleet.move(worker, "syncing")
            return [], "joins the next weight push"
        out: list[ev.Command] = [ev.SetupWorkerPush(worker.index)]  # runs before the load below
        newest = self.push.version if self.push is not None else self.latest
        if newest is not None:
            out += self.load(worker, newest)
        self.fleet.move(worker, "active")
        return out, f"weights version {newest}" if newest is not None else "initial weights"

    def sync_needed(self) -> bool:
        """Collective: workers wait, syncing, for the next push; with none active and no push out,
        one is needed now, or nothing could run again."""
        if not self.collective or self.push is not None:
            return False
        return not self.fleet.active() and any(w.state == "syncing" for w in self.fleet.workers.values())
