"""The rollout workers' lifecycle and fault policy: starts, losses (replace, drop, give up),
resizes (`stabledrl scale`, autoscale) and retirements, with their counters (faults/*, elastic/*).
The worker book itself (states, incarnations, calls) is coordinator/decisions/fleet.py. A piece of the
scheduler (coordinator/decisions/scheduler.py); no Ray.

A lost worker: ``lost`` forgets its calls and returns its requests (Admission re-queues them; the
scheduler hands its evaluation parts back too), then, by ``Fleet.loss_action``, removes it (it was
retiring), drops it (its node left and ``rollout.min_workers`` remain), stops the job (its
restarts are used up), or replaces it in place.
"""
from __future__ import annotations

from typing import Optional

from stabledrl.common.config.job import JobConfig
from stabledrl.common.types import PromptRequest
from stabledrl.coordinator.decisions import events as ev
from stabledrl.coordinator.decisions.events import resume_hint
from stabledrl.coordinator.decisions.fleet import Call, Fleet, WorkerState

COUNTS = ("faults/rollout_worker_deaths", "faults/rollout_worker_hangs", "faults/rollout_workers_replaced",
          "faults/rollout_workers_dropped", "elastic/workers_added", "elastic/workers_retired")


class FleetPolicy:
    def __init__(self, cfg: JobConfig, fleet: Fleet) -> None:
        self.cfg, self.fleet = cfg, fleet
        self.counts = dict.fromkeys(COUNTS, 0)

    def job_started(self, event: ev.JobStarted) -> None:
        for index, info in sorted(event.workers.items()):
            worker = self.fleet.add()
            assert worker.index == index, "the job's first workers are numbered 0..N-1"
            self.fleet.came_up(worker, info)
            self.fleet.move(worker, "active")

    def metrics(self) -> dict[str, float]:
        versions = self.fleet.versions()
        return {"rollout/workers": float(len(self.fleet.serving())),
                "rollout/worker_version_min": float(min(versions)) if versions else -1.0,
                **{k: float(v) for k, v in self.counts.items()}}

    def started(self, event: ev.WorkerStarted) -> tuple[Optional[WorkerState], list[ev.Command]]:
        """(the worker now up, or None: a late answer, or it was retiring and is removed; commands)."""
        taken = self.fleet.take(event.call)
        if taken is None or taken[1] is None:
            return None, []
        worker = taken[1]
        self.fleet.came_up(worker, event.info)
        if worker.state == "retiring":
            return None, self._remove(worker)
        return worker, []

    def call_failed(self, event: ev.CallFailed) -> tuple[Optional[WorkerState], Optional[Call], list[ev.Command]]:
        """A worker call failed or was late: (the worker lost with ``call``, for ``lost``, or None;
        None; the commands when it is not a loss: a log, a stop, a drop)."""
        taken = self.fleet.take(event.call)
        if taken is None:
            return None, None, []  # a call of a process already replaced (its loss was handled)
        call, worker = taken
        if call.kind == "poll":
            return None, None, [ev.Log(f"control actor did not answer ({event.detail}); `stabledrl scale` is "
                                       "unavailable")]
        if worker is None:
            return None, None, []
        if event.failure == "raised":
            return None, None, [ev.Stop(f"{call.what} failed: {event.detail}")]
        if call.kind == "start" and event.failure == "timed_out":
            why = (f"did not start within cluster.start_timeout_s = {self.cfg.cluster.start_timeout_s:.0f} s "
                   f"({event.detail})")
            if len(self.fleet.live()) - 1 < self.fleet.min_workers:
                return None, None, [ev.Stop(f"{call.what} {why}")]
            return None, None, self._drop(worker, why)
        return worker, call, []

    def lost(self, worker: WorkerState, failure: str, detail: str, node_alive: bool,
             first: Optional[Call] = None, placeable: bool = True) -> tuple[list[PromptRequest], list[ev.Command]]:
        """Forget the worker's calls, then replace it, drop it (its node left), remove it (it was
        retiring) or stop the job (its restarts are used up, or it must be replaced and no node left
        could hold it: ``placeable`` False). Returns (its requests, commands)."""
        calls = ([first] if first is not None else []) + [c for _, c in self.fleet.forget(worker.index)]
        requests = [r for c in calls for r in c.requests]
        hung = failure == "timed_out"
        self.counts["faults/rollout_worker_hangs" if hung else "faults/rollout_worker_deaths"] += 1
        field = "weights.timeout_s" if first is not None and first.kind == "load" else "rollout.request_timeout_s"
        what, reason = ("hung", f"no answer within {detail} ({field}); killed") if hung else ("died", detail)
        uids = ", ".join(str(r.uid) for r in requests) or "none"
        action = self.fleet.loss_action(worker, node_alive)
        if action == "remove":
            return requests, self._remove(worker) + [
                ev.Log(f"{worker.name} {what} while retiring ({reason}); prompts {uids} re-queued")]
        if action == "drop":
            return requests, self._drop(worker, f"lost with its node ({reason}); prompts {uids} re-queued")
        if action == "replace" and not placeable:
            return requests, [ev.Stop(
                f"{worker.name} was lost with its node and no node left in the cluster can hold a rollout worker "
                f"(cluster.rollout: {self.cfg.cluster.rollout.num_cpus} CPU, {self.cfg.cluster.rollout.num_gpus} GPU "
                f"each); fewer than rollout.min_workers = {self.fleet.min_workers} remain. The job stops; add a node, "
                f"then {resume_hint(self.cfg.run.output_dir)}")]
        if action == "give_up":
            return requests, [ev.Stop(
                f"{worker.name} {what} {worker.restarts + 1} times, the last time: {reason}; giving up "
                f"(rollout.max_restarts = {self.fleet.max_restarts}). The job stops; "
                f"{resume_hint(self.cfg.run.output_dir)}")]
        new = self.fleet.replace(worker)
        self.counts["faults/rollout_workers_replaced"] += 1
        where = "" if node_alive else (f" (its node left: it waits at most cluster.start_timeout_s = "
                                       f"{self.cfg.cluster.start_timeout_s:.0f} s for room on another node)")
        return requests, self._start(new, True, f"{new.name} (replacement {new.restarts})") + [
            ev.Log(f"{worker.name} {what} ({reason}); prompts {uids} re-queued; replacement {new.restarts} of at "
                   f"most {self.fleet.max_restarts} starting{where}")]

    def control_polled(self, event: ev.ControlPolled) -> list[ev.Command]:
        """Between steps: the size `stabledrl scale` asked for, or (autoscale) room for one more."""
        self.fleet.take(event.call)
        out: list[ev.Command] = []
        if event.requested is not None and self.fleet.autoscale:
            out.append(ev.Log("autoscale off: `stabledrl scale` set the size"))
        added, retiring = self.fleet.resize(event.requested, event.room)
        for n, worker in enumerate(added, start=len(self.fleet.live()) - len(added) + 1):
            out += self._start(worker, False, f"{worker.name} (added)")
            self.counts["elastic/workers_added"] += 1
            out.append(ev.Log(f"{worker.name} starting ({n} of {self.fleet.target} workers)"))
        out += [ev.Log(f"{w.name} retiring ({self.fleet.target} workers requested)") for w in retiring]
        return out

    def retire_idle(self, receivers: dict[int, int]) -> list[ev.Command]:
        """Remove retiring workers with no call out (and not receiving a push)."""
        out: list[ev.Command] = []
        for worker in [w for w in self.fleet.workers.values() if w.state == "retiring"]:
            if worker.index not in receivers and not self.fleet.busy(worker.index):
                out += self._remove(worker)
                self.counts["elastic/workers_retired"] += 1
                out.append(ev.Log(f"{worker.name} retired; {len(self.fleet.live())} workers"))
        return out

    def _start(self, worker: WorkerState, replaces: bool, what: str) -> list[ev.Command]:
        call = self.fleet.call("start", what, worker)
        return [ev.StartWorker(call, worker.index, replaces, self.cfg.cluster.start_timeout_s)]

    def _drop(self, worker: WorkerState, why: str) -> list[ev.Command]:
        out = self._remove(worker)
        self.fleet.target = min(self.fleet.target, len(self.fleet.alive()))  # the cluster shrank
        self.counts["faults/rollout_workers_dropped"] += 1
        return out + [ev.Log(f"{worker.name} {why}; continuing with {len(self.fleet.alive())} workers")]

    def _remove(self, worker: WorkerState) -> list[ev.Command]:
        self.fleet.remove(worker)
        return [ev.RemoveWorker(worker.index)]
