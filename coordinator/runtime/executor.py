"""The Ray runtime: the scheduler's commands become Ray calls, and finished, failed or late calls
become events (coordinator/decisions/events.py). It decides nothing.

Deadlines (coordinator/runtime/actor_calls.py): an actor's calls run in order, so a call's clock starts
when the one before it finished. A worker call past its deadline is reported as ``timed_out`` (the
scheduler then has the worker killed and replaced, like a dead one); a learner rank past its
deadline fails the step. Groups (coordinator/runtime/call_groups.py): the M learner ranks of a step, and
the sends (with, for a collective push, the receivers) of a push, finish together, one event once
all are back.

The protocol evaluation (``eval.protocol``): ``protocol``, a ProtocolRunner the command layer passes
in (coordinator/decisions/commands.py; stabledrl/evaluation/protocol.py's InTraining), holds the step's encoded
benchmarks and results; the runtime sends each unit the scheduler deals, has it graded as it comes
back, and has the table written when told.

Clocks. Every learner rank and rollout worker times its own activities (common/actor_time.py)
and sends the snapshot with results that come back anyway (a RolloutResult's and a StepResult's
``clock``, common/types.py); the runtime keeps it, and ``times.step_metrics()`` turns it into
``time/<actor>/<activity>`` for each step's record.

Background checkpoints (``run.async_checkpoint``): a Checkpoint returns once every learner rank has
handed its state to its writer; the save completes (coordinator.json, ``latest``) when every
rank's marker is there, which ``wait`` checks each time round (CheckpointWritten). One save at a
time: the next one first waits for the one before.

The Ray head. Every few seconds the loop checks that the cluster's GCS still accepts a
connection (``gcs_alive``, coordinator/runtime/pool.py); if it does not, the job stops with one message
(Ray would end this process a minute later with its own, while the actors answer on for a while).
"""
from __future__ import annotations

import dataclasses
import time
from functools import partial
from typing import Any, Optional

import ray
from typing_extensions import assert_never  # typing.assert_never from Python 3.11 (this runs on 3.10)

from stabledrl.common.actor_time import ActorTimes
from stabledrl.common.types import EvalResult, RolloutResult, WorkerInfo
from stabledrl.coordinator.runtime import checkpoint
from stabledrl.coordinator.decisions import events as ev
from stabledrl.coordinator.runtime.actors import Actors, first_line, wait
from stabledrl.coordinator.runtime.actor_calls import ActorCalls, Waiting
from stabledrl.coordinator.runtime.call_groups import CallGroup, PushGroup, StepGroup
from stabledrl.coordinator.runtime.pool import gcs_alive, node_alive
from stabledrl.coordinator.runtime.weight_sync import WeightSync

GCS_PROBE_S = 10.0  # how often the loop checks that the GCS is there


class RayRuntime:
    def __init__(self, actors: Actors, sync: WeightSync, *, control: Any, output_dir: Any, config: dict[str, Any],
                 start_timeout_s: float, autoscale: bool, protocol: Any = None, async_checkpoint: bool = False) -> None:
        self.actors, self.sync, self.control, self.protocol = actors, sync, control, protocol
        self.output_dir, self.config, self.start_timeout_s, self.autoscale = (
            output_dir,
            config,
            start_timeout_s,
            autoscale,
        )
        self.async_checkpoint = async_checkpoint
        self.saving: Optional[checkpoint.PendingSave] = None  # a checkpoint written in the background
        self.times = ActorTimes()  # each actor's own clock (time/<actor>/*)
        self.calls = ActorCalls()  # every call waited for, queued per actor (deadlines)
        self.groups: list[CallGroup] = []
        self.nodes: dict[int, Optional[str]] = {i: info.get("node_id") for i, info in
                                                enumerate(actors.info.get("rollouts", []))}
        self.shapes: Optional[dict[str, list[int]]] = None
        self.last_probe = time.perf_counter()

    # ---- commands -------------------------------------------------------------------------------
    def execute(self, command: ev.RuntimeCommand) -> list[ev.Event]:
        """Carry out ``command``; returns the events it produced at once (most produce them later)."""
        pool = self.actors.pool
        match command:
            case ev.StartWorker(call, worker, replaces, timeout_s):
                if replaces:
                    self._forget_actor(worker)
                actor = pool.launch(worker, replaces)
                self.calls.track(actor.ready.remote(), Waiting(call, _key(actor), timeout_s,
                                                               partial(self._started, call, worker), worker,
                                                               late=self._free_resources))
            case ev.RemoveWorker(worker):
                self._forget_actor(worker)
                pool.remove(worker)
            case ev.Generate(call, worker, requests, timeout_s):
                actor = pool[worker]
                self.calls.track(actor.generate.remote(list(requests)),
                                 Waiting(call, _key(actor), timeout_s, partial(self._rolled_out, call, worker), worker))
            case ev.SetupWorkerPush(worker):  # answers nothing: a failure shows in the load queued behind it
                self.calls.track(self.sync.setup_worker(worker),
                                 Waiting(None, _key(pool[worker]), self.start_timeout_s, _no_events, worker))
            case ev.LoadWeights(call, worker, version, timeout_s):  # that version, not whatever is newest
                self.calls.track(self.sync.load(worker, version),
                                 Waiting(call, _key(pool[worker]), timeout_s, partial(_loaded, call), worker))
            case ev.Evaluate(call, worker, rows, samples_per_prompt, seed, sampler, timeout_s):
                actor = pool[worker]
                ref = actor.evaluate.remote(rows, samples_per_prompt, seed, sampler)
                self.calls.track(ref, Waiting(call, _key(actor), timeout_s, partial(_evaluated, call), worker))
            case ev.StartProtocol(step):
                return [ev.ProtocolStarted(*self._protocol().start(step))]
            case ev.Complete(call, worker, unit, timeout_s):
                actor = pool[worker]
                self.calls.track(actor.complete.remote(*self._protocol().request(unit)),
                                 Waiting(call, _key(actor), timeout_s, partial(self._completed, call, unit), worker))
            case ev.FinishProtocol():
                return [ev.ProtocolDone(*self._protocol().finish())]
            case ev.Train(step, version, batch, timeout_s):
                refs = self.actors.train([e.group for e in batch], version)
                self._group(StepGroup({ref: f"learner rank {r}" for r, ref in enumerate(refs)}, {}, timeout_s,
                                      step=step))
            case ev.Push(version, receivers, barrier, timeout_s):
                if barrier and not receivers:  # a broadcast to nobody: nothing to send
                    return [ev.PushDone(version, 0.0, at=time.perf_counter())]
                learner_calls, worker_calls, staged = self.sync.push(version, receivers, self.nodes)
                names = {ref: f"learner rank {r}" for r, ref in learner_calls}
                names.update({ref: f"rollout worker {i}" for i, ref in worker_calls})
                self._group(PushGroup(names, {ref: i for i, ref in worker_calls}, timeout_s, version=version,
                                      staged=staged))
            case ev.Checkpoint():
                return self._save(command)
            case ev.PollControl(call, status, timeout_s):
                if self.control is None:  # a driver on actors it did not start has none
                    return [ev.ControlPolled(call, None, self._room())]
                self.calls.track(self.control.poll.remote(status),
                                 Waiting(call, "control", timeout_s, partial(self._polled, call)))
            case _:
                assert_never(command)
        return []

    def _protocol(self) -> ev.ProtocolRunner:
        if self.protocol is None:
            raise TypeError("a protocol command, but the job has no eval.protocol runner")
        return self.protocol

    def _group(self, group: CallGroup) -> None:
        self.groups.append(group)
        learners = {name: _key(a) for name, a in ((f"learner rank {r}", a) for r, a in enumerate(self.actors.learners))}
        for ref, name in group.names.items():
            worker = group.receivers.get(ref, -1)
            actor = _key(self.actors.pool[worker]) if worker >= 0 else learners[name]
            if worker >= 0 and group.staged:  # the stage runs on the worker's "weights" thread, beside its queue
                actor += "/weights"
            group.open.add(ref)
            self.calls.track(ref, Waiting(None, actor, group.timeout_s, partial(self._member_back, group, ref), worker,
                                          group))

    def _save(self, command: ev.Checkpoint) -> list[Any]:
        """The learner ranks save (collective), then the buffered groups and the client state; in
        the background, the last two once the ranks' files are durable (``poll_save``)."""
        state = {**command.state, "config": self.config, "parameter_shapes": self.parameter_shapes()}
        args = (self.actors, self.output_dir, command.step, state, command.episodes, self.start_timeout_s)
        if not self.async_checkpoint:
            return [ev.CheckpointDone(str(checkpoint.save(*args)))]
        events = self.finish_save(self.start_timeout_s)  # one save at a time
        self.saving = checkpoint.begin_save(*args)
        return events + [ev.CheckpointDone(str(self.saving.path), background=True)]

    def parameter_shapes(self) -> dict[str, list[int]]:
        """The model's full parameter shapes (learner rank 0, asked once): what a checkpoint records
        and a resume is checked against."""
        if self.shapes is None:
            self.shapes = wait([self.actors.learners[0].parameter_shapes.remote()], self.start_timeout_s,
                               "learner rank 0 (parameter shapes)")[0]
        return self.shapes

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
        for ref, waiting in self.calls.forget(_key(self.actors.pool[worker])):
            if waiting.group is not None:
                self._member_failed(waiting.group, ref, "died", "its process was replaced")

    # ---- events ---------------------------------------------------------------------------------
    def wait(self) -> list[Any]:
        """Block until a call finishes, fails or passes its deadline; their events, in the order the
        calls were made."""
        events: list[Any] = self.poll_save()
        if not self.calls:
            return events + [ev.Stalled()]
        refs = list(self.calls.waiting)
        timeout = max(0.0, self.calls.next_deadline() - time.perf_counter())
        ray.wait(refs, num_returns=1, timeout=min(timeout, GCS_PROBE_S))
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0])
        for ref in refs:
            if ref in ready and ref in self.calls.waiting:
                events += self._finished(ref, self.calls.pop(ref))
        now = time.perf_counter()
        for ref, waiting in list(self.calls.waiting.items()):
            if ref in self.calls.waiting and now >= waiting.deadline:
                events += self._late(ref, waiting)
        for group in list(self.groups):
            if now >= group.grace_until:
                events += self._settle(group, force=True)
        if now - self.last_probe > GCS_PROBE_S:  # actors may still answer for a while after the head is gone
            self.last_probe = now
            if not gcs_alive():
                raise ev.ActorFailure(
                    f"the Ray cluster's head (GCS at {ray.get_runtime_context().gcs_address}) stopped answering: the "
                    f"job cannot go on. {ev.resume_hint(self.output_dir)} once the cluster is back")
        return events

    def _finished(self, ref: ray.ObjectRef, waiting: Waiting) -> list[Any]:
        try:
            value = ray.get(ref)
        except ray.exceptions.RayActorError as e:
            return self._failed(waiting, ref, "died", first_line(e))
        except ray.exceptions.RayError as e:
            return self._failed(waiting, ref, "raised", first_line(getattr(e, "cause", None) or e))
        return waiting.answer(value)

    # each call's answer: its value -> its events (bound where the call is made, in ``execute``)
    def _started(self, call: ev.CallId, worker: int, info: WorkerInfo) -> list[ev.Event]:
        self.nodes[worker] = info.get("node_id")
        return [ev.WorkerStarted(call, info)]

    def _rolled_out(self, call: ev.CallId, worker: int, result: RolloutResult) -> list[ev.Event]:
        self.times.update(f"rollout{worker}", result.clock)
        return [ev.RolloutDone(call, result.episodes, result.reward_calls)]

    def _completed(self, call: ev.CallId, unit: int, completions: list[str]) -> list[ev.Event]:
        self._protocol().graded(unit, completions)  # appended to results.jsonl at once
        return [ev.UnitDone(call)]

    def _polled(self, call: ev.CallId, requested: Optional[int]) -> list[ev.Event]:
        return [ev.ControlPolled(call, requested, self._room())]

    def _member_back(self, group: CallGroup, ref: ray.ObjectRef, value: Any) -> list[ev.Event]:
        group.results[ref] = value
        group.open.discard(ref)
        return self._settle(group)

    def _free_resources(self) -> str:
        """Why a worker's start may be late: what the cluster has free."""
        return f"the cluster has {ray.available_resources()} free"

    def _failed(self, waiting: Waiting, ref: ray.ObjectRef, failure: str, detail: str) -> list[Any]:
        if waiting.group is not None:
            return self._member_failed(waiting.group, ref, failure, detail)
        if waiting.call is None:
            return []
        alive = failure != "died" or node_alive(self.nodes.get(waiting.worker))
        placeable = alive or self.actors.pool.can_place(self.actors.groups)
        return [ev.CallFailed(waiting.call, failure, detail, node_alive=alive, placeable=placeable)]

    def _member_failed(self, group: CallGroup, ref: ray.ObjectRef, failure: str, detail: str) -> list[Any]:
        group.failures[ref] = (failure, detail)
        group.open.discard(ref)
        group.failed_at = group.failed_at or time.perf_counter()
        return self._settle(group)

    def _late(self, ref: ray.ObjectRef, waiting: Waiting) -> list[Any]:
        if waiting.group is not None:  # a member past its deadline: the group fails now, the late one running
            waiting.group.late = True
            return self._settle(waiting.group, force=True)
        self.calls.pop(ref)
        if waiting.call is None:
            return []
        detail = waiting.late() if waiting.late is not None else f"{waiting.timeout_s:.0f} s"
        return [ev.CallFailed(waiting.call, "timed_out", detail)]

    def _settle(self, group: CallGroup, force: bool = False) -> list[Any]:
        """The group's event once every member is back (or, ``force``, now: the open ones running)."""
        if group.open and not force or group not in self.groups:
            return []
        running = [ref for ref in group.names if ref in group.open]
        for ref in running:
            self.calls.pop(ref)
        self.groups.remove(group)
        event = group.outcome(running, time.perf_counter())
        if isinstance(event, ev.StepDone):  # each rank's clock rides on its StepResult
            for rank, ref in enumerate(group.names):
                self.times.update(f"learner{rank}", group.results[ref].clock)
        elif isinstance(event, ev.PushFailed):  # a broken group cannot be trusted: it is rebuilt
            if self.sync.failed(event.detail, bool(event.died)):  # auto's pull failed: broadcast, and again
                event = dataclasses.replace(event, retry=True)
        return [event]

    # ---- the end --------------------------------------------------------------------------------
    def export(self, directory: Any, adapter_directory: Any = None) -> None:
        adapters = None if adapter_directory is None else str(adapter_directory)
        wait(self.actors.call_learners("export", str(directory), adapters), self.start_timeout_s,
             [f"learner rank {r} (export)" for r in range(len(self.actors.learners))])

    def close(self) -> None:
        """Stop every actor and release every reservation (skipped when the cluster's head is gone)."""
        self.calls.waiting.clear()
        if gcs_alive():
            self.actors.shutdown()
            if self.control is not None:
                ray.kill(self.control)


def _key(actor: Any) -> str:
    return actor._actor_id.hex()


def _no_events(value: Any) -> list[ev.Event]:
    return []


def _loaded(call: ev.CallId, version: int) -> list[ev.Event]:
    return [ev.WeightsLoaded(call, version)]


def _evaluated(call: ev.CallId, answer: tuple[int, EvalResult]) -> list[ev.Event]:
    return [ev.EvalDone(call, *answer)]
