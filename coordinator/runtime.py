"""The Ray runtime: the scheduler's commands become Ray calls, and finished, failed or late calls
become events (coordinator/events.py). It decides nothing.

Deadlines. An actor runs its calls one at a time, in the order they were made, so a call's clock
starts when the call before it on the same actor finished (or when it was made, if that actor was
idle): a deadline then bounds the call itself, not the queue in front of it. A worker call past its
deadline is reported as ``timed_out`` (the scheduler then has the worker killed and replaced, like
a dead one); a learner rank past its deadline fails the step. A staged push's receive runs on the
worker's "weights" thread, beside its requests, so it has a queue of its own.

Groups. The M learner ranks of a step, and the sends (with, for a collective push, the
receivers) of a push, finish together: one event once all are back. When one member fails, the
others get a few seconds to fail too, so that the rank that died is the one named, not its peers
stuck in a collective with it.

The protocol evaluation (``eval.protocol``): ``protocol`` (recipes/protocol_eval.py, InTraining)
holds the step's encoded benchmarks and results; the runtime sends each unit the scheduler deals,
grades what comes back and writes the table when told.

Clocks. Every learner rank and rollout worker times its own activities (common/actor_time.py)
and sends the snapshot on results that come back anyway (``clock/*`` on a rollout's first episode
and on each rank's step result); the runtime takes it off before the scheduler sees the result,
and ``times.step_metrics()`` turns it into ``time/<actor>/<activity>`` for each step's record.

Background checkpoints (``run.async_checkpoint``): a Checkpoint returns once every learner rank has
handed its state to its writer; the save completes (coordinator.json, ``latest``) when every
rank's marker is there, which ``wait`` checks each time round (CheckpointWritten). One save at a
time: the next one first waits for the one before.

The Ray head. Every few seconds the loop checks that the cluster's GCS still accepts a
connection; if it does not, the job stops with one message (Ray would end this process a minute
later with its own, while the actors answer on for a while).
"""
from __future__ import annotations

import socket
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional

import ray

from common.actor_time import ActorTimes, split_clock
from coordinator import checkpoint
from coordinator import events as ev
from coordinator.actors import Actors, first_line, wait
from coordinator.pool import node_alive
from coordinator.weight_sync import WeightSync

PEER_GRACE_S = 5.0  # how long the other members of a failed group may take to fail too
GCS_PROBE_S = 10.0  # how often the loop checks that the GCS is there


@dataclass
class Group:
    """Calls that finish together: a step's ranks, or a push's sends (and collective receivers)."""

    kind: str  # "train" | "push"
    names: dict[ray.ObjectRef, str]  # member -> "learner rank 0" / "rollout worker 3"
    receivers: dict[ray.ObjectRef, int]  # collective push: a worker's call -> its index
    timeout_s: float
    step: int = 0
    version: int = 0
    staged: bool = False  # a push the receivers stage on their "weights" thread (beside their requests)
    started: float = field(default_factory=time.perf_counter)
    open: set = field(default_factory=set)  # members not back
    results: dict[ray.ObjectRef, Any] = field(default_factory=dict)
    failures: dict[ray.ObjectRef, tuple[str, str]] = field(default_factory=dict)  # outcome, detail
    failed_at: Optional[float] = None
    late: bool = False


@dataclass
class Waiting:
    call: Optional[ev.CallId]  # the scheduler's id; None for a group member or a set-up call
    kind: str  # start | rollout | load | eval | complete | poll | member | setup
    actor: str  # the actor whose calls run in order
    timeout_s: float
    worker: int = -1
    group: Optional[Group] = None
    started: Optional[float] = None  # when the call reached the front of its actor's queue
    unit: int = -1  # the protocol unit of a "complete" call


class RayRuntime:
    def __init__(self, actors: Actors, sync: WeightSync, *, control: Any, output_dir: Any, config: dict[str, Any],
                 start_timeout_s: float, autoscale: bool, protocol: Any = None, async_checkpoint: bool = False) -> None:
        self.actors, self.sync, self.control, self.protocol = actors, sync, control, protocol
        self.output_dir, self.config, self.start_timeout_s, self.autoscale = output_dir, config, start_timeout_s, autoscale
        self.async_checkpoint = async_checkpoint
        self.saving: Optional[checkpoint.PendingSave] = None  # a checkpoint written in the background
        self.times = ActorTimes()  # each actor's own clock (time/<actor>/*)
        self.waiting: dict[ray.ObjectRef, Waiting] = {}  # in the order the calls were made
        self.queues: dict[str, deque[ray.ObjectRef]] = {}
        self.groups: list[Group] = []
        self.nodes: dict[int, Optional[str]] = {i: info.get("node_id") for i, info in
                                                enumerate(actors.info.get("rollouts", []))}
        self.shapes: Optional[dict[str, list[int]]] = None
        self.last_probe = time.perf_counter()

    # ---- commands -------------------------------------------------------------------------------
    def execute(self, command: Any) -> list[Any]:
        """Carry out ``command``; returns the events it produced at once (most produce them later)."""
        pool = self.actors.pool
        if isinstance(command, ev.StartWorker):
            if command.replaces:
                self._forget_actor(command.worker)
            actor = pool.launch(command.worker, command.replaces)
            self._track(actor.ready.remote(), Waiting(command.call, "start", _key(actor), command.timeout_s,
                                                     command.worker))
        elif isinstance(command, ev.RemoveWorker):
            self._forget_actor(command.worker)
            pool.remove(command.worker)
        elif isinstance(command, ev.Generate):
            actor = pool[command.worker]
            self._track(actor.generate.remote(list(command.requests)),
                        Waiting(command.call, "rollout", _key(actor), command.timeout_s, command.worker))
        elif isinstance(command, ev.SetupWorkerPush):
            self._track(self.sync.setup_worker(command.worker),
                        Waiting(None, "setup", _key(pool[command.worker]), self.start_timeout_s, command.worker))
        elif isinstance(command, ev.LoadWeights):
            self._track(self.sync.load(command.worker, command.version),
                        Waiting(command.call, "load", _key(pool[command.worker]), command.timeout_s, command.worker))
        elif isinstance(command, ev.Evaluate):
            actor = pool[command.worker]
            ref = actor.evaluate.remote(command.rows, command.samples_per_prompt, command.seed, command.sampler)
            self._track(ref, Waiting(command.call, "eval", _key(actor), command.timeout_s, command.worker))
        elif isinstance(command, ev.StartProtocol):
            return [ev.ProtocolStarted(*self.protocol.start(command.step))]
        elif isinstance(command, ev.Complete):
            actor = pool[command.worker]
            self._track(actor.complete.remote(*self.protocol.request(command.unit)),
                        Waiting(command.call, "complete", _key(actor), command.timeout_s, command.worker,
                                unit=command.unit))
        elif isinstance(command, ev.FinishProtocol):
            return [ev.ProtocolDone(*self.protocol.finish())]
        elif isinstance(command, ev.Train):
            refs = self.actors.train([e.group for e in command.batch], command.version)
            self._group(Group("train", {ref: f"learner rank {r}" for r, ref in enumerate(refs)}, {},
                              command.timeout_s, step=command.step))
        elif isinstance(command, ev.Push):
            if command.barrier and not command.receivers:  # a broadcast to nobody: nothing to send
                return [ev.PushDone(command.version, 0.0, at=time.perf_counter())]
            learner_calls, worker_calls, staged = self.sync.push(command.version, command.receivers)
            names = {ref: f"learner rank {r}" for r, ref in learner_calls}
            names.update({ref: f"rollout worker {i}" for i, ref in worker_calls})
            receivers = {ref: i for i, ref in worker_calls}
            self._group(Group("push", names, receivers, command.timeout_s, version=command.version, staged=staged))
        elif isinstance(command, ev.Checkpoint):
            return self._save(command)
        elif isinstance(command, ev.PollControl):
            if self.control is None:  # a driver on actors it did not start has none
                return [ev.ControlPolled(command.call, None, self._room())]
            self._track(self.control.poll.remote(command.status),
                        Waiting(command.call, "poll", "control", command.timeout_s))
        else:
            raise TypeError(f"the runtime does not carry out {type(command).__name__}")
        return []

    def _track(self, ref: ray.ObjectRef, waiting: Waiting) -> None:
        queue = self.queues.setdefault(waiting.actor, deque())
        if not queue:
            waiting.started = time.perf_counter()
        queue.append(ref)
        self.waiting[ref] = waiting

    def _group(self, group: Group) -> None:
        self.groups.append(group)
        learners = {name: _key(a) for name, a in ((f"learner rank {r}", a) for r, a in enumerate(self.actors.learners))}
        for ref, name in group.names.items():
            worker = group.receivers.get(ref, -1)
            actor = _key(self.actors.pool[worker]) if worker >= 0 else learners[name]
            if worker >= 0 and group.staged:  # the stage runs on the worker's "weights" thread, beside its queue
                actor += "/weights"
            group.open.add(ref)
            self._track(ref, Waiting(None, "member", actor, group.timeout_s, worker, group))

    def _save(self, command: ev.Checkpoint) -> list[Any]:
        """The learner ranks save (collective), then the buffered groups and the client state; in
        the background, the last two once the ranks' files are durable (``poll_save``)."""
        if self.shapes is None:
            self.shapes = wait([self.actors.learners[0].parameter_shapes.remote()], self.start_timeout_s,
                               "learner rank 0 (parameter shapes)")[0]
        state = {**command.state, "config": self.config, "parameter_shapes": self.shapes}
        args = (self.actors, self.output_dir, command.step, state, command.episodes, self.start_timeout_s)
        if not self.async_checkpoint:
            return [ev.CheckpointDone(str(checkpoint.save(*args)))]
        events = self.finish_save(self.start_timeout_s)  # one save at a time
        self.saving = checkpoint.begin_save(*args)
        return events + [ev.CheckpointDone(str(self.saving.path), background=True)]

    def poll_save(self) -> list[Any]:
        """Complete a background save whose files are all durable (never blocks)."""
        save = self.saving
        if save is None or not save.poll():
            return []
        self.saving = None
        return [ev.CheckpointWritten(str(save.path), time.monotonic() - save.started)]

    def finish_save(self, timeout_s: float) -> list[Any]:
        """Wait at most ``timeout_s`` for a background save's files, then complete it; one still
        unwritten after that stays incomplete (a resume takes the checkpoint before)."""
        save, self.saving = self.saving, None
        if save is None:
            return []
        complete = save.wait(timeout_s)
        return [ev.CheckpointWritten(str(save.path), time.monotonic() - save.started, complete)]

    def _room(self) -> bool:
        return self.autoscale and self.actors.pool.has_room()

    def _forget_actor(self, worker: int) -> None:
        """The worker's process is killed: nothing of it is waited for any more."""
        if worker not in self.actors.pool:
            return
        key = _key(self.actors.pool[worker])
        for ref in [*self.queues.pop(key, ()), *self.queues.pop(key + "/weights", ())]:
            waiting = self.waiting.pop(ref, None)
            if waiting is not None and waiting.group is not None:
                self._member_failed(waiting.group, ref, "died", "its process was replaced")

    # ---- events ---------------------------------------------------------------------------------
    def wait(self) -> list[Any]:
        """Block until a call finishes, fails or passes its deadline; their events, in the order the
        calls were made."""
        events: list[Any] = self.poll_save()
        if not self.waiting:
            return events + [ev.Stalled()]
        refs = list(self.waiting)
        timeout = max(0.0, min(self._deadline(w) for w in self.waiting.values()) - time.perf_counter())
        ray.wait(refs, num_returns=1, timeout=min(timeout, GCS_PROBE_S))
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0])
        for ref in refs:
            if ref in ready and ref in self.waiting:
                events += self._finished(ref, self.waiting.pop(ref))
        now = time.perf_counter()
        for ref, waiting in list(self.waiting.items()):
            if ref in self.waiting and now >= self._deadline(waiting):
                events += self._late(ref, waiting)
        for group in list(self.groups):
            if group.failed_at is not None and now >= group.failed_at + PEER_GRACE_S:
                events += self._settle(group, force=True)
        if now - self.last_probe > GCS_PROBE_S:  # actors may still answer for a while after the head is gone
            self.last_probe = now
            if not gcs_alive():
                raise ev.ActorFailure(
                    f"the Ray cluster's head (GCS at {ray.get_runtime_context().gcs_address}) stopped answering: the "
                    f"job cannot go on. `stabledrl train --resume {self.output_dir}` continues from its last "
                    "checkpoint once the cluster is back")
        return events

    def _deadline(self, waiting: Waiting) -> float:
        group = waiting.group
        grace = group.failed_at + PEER_GRACE_S if group is not None and group.failed_at is not None else float("inf")
        return min(grace, float("inf") if waiting.started is None else waiting.started + waiting.timeout_s)

    def _dequeue(self, ref: ray.ObjectRef, waiting: Waiting) -> None:
        queue = self.queues.get(waiting.actor)
        if queue is None or ref not in queue:
            return
        queue.remove(ref)
        if queue and queue[0] in self.waiting and self.waiting[queue[0]].started is None:
            self.waiting[queue[0]].started = time.perf_counter()

    def _finished(self, ref: ray.ObjectRef, waiting: Waiting) -> list[Any]:
        self._dequeue(ref, waiting)
        try:
            value = ray.get(ref)
        except ray.exceptions.RayActorError as e:
            return self._failed(waiting, ref, "died", first_line(e))
        except ray.exceptions.RayError as e:
            return self._failed(waiting, ref, "raised", first_line(getattr(e, "cause", None) or e))
        if waiting.group is not None:
            waiting.group.results[ref] = value
            waiting.group.open.discard(ref)
            return self._settle(waiting.group)
        if waiting.kind == "start":
            self.nodes[waiting.worker] = value.get("node_id")
            return [ev.WorkerStarted(waiting.call, value)]
        if waiting.kind == "rollout":
            if value:  # the worker's clock rides on the first episode
                value[0].stats, clock = split_clock(value[0].stats)
                self.times.update(f"rollout{waiting.worker}", clock)
            return [ev.RolloutDone(waiting.call, value)]
        if waiting.kind == "load":
            return [ev.WeightsLoaded(waiting.call, value)]
        if waiting.kind == "eval":
            return [ev.EvalDone(waiting.call, value[0], value[1])]
        if waiting.kind == "complete":
            self.protocol.graded(waiting.unit, value)  # appended to results.jsonl at once
            return [ev.UnitDone(waiting.call)]
        if waiting.kind == "poll":
            return [ev.ControlPolled(waiting.call, value, self._room())]
        return []  # a set-up call: a failure shows in the load queued behind it

    def _failed(self, waiting: Waiting, ref: ray.ObjectRef, failure: str, detail: str) -> list[Any]:
        if waiting.group is not None:
            return self._member_failed(waiting.group, ref, failure, detail)
        if waiting.call is None:
            return []
        alive = failure != "died" or node_alive(self.nodes.get(waiting.worker))
        placeable = alive or self.actors.pool.can_place(self.actors.groups)
        return [ev.CallFailed(waiting.call, failure, detail, node_alive=alive, placeable=placeable)]

    def _member_failed(self, group: Group, ref: ray.ObjectRef, failure: str, detail: str) -> list[Any]:
        group.failures[ref] = (failure, detail)
        group.open.discard(ref)
        group.failed_at = group.failed_at or time.perf_counter()
        return self._settle(group)

    def _late(self, ref: ray.ObjectRef, waiting: Waiting) -> list[Any]:
        if waiting.group is not None:  # a member past its deadline: the group fails now, the late one running
            waiting.group.late = True
            return self._settle(waiting.group, force=True)
        del self.waiting[ref]
        self._dequeue(ref, waiting)
        if waiting.call is None:
            return []
        detail = f"{waiting.timeout_s:.0f} s"
        if waiting.kind == "start":
            detail = f"the cluster has {ray.available_resources()} free"
        return [ev.CallFailed(waiting.call, "timed_out", detail)]

    def _settle(self, group: Group, force: bool = False) -> list[Any]:
        """The group's event once every member is back (or, ``force``, now: the open ones running)."""
        if group.open and not force or group not in self.groups:
            return []
        running = [ref for ref in group.names if ref in group.open]
        for ref in running:
            waiting = self.waiting.pop(ref, None)
            if waiting is not None:
                self._dequeue(ref, waiting)
        self.groups.remove(group)
        now = time.perf_counter()
        if not group.failures and not running:
            if group.kind == "train":
                results = []
                for rank, ref in enumerate(group.names):  # each rank's clock rides on its result
                    result, clock = split_clock(group.results[ref])
                    self.times.update(f"learner{rank}", clock)
                    results.append(result)
                return [ev.StepDone(group.step, results, now - group.started, at=now)]
            return [ev.PushDone(group.version, now - group.started, at=now, staged=group.staged)]
        if group.kind == "push" and group.receivers:  # collective: the scheduler may push again without the dead
            self.sync.failed()
            died = tuple(i for r, i in group.receivers.items() if group.failures.get(r, ("",))[0] == "died")
            problems = [f"{group.names[r]} {o}: {d}" for r, (o, d) in group.failures.items()]
            problems += [f"{group.names[r]} still running after {group.timeout_s:.0f} s" for r in running if group.late]
            return [ev.PushFailed(group.version, died, "; ".join(problems))]
        what = f"step {group.step}" if group.kind == "train" else f"weights version {group.version}"
        rank = lambda ref: int(group.names[ref].rsplit(" ", 1)[1])  # noqa: E731
        ranks = [ev.RankOutcome(rank(r), *group.failures[r]) for r in group.names if r in group.failures]
        ranks += [ev.RankOutcome(rank(r), "running") for r in running]
        return [ev.LearnerFailed(what, ranks, group.timeout_s if group.late else None)]

    # ---- the end --------------------------------------------------------------------------------
    def export(self, directory: Any) -> None:
        wait(self.actors.call_learners("export", str(directory)), self.start_timeout_s,
             [f"learner rank {r} (export)" for r in range(len(self.actors.learners))])

    def close(self) -> None:
        """Stop every actor and release every reservation (skipped when the cluster's head is gone)."""
        self.waiting.clear()
        if gcs_alive():
            self.actors.shutdown()
            if self.control is not None:
                ray.kill(self.control)


def _key(actor: Any) -> str:
    return actor._actor_id.hex()


def gcs_alive(address: Optional[str] = None, timeout_s: float = 2.0) -> bool:
    """Whether the Ray cluster's GCS (``address``, default this process's) accepts a connection;
    True when this process is not on Ray."""
    if address is None and not ray.is_initialized():
        return True
    host, _, port = (address or ray.get_runtime_context().gcs_address).rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False
