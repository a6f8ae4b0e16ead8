"""The control plane's decisions, as a pure state machine: events in, commands out (events.py).

    scheduler = Scheduler(cfg, stream, held_out, collective_push=False)
    scheduler.handle(JobStarted(...)); commands = scheduler.begin("train")
    commands = scheduler.handle(RolloutDone(call, episodes))          # until scheduler.done

It routes: each event goes to the state machine that owns it, and the agenda (the goal's tasks)
decides what may happen now. The machines, each tested alone (tests/unit/coordinator/test_control_machines.py):
Admission (coordinator/decisions/admission.py: the prompt stream, request uids, re-queued requests, the
staleness bound, the group buffer), WeightVersions (coordinator/decisions/versions.py: the push in flight and
the version each worker holds), Evaluation (coordinator/decisions/evaluation.py: held-out parts and protocol
units dealt over the workers) and FleetPolicy (coordinator/decisions/fleet_policy.py: starts, losses,
resizes, retirements). The scheduler itself keeps the agenda and the step in flight. It imports no
Ray and no torch and reads no clock, so every fault path runs in a unit test in milliseconds
(tests/unit/test_scheduler*); coordinator/runtime/executor.py carries the commands out and reports what
came back.

The agenda. The driver asks for one goal at a time (``begin``); a goal is an agenda of tasks, and
the task at its head decides what may happen now (coordinator/decisions/agenda.py).

Faults. A lost worker (died, or hung and killed) has its calls forgotten, its requests re-queued
under their uids and its evaluation parts dealt again, then FleetPolicy replaces, drops or gives
up on it. A learner rank that fails, dies or hangs stops the job at once, naming the rank.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from stabledrl.common.config.job import JobConfig
from stabledrl.common.tasks import PromptStream, Row
from stabledrl.common.types import Episode
from stabledrl.coordinator.decisions import events as ev
from stabledrl.coordinator.decisions.admission import Admission
from stabledrl.coordinator.decisions.agenda import Goal, Task, TaskKind, due_after, goal_tasks
from stabledrl.coordinator.decisions.evaluation import Evaluation
from stabledrl.coordinator.decisions.fleet import Call, Fleet, WorkerState
from stabledrl.coordinator.decisions.events import resume_hint
from stabledrl.coordinator.decisions.fleet_policy import FleetPolicy
from stabledrl.coordinator.decisions.skipped_updates import SkippedUpdates
from stabledrl.coordinator.decisions.snapshot import SchedulerSnapshot, WorkerView, frozen
from stabledrl.coordinator.decisions.step_metrics import StepEnd, step_record
from stabledrl.coordinator.decisions.versions import WeightVersions

POLL_TIMEOUT_S = 30.0


@dataclass
class StepInFlight:
    number: int
    version: int  # the learner version it trains at
    batch: list[Episode]


class Scheduler:
    def __init__(self, cfg: JobConfig, stream: PromptStream, held_out: Sequence[Row], *, collective_push: bool) -> None:
        self.cfg, self.collective = cfg, collective_push
        r = cfg.rollout
        self.fleet = Fleet(target=r.num_workers, min_workers=r.min_workers, max_workers=r.worker_limit,
                           max_restarts=r.max_restarts, autoscale=r.autoscale)
        self.admission = Admission(cfg, stream, self.fleet)
        self.weights = WeightVersions(self.fleet, collective=collective_push, timeout_s=cfg.weights.timeout_s)
        self.evaluation = Evaluation(cfg, held_out, self.fleet)
        self.workers = FleetPolicy(cfg, self.fleet)
        self.staleness, self.buffer = self.admission.staleness, self.admission.buffer
        self.step = 0
        self.training: Optional[StepInFlight] = None
        self.step_end: Optional[StepEnd] = None
        self.agenda: list[Task] = []
        self.learner_ranks, self.parameters, self.startup = 1, 0, {}
        self.last_step_at = 0.0
        self.stopped: Optional[str] = None
        self.skipped = SkippedUpdates()
        self.out: list[ev.Command] = []  # commands answering the event being handled
        self._handlers: dict[type, Callable[[Any], None]] = {  # built once: each event to the machine that owns it
            ev.JobStarted: self._on_job_started, ev.StartupTimed: self._on_startup_timed,
            ev.WorkerStarted: self._on_worker_started,
            ev.RolloutDone: lambda e: self._emit(self.admission.rollout_done(e)),
            ev.WeightsLoaded: self.weights.loaded, ev.EvalDone: lambda e: self._emit(self.evaluation.eval_done(e)),
            ev.CallFailed: self._on_call_failed, ev.StepDone: self._on_step_done,
            ev.LearnerFailed: self._on_learner_failed, ev.PushDone: self._on_push_done,
            ev.PushFailed: self._on_push_failed, ev.CheckpointDone: self._on_checkpoint_done,
            ev.CheckpointWritten: lambda e: self._emit([ev.Log(e.line)]),
            ev.ControlPolled: lambda e: self._emit(self.workers.control_polled(e)),
            ev.ProtocolStarted: lambda e: self._emit(self.evaluation.protocol_started(e)),
            ev.UnitDone: self.evaluation.unit_done, ev.ProtocolDone: self._on_protocol_done,
            ev.Stalled: self._on_stalled,
        }
        self._tasks: dict[TaskKind, Callable[[Task, bool], None]] = {
            TaskKind.TRAIN: self._task_train, TaskKind.PUSH: self._task_push, TaskKind.FINISH: self._task_finish,
            TaskKind.CHECKPOINT: self._task_checkpoint, TaskKind.PROTOCOL: self._task_protocol,
            TaskKind.EVALUATE: self._task_evaluate, TaskKind.POLL: self._task_poll, TaskKind.DRAIN: self._task_drain}

    # ---- the driver's surface -----------------------------------------------------------------
    def begin(self, goal: Goal, at: float = 0.0) -> list[ev.Command]:
        """Start ``goal``: evaluate | train | drain | checkpoint | restore (coordinator/decisions/agenda.py);
        ``at``: the runtime's clock now (a step's time is counted from the previous step's end)."""
        self.agenda = goal_tasks(goal)
        self.last_step_at = at
        return self._answer()

    @property
    def done(self) -> bool:
        """The goal is reached (or the job stopped)."""
        return not self.agenda or self.stopped is not None

    def handle(self, event: ev.Event) -> list[ev.Command]:
        """The commands that answer ``event``."""
        self._handlers[type(event)](event)
        return self._answer()

    def state_dict(self) -> dict[str, Any]:
        """The client state a checkpoint keeps (coordinator/runtime/checkpoint.py); only between steps: the
        buffered groups are saved beside it (Admission.state_dict: the requests still out are
        saved as re-queued ones)."""
        assert self.training is None, "a checkpoint is taken between steps"
        return {"step": self.step, **self.admission.state_dict(), "counts": dict(self.workers.counts)}

    def load_state_dict(self, state: dict[str, Any], rows: dict[str, Row], episodes: Sequence[Episode]) -> None:
        """Continue from a checkpoint's client state and buffered groups. KeyError / ValueError when
        the task's rows changed; OverflowError when the groups exceed the staleness bound."""
        self.step = int(state["step"])
        self.admission.load_state_dict(state, rows, episodes)
        self.workers.counts.update(state.get("counts", {}))

    def snapshot(self) -> SchedulerSnapshot:
        """What the driver and tests read, as one frozen value (coordinator/decisions/snapshot.py)."""
        a = self.admission
        return SchedulerSnapshot(
            step=self.step, version=self.staleness.version, next_uid=a.next_uid,
            requeued=tuple(r.uid for r in a.requeue), outstanding=tuple(a.outstanding()),
            buffered=tuple(sorted(self.buffer.groups)), delivered=frozenset(self.buffer.seen),
            duplicates=self.buffer.duplicates, dropped_total=self.staleness.dropped_total, cursor=a.stream.cursor,
            reward_calls=frozen(a.reward_calls), reward_totals=frozen(a.totals()),
            counts=frozen(self.workers.counts), worker_metrics=frozen(self.workers.metrics()),
            workers=tuple(WorkerView(w.index, w.state, w.restarts, w.version)
                          for w in sorted(self.fleet.workers.values(), key=lambda w: w.index)),
            last_eval=self.evaluation.last_eval, evaluations=tuple(self.evaluation.evaluations))

    # ---- the agenda ---------------------------------------------------------------------------
    def _answer(self) -> list[ev.Command]:
        if self.stopped is None:
            self._advance()
            self._emit(self.workers.retire_idle(self.weights.receivers()))
            if self.training is None and self.step_end is None and self.weights.sync_needed():
                self._emit(self.weights.start(self.staleness.version))
        out, self.out = self.out, []
        return out

    def _advance(self) -> None:
        while self.agenda and self.stopped is None:
            task = self.agenda[0]
            if not task.done:  # an event may have finished it (CheckpointDone, ProtocolDone)
                self._tasks[task.kind](task, task.start())
            if not task.done:
                return
            self.agenda.pop(0)

    def _task_train(self, task: Task, first: bool) -> None:
        if self.step >= self.cfg.run.steps:
            task.finish()
            return
        self._feed()
        if self.training is None and self.weights.push is None:  # a step trains on the weights last pushed
            batch = self.admission.take_batch()  # stale ones dropped, counted
            if batch is not None:
                self.training = StepInFlight(self.step + 1, self.staleness.version, batch)
                self._emit([ev.Train(self.step + 1, self.staleness.version, batch, self.cfg.rollout.request_timeout_s)])
            else:
                self._feed()  # dropped groups released their places

    def _feed(self) -> None:
        self._emit(self.admission.feed(held=self.weights.held()))

    def _task_push(self, task: Task, first: bool) -> None:
        if first:
            self._emit(self.weights.start(self.staleness.version, task))

    def _task_finish(self, task: Task, first: bool) -> None:
        """The step's weights are out: count the step, record it, queue what is due after it."""
        self.step += 1
        end, self.step_end = self.step_end, None
        if self.collective:  # a collective push ends with every receiver at the new version (staged: once applied)
            end.at_end.update(self.workers.metrics())
        step_s, self.last_step_at = end.push_at - self.last_step_at, end.push_at
        record = step_record(end, version=self.staleness.version, step_s=step_s,
                             inner_iterations=self.cfg.algorithm.inner_iterations, estimator=self.cfg.estimator,
                             parameters=self.parameters, learner_devices=self.learner_ranks,
                             peak_tflops=self.cfg.run.peak_tflops)
        self._emit([ev.Record(self.step, {**record, **(self.startup if self.step == 1 else {})}, batch=end.batch)])
        self.agenda[1:1] = due_after(self.step, self.cfg)
        task.finish()

    def _task_checkpoint(self, task: Task, first: bool) -> None:
        """In-order runs wait for the admitted rollouts first: their groups go into the checkpoint,
        so the resumed run trains on the same samples at the same staleness as an uninterrupted one.
        Other runs (which no resume replays exactly) save them as requests to sample again and go
        on at once: the workers keep generating, and the next step finds its batch."""
        settled = not self.fleet.waiting() or not self.cfg.algorithm.in_order
        if not task.sent and settled and self.weights.push is None:
            task.send()
            episodes = [self.buffer.groups[uid] for uid in sorted(self.buffer.groups)]
            self._emit([ev.Checkpoint(self.step, self.state_dict(), episodes)])

    def _task_evaluate(self, task: Task, first: bool) -> None:
        commands, over = self.evaluation.evaluate(self.step, first)
        if over:
            task.finish()
        self._emit(commands)

    def _task_protocol(self, task: Task, first: bool) -> None:
        commands, over = self.evaluation.protocol(self.step, first)
        if over:
            task.finish()
        self._emit(commands)

    def _on_protocol_done(self, event: ev.ProtocolDone) -> None:
        self._emit(self.evaluation.protocol_done(self.step, event))
        self._head_done(TaskKind.PROTOCOL)

    def _task_poll(self, task: Task, first: bool) -> None:
        status = {"state": "training", "step": self.step, "version": self.staleness.version,
                  "target": self.fleet.target, **self.fleet.status()}
        self._emit([ev.PollControl(self.fleet.call("poll", "the job's control actor"), status, POLL_TIMEOUT_S)])
        task.finish()

    def _task_drain(self, task: Task, first: bool) -> None:
        """Let admitted rollouts, weight loads and starting workers finish (no new admissions)."""
        if not self.fleet.waiting() and self.weights.push is None:
            task.finish()

    def _head_done(self, kind: TaskKind) -> None:
        if self.agenda and self.agenda[0].kind is kind:
            self.agenda[0].finish()

    # ---- the learner's step and its push ------------------------------------------------------
    def _on_step_done(self, event: ev.StepDone) -> None:
        batch, self.training = self.training.batch, None
        self.staleness.advance()
        at_end = {**self.staleness.step_metrics(), "rollout/empty_groups_total": float(self.buffer.empty),
                  **self.workers.metrics(), **self.admission.totals()}
        self.step_end = StepEnd(batch, event.results, event.train_s, at_end)
        self.agenda[0:0] = [Task(TaskKind.PUSH), Task(TaskKind.FINISH)]
        self._emit(self.skipped.step_done(event.step, event.results))

    def _on_push_done(self, event: ev.PushDone) -> None:
        push, commands = self.weights.done(event)
        self._emit(commands)
        if self.step_end is not None and push.task is not None and push.task.kind is TaskKind.PUSH:
            self.step_end.push_s, self.step_end.push_at = event.push_s, event.at
        if push.task is not None:
            push.task.finish()

    def _on_push_failed(self, event: ev.PushFailed) -> None:
        push, died = self.weights.failed(event)
        for worker in died:
            self._lost(worker, "died", "died during a weight push", node_alive=True)
        if self.stopped is None and not event.died and not event.retry:
            self._emit([ev.Stop(f"weights version {event.version}: {event.detail}")])
        elif self.stopped is None:  # the group is rebuilt (without the dead; over the broadcast): pushed again
            self._emit(self.weights.start(event.version, push.task))

    def _on_learner_failed(self, event: ev.LearnerFailed) -> None:
        self._emit([ev.Stop(f"{event.describe()}. The job stops; {resume_hint(self.cfg.run.output_dir)}")])

    def _on_checkpoint_done(self, event: ev.CheckpointDone) -> None:
        self._emit([ev.Log(f"checkpoint: {event.path}" + (" (written in the background)" if event.background else ""))])
        self._head_done(TaskKind.CHECKPOINT)

    # ---- the workers --------------------------------------------------------------------------
    def _on_job_started(self, event: ev.JobStarted) -> None:
        self.workers.job_started(event)
        self.learner_ranks, self.startup = event.learner_ranks, dict(event.startup)
        self.parameters = int(next(iter(event.workers.values()), {}).get("parameters", 0))

    def _on_startup_timed(self, event: ev.StartupTimed) -> None:
        self.startup = dict(event.startup)

    def _on_worker_started(self, event: ev.WorkerStarted) -> None:
        worker, commands = self.workers.started(event)
        self._emit(commands)
        if worker is not None:
            commands, weights = self.weights.join(worker)
            self._emit(commands + [ev.Log(f"{worker.name} started on node {str(event.info.get('node_id'))[:12]} "
                                          f"(pid {event.info.get('pid')}, {weights})")])

    def _on_call_failed(self, event: ev.CallFailed) -> None:
        worker, call, commands = self.workers.call_failed(event)
        self._emit(commands)
        if worker is not None:
            self._lost(worker, event.failure, event.detail, event.node_alive, call, placeable=event.placeable)

    def _lost(self, worker: WorkerState, failure: str, detail: str, node_alive: bool,
              first: Optional[Call] = None, placeable: bool = True, peers: bool = True) -> None:
        """A lost worker: its requests re-queued, its evaluation parts dealt again, then the fleet
        policy's answer (replace, drop, remove, give up). The other workers on a node that left are
        lost with it, whether or not their own calls have failed yet."""
        lost_with = self.fleet.node_left(worker) if not node_alive and peers else []
        requests, commands = self.workers.lost(worker, failure, detail, node_alive, first, placeable)
        self.admission.lost(requests)
        self.evaluation.lost_worker(worker.index)
        self._emit(commands)
        for peer in lost_with:
            if self.stopped is None and self.fleet.get(peer.index) is peer:
                self._lost(peer, "died", f"its node left with {worker.name}", False, placeable=placeable, peers=False)

    def _on_stalled(self, event: ev.Stalled) -> None:
        self._emit([ev.Stop(f"the loop has nothing to wait for: no rollout admitted, no step running and no worker "
                            f"starting (buffer {len(self.buffer)} groups, capacity {self.staleness.capacity()}, "
                            f"{len(self.fleet.active())} active workers)")])

    # ---- output -------------------------------------------------------------------------------
    def _emit(self, commands: list[ev.Command]) -> None:
        """Queue ``commands``; the first Stop ends the job (later ones are dropped)."""
        for command in commands:
            if isinstance(command, ev.Stop):
                if self.stopped is not None:
                    continue
                self.stopped = command.reason
            self.out.append(command)
