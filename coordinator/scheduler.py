"""The control plane's decisions, as a pure state machine: events in, commands out (events.py).

    scheduler = Scheduler(cfg, stream, held_out, collective_push=False)
    scheduler.handle(JobStarted(...)); commands = scheduler.begin("train")
    commands = scheduler.handle(RolloutDone(call, episodes))          # until scheduler.done

It owns the prompt stream's position, the next request uid and the re-queued requests, the policy
version and the staleness bound (StalenessController), the finished groups (GroupBuffer), the
rollout workers and the calls out on them (Fleet), and the step in flight. It imports no Ray and
reads no clock, so every fault path runs in a unit test in milliseconds (tests/unit/test_scheduler*);
coordinator/runtime.py carries the commands out and reports what came back.

Goals. The driver asks for one goal at a time (``begin``): evaluate (``eval.protocol``'s benchmarks
if set, then the held-out rows), train (to ``run.steps``), drain (let admitted rollouts land),
checkpoint, restore (push restored weights). A goal is an agenda of tasks; the task at its head
decides what may happen now. While ``train`` is at the head, rollouts are admitted up to the
staleness bound and a batch is trained as soon as the buffer holds one; a finished step puts
``push`` and ``finish`` in front of it (``finish`` records the step and adds ``checkpoint``,
``protocol``, ``evaluate`` and ``poll`` when they are due), so nothing is admitted between a
step's end and its weights being out.

Faults. A worker whose process died, or whose call ran past its deadline (it hung: the runtime
kills it), has every call forgotten: its requests go back to the queue under their uids (sampled
again with the same seeds; the buffer accepts a uid once), its evaluation parts (held-out parts,
protocol units) run on another worker, and it is replaced in place at most
``rollout.max_restarts`` times. A learner rank that fails, dies or hangs stops the job at once,
naming the rank.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Optional, Sequence

from common.config.job import JobConfig
from common.tasks import PromptStream, Row
from common.tasks.sandbox import RewardFailureRate, check_failure_rate
from common.types import Episode, PromptRequest
from coordinator import events as ev
from coordinator.buffer import GroupBuffer
from coordinator.fleet import Fleet, WorkerState
from coordinator.held_out import DealtParts, HeldOutResult, HeldOutRun
from coordinator.staleness import StalenessController
from coordinator.step_metrics import StepEnd, step_record

COUNTS = ("faults/rollout_worker_deaths", "faults/rollout_worker_hangs", "faults/rollout_workers_replaced",
          "faults/rollout_workers_dropped", "elastic/workers_added", "elastic/workers_retired")
Goal = Literal["evaluate", "train", "drain", "checkpoint", "restore"]
GOALS: dict[str, tuple[str, ...]] = {"restore": ("push", "drain"), "train": ("train",), "drain": ("drain",),
                                     "evaluate": ("protocol", "evaluate"), "checkpoint": ("checkpoint",)}
POLL_TIMEOUT_S = 30.0


@dataclass
class Task:
    name: str  # train | push | finish | checkpoint | protocol | evaluate | poll | drain
    started: bool = False
    sent: bool = False  # its command is out (checkpoint)
    done: bool = False


@dataclass
class StepInFlight:
    number: int
    version: int  # the learner version it trains at
    batch: list[Episode]


@dataclass
class PushInFlight:
    version: int
    receivers: dict[int, int]  # worker index -> incarnation (collective push)
    task: Optional[Task] = None  # None: a push of its own, to bring syncing workers in


class Scheduler:
    def __init__(self, cfg: JobConfig, stream: PromptStream, held_out: Sequence[Row], *, collective_push: bool) -> None:
        self.cfg, self.stream, self.held_out = cfg, stream, list(held_out)
        self.collective = collective_push
        a, r = cfg.algorithm, cfg.rollout
        self.staleness = StalenessController(a.max_staleness, a.groups_per_step)
        self.buffer = GroupBuffer(self.staleness)
        self.fleet = Fleet(target=r.num_workers, min_workers=r.min_workers, max_workers=r.worker_limit,
                           max_restarts=r.max_restarts, autoscale=r.autoscale)
        # requests queued per worker (in order: every admitted one at once)
        self.depth = math.ceil((a.max_staleness + 1) * a.groups_per_step / r.prompts_per_request) if a.in_order \
            else r.requests_per_worker
        self.step = self.next_uid = 0
        self.requeue: list[PromptRequest] = []  # admitted, not being sampled: a lost worker's requests, by uid
        self.training: Optional[StepInFlight] = None
        self.push: Optional[PushInFlight] = None
        self.step_end: Optional[StepEnd] = None
        self.held_out_run: Optional[HeldOutRun] = None
        self.protocol_run: Optional[DealtParts] = None  # eval.protocol's units at this step
        self.last_eval: Optional[HeldOutResult] = None
        self.evaluations: list[HeldOutResult] = []  # every held-out result of this process, in order
        self.latest: Optional[int] = None  # newest version pushed through the object store (a new worker loads it)
        self.agenda: list[Task] = []
        self.counts = dict.fromkeys(COUNTS, 0)
        self.reward_calls: dict[str, float] = {}
        self.learner_ranks, self.parameters, self.startup = 1, 0, {}
        self.last_step_at = 0.0
        self.stopped: Optional[str] = None
        self.out: list[Any] = []  # commands answering the event being handled

    # ---- the driver's surface -----------------------------------------------------------------
    def begin(self, goal: Goal, at: float = 0.0) -> list[ev.Command]:
        """Start ``goal``: evaluate | train | drain | checkpoint | restore (module docstring);
        ``at``: the runtime's clock now (a step's time is counted from the previous step's end)."""
        self.agenda = [Task(name) for name in GOALS[goal]]
        self.last_step_at = at
        return self._answer()

    @property
    def done(self) -> bool:
        """The goal is reached (or the job stopped)."""
        return not self.agenda or self.stopped is not None

    def handle(self, event: ev.Event) -> list[ev.Command]:
        """The commands that answer ``event``."""
        handlers = {
            ev.JobStarted: self._on_job_started, ev.WorkerStarted: self._on_worker_started,
            ev.RolloutDone: self._on_rollout_done, ev.WeightsLoaded: self._on_weights_loaded,
            ev.EvalDone: self._on_eval_done, ev.CallFailed: self._on_call_failed, ev.StepDone: self._on_step_done,
            ev.LearnerFailed: self._on_learner_failed, ev.PushDone: self._on_push_done,
            ev.PushFailed: self._on_push_failed, ev.CheckpointDone: self._on_checkpoint_done,
            ev.CheckpointWritten: self._on_checkpoint_written,
            ev.ControlPolled: self._on_control_polled, ev.ProtocolStarted: self._on_protocol_started,
            ev.UnitDone: self._on_unit_done, ev.ProtocolDone: self._on_protocol_done, ev.Stalled: self._on_stalled,
        }
        handlers[type(event)](event)
        return self._answer()

    def outstanding(self) -> list[int]:
        """Uids admitted and not back: being sampled or re-queued (exactly-once accounting)."""
        return sorted([r.uid for r in self.fleet.requests()] + [r.uid for r in self.requeue])

    def state_dict(self) -> dict[str, Any]:
        """The client state a checkpoint keeps (coordinator/checkpoint.py); only between steps: the
        buffered groups are saved beside it. Requests admitted and not back yet are saved with the
        re-queued ones: a resumed run samples them again (same seeds, the restored weights)."""
        assert self.training is None, "a checkpoint is taken between steps"
        requeue = sorted(self.requeue + self.fleet.requests(), key=lambda r: r.uid)
        return {"step": self.step, "version": self.staleness.version, "stream": self.stream.state_dict(),
                "staleness": self.staleness.state_dict(), "next_uid": self.next_uid,
                "requeue": [(r.uid, r.row.prompt_id) for r in requeue], "counts": dict(self.counts),
                "reward_calls": dict(self.reward_calls)}

    def load_state_dict(self, state: dict[str, Any], rows: dict[str, Row], episodes: Sequence[Episode]) -> None:
        """Continue from a checkpoint's client state and buffered groups. KeyError / ValueError when
        the task's rows changed; OverflowError when the groups exceed the staleness bound."""
        self.step, self.next_uid = int(state["step"]), int(state["next_uid"])
        self.stream.load_state_dict(state["stream"])
        self.requeue = [PromptRequest(int(uid), rows[pid]) for uid, pid in state["requeue"]]
        self.staleness.load_state_dict(state["staleness"])
        self.counts.update(state.get("counts", {}))
        self.reward_calls = dict(state.get("reward_calls", {}))
        for episode in episodes:  # admitted and finished before the checkpoint
            if not self.staleness.try_start(1):
                raise OverflowError("more buffered groups than the staleness bound admits")
            self.buffer.add(episode)

    def totals(self) -> dict[str, float]:
        """The reward calls of the whole run, counted from the delivered requests."""
        return {f"rollout/{k}": v for k, v in self.reward_calls.items()}

    # ---- the agenda ---------------------------------------------------------------------------
    def _answer(self) -> list[ev.Command]:
        if self.stopped is None:
            self._advance()
            self._retire_idle()
            self._sync_if_none_active()
        out, self.out = self.out, []
        return out

    def _advance(self) -> None:
        while self.agenda and self.stopped is None:
            task = self.agenda[0]
            first, task.started = not task.started, True
            tasks = {"train": self._task_train, "push": self._task_push, "finish": self._task_finish,
                     "checkpoint": self._task_checkpoint, "protocol": self._task_protocol,
                     "evaluate": self._task_evaluate, "poll": self._task_poll,
                     "drain": self._task_drain}
            tasks[task.name](task, first)
            if not task.done:
                return
            self.agenda.pop(0)

    def _task_train(self, task: Task, first: bool) -> None:
        if self.step >= self.cfg.run.steps:
            task.done = True
            return
        self._feed()
        if self.training is None and self.push is None:  # a step trains on the weights last pushed
            before = (self.outstanding() or [None])[0] if self.cfg.algorithm.in_order else None
            batch = self.buffer.take(self.cfg.algorithm.groups_per_step, before=before)  # stale ones dropped, counted
            if batch is not None:
                self.training = StepInFlight(self.step + 1, self.staleness.version, batch)
                self.emit(ev.Train(self.step + 1, self.staleness.version, batch, self.cfg.rollout.request_timeout_s))
            else:
                self._feed()  # dropped groups released their places

    def _task_push(self, task: Task, first: bool) -> None:
        if first:
            self._start_push(self.staleness.version, task)

    def _task_finish(self, task: Task, first: bool) -> None:
        """The step's weights are out: count the step, record it, queue what is due after it."""
        self.step += 1
        end, self.step_end = self.step_end, None
        if self.collective:  # a collective push ends with every receiver at the new version (staged: once applied)
            end.at_end.update(self.worker_metrics())
        step_s, self.last_step_at = end.push_at - self.last_step_at, end.push_at
        record = step_record(end, version=self.staleness.version, step_s=step_s,
                             inner_iterations=self.cfg.algorithm.inner_iterations, estimator=self.cfg.estimator,
                             parameters=self.parameters, learner_devices=self.learner_ranks,
                             peak_tflops=self.cfg.run.peak_tflops)
        self.emit(ev.Record(self.step, {**record, **(self.startup if self.step == 1 else {})}, batch=end.batch))
        run, every_eval = self.cfg.run, self.cfg.eval.every
        due = [Task("checkpoint")] if run.checkpoint_every and self.step % run.checkpoint_every == 0 else []
        due += [Task("protocol"), Task("evaluate")] if every_eval and self.step % every_eval == 0 else []
        self.agenda[1:1] = (due if self.step < run.steps else []) + [Task("poll")]
        task.done = True

    def _task_checkpoint(self, task: Task, first: bool) -> None:
        """In-order runs wait for the admitted rollouts first: their groups go into the checkpoint,
        so the resumed run trains on the same samples at the same staleness as an uninterrupted one.
        Other runs (which no resume replays exactly) save them as requests to sample again and go
        on at once: the workers keep generating, and the next step finds its batch."""
        settled = not self.fleet.waiting() or not self.cfg.algorithm.in_order
        if not task.sent and settled and self.push is None:
            task.sent = True
            episodes = [self.buffer.groups[uid] for uid in sorted(self.buffer.groups)]
            self.emit(ev.Checkpoint(self.step, self.state_dict(), episodes))

    def _task_evaluate(self, task: Task, first: bool) -> None:
        if first:
            self.last_eval = None
            if not self.held_out:
                task.done = True
                return
            self.held_out_run = HeldOutRun.deal(self.held_out, max(1, len(self.fleet.active())))
        run, e = self.held_out_run, self.cfg.eval
        for part, index in run.assign([w.index for w in self.fleet.active()]):
            worker = self.fleet[index]
            call = self.fleet.call("eval", f"{worker.name} (held-out evaluation)", worker)
            run.running[call] = (part, index)
            self.emit(ev.Evaluate(call, index, run.parts[part], e.samples_per_prompt, e.seed,
                                  e.sampler_for(self.cfg.sampler), self.cfg.rollout.request_timeout_s))
        if not run.finished:
            return
        try:
            self.last_eval = result = run.merge()
        except ValueError as error:
            self.stop(str(error))
            return
        self.held_out_run = None
        self.evaluations.append(result)
        self.emit(ev.Record(self.step, result.metrics()))
        reruns = f"; {run.reruns} part(s) run again after their worker was lost" if run.reruns else ""
        self.log(f"step {self.step}: held-out pass@1 {100 * result.pass_at_1:.1f}% on {result.num_prompts} prompts "
                 f"({e.describe(self.cfg.sampler)}, weights version {result.version}, {result.time_s:.1f} s{reruns})")
        task.done = True

    def _task_protocol(self, task: Task, first: bool) -> None:
        """``eval.protocol`` (a published benchmark table) on the rollout workers, before the held-out
        rows: the runtime opens the step's results and says how many units are left (ProtocolStarted);
        units are dealt like held-out parts (a lost worker's units run again on another); once all
        are graded the runtime writes the table (ProtocolDone)."""
        if first:
            self.protocol_run = None
            if self.cfg.eval.protocol is None:
                task.done = True
            else:
                self.emit(ev.StartProtocol(self.step))
            return
        run = self.protocol_run
        if run is None:
            return  # ProtocolStarted not handled yet
        for unit, index in run.assign([w.index for w in self.fleet.active()]):
            worker = self.fleet[index]
            call = self.fleet.call("complete", f"{worker.name} (protocol unit {unit})", worker)
            run.running[call] = (unit, index)
            self.emit(ev.Complete(call, index, unit, self.cfg.rollout.request_timeout_s))
        if run.finished and not task.sent:
            task.sent = True
            self.emit(ev.FinishProtocol(self.step))

    def _on_protocol_started(self, event: ev.ProtocolStarted) -> None:
        self.protocol_run = DealtParts.of(event.units)
        if event.note:
            self.log(event.note)

    def _on_unit_done(self, event: ev.UnitDone) -> None:
        if self.fleet.take(event.call) is None or self.protocol_run is None:
            return
        unit, _ = self.protocol_run.running.pop(event.call)
        self.protocol_run.done[unit] = True

    def _on_protocol_done(self, event: ev.ProtocolDone) -> None:
        reruns = self.protocol_run.reruns if self.protocol_run is not None else 0
        self.protocol_run = None
        self.emit(ev.Record(self.step, event.metrics))
        self.log(event.line + (f"; {reruns} unit(s) run again after their worker was lost" if reruns else ""))
        if self.agenda and self.agenda[0].name == "protocol":
            self.agenda[0].done = True

    def _task_poll(self, task: Task, first: bool) -> None:
        status = {"state": "training", "step": self.step, "version": self.staleness.version,
                  "target": self.fleet.target, **self.fleet.status()}
        self.emit(ev.PollControl(self.fleet.call("poll", "the job's control actor"), status, POLL_TIMEOUT_S))
        task.done = True

    def _task_drain(self, task: Task, first: bool) -> None:
        """Let admitted rollouts, weight loads and starting workers finish (no new admissions)."""
        task.done = not self.fleet.waiting() and self.push is None

    # ---- rollouts -----------------------------------------------------------------------------
    def _next_request(self) -> PromptRequest:
        if self.requeue:
            return self.requeue.pop(0)
        request = PromptRequest(self.next_uid, self.stream.next())
        self.next_uid += 1
        return request

    def _feed(self) -> None:
        """Give each active worker requests up to its queue depth while the admission bound allows
        (not to the receivers of a collective push until it is over)."""
        held = self.push.receivers if self.push is not None and self.collective else {}
        queued = {w.index: self.fleet.queued(w.index) for w in self.fleet.active() if w.index not in held}
        while queued:
            index = min(queued, key=queued.__getitem__)
            n = min(self.cfg.rollout.prompts_per_request, self.staleness.capacity())
            if queued[index] >= self.depth or n == 0 or not self.staleness.try_start(n):
                return
            requests = tuple(self._next_request() for _ in range(n))
            worker = self.fleet[index]
            uids = f"{requests[0].uid}..{requests[-1].uid}" if n > 1 else str(requests[0].uid)
            call = self.fleet.call("rollout", f"{worker.name} (prompts {uids})", worker, requests)
            self.emit(ev.Generate(call, index, requests, self.cfg.rollout.request_timeout_s))
            queued[index] += 1

    def _on_rollout_done(self, event: ev.RolloutDone) -> None:
        if self.fleet.take(event.call) is None:
            return  # a call of a process already replaced: its requests were re-queued
        for episode in event.episodes:
            for key, value in episode.stats.items():
                if key.startswith("reward_calls/"):
                    self.reward_calls[key] = self.reward_calls.get(key, 0.0) + value
            self.buffer.add(episode)
        try:
            check_failure_rate(self.reward_calls, self.cfg.task)  # stop rather than train on zeros
        except RewardFailureRate as e:
            self.stop(str(e))

    # ---- learner steps and weights ------------------------------------------------------------
    def _on_step_done(self, event: ev.StepDone) -> None:
        batch, self.training = self.training.batch, None
        self.staleness.advance()
        at_end = {**self.staleness.step_metrics(), "rollout/empty_groups_total": float(self.buffer.empty),
                  **self.worker_metrics(), **self.totals()}
        self.step_end = StepEnd(batch, event.results, event.train_s, at_end)
        self.agenda[0:0] = [Task("push"), Task("finish")]

    def worker_metrics(self) -> dict[str, float]:
        versions = self.fleet.versions()
        return {"rollout/workers": float(len(self.fleet.serving())),
                "rollout/worker_version_min": float(min(versions)) if versions else -1.0,
                **{k: float(v) for k, v in self.counts.items()}}

    def _start_push(self, version: int, task: Optional[Task]) -> None:
        timeout = self.cfg.weights.timeout_s
        if not self.collective:
            self.push = PushInFlight(version, {}, task)
            self.emit(ev.Push(version, (), False, timeout))
            for worker in self.fleet.active():
                self.load_weights(worker, version)
            return
        targets = sorted((w for w in self.fleet.workers.values() if w.state in ("active", "syncing")),
                         key=lambda w: w.index)
        self.push = PushInFlight(version, {w.index: w.restarts for w in targets}, task)
        self.emit(ev.Push(version, tuple(w.index for w in targets), True, 10 * timeout))

    def load_weights(self, worker: WorkerState, version: int) -> None:
        call = self.fleet.call("load", f"{worker.name} (weights version {version})", worker)
        self.emit(ev.LoadWeights(call, worker.index, version, 2 * self.cfg.weights.timeout_s))

    def _on_push_done(self, event: ev.PushDone) -> None:
        push, self.push = self.push, None
        for index, incarnation in push.receivers.items():
            worker = self.fleet.get(index)
            if worker is not None and worker.restarts == incarnation:
                worker.state = "active" if worker.state == "syncing" else worker.state
                if event.staged:  # received beside its running request: applied in order with its requests
                    self.load_weights(worker, event.version)
                else:
                    worker.version = event.version
        self.latest = event.version if not self.collective else self.latest
        if self.step_end is not None and push.task is not None and push.task.name == "push":
            self.step_end.push_s, self.step_end.push_at = event.push_s, event.at
        if push.task is not None:
            push.task.done = True

    def _on_push_failed(self, event: ev.PushFailed) -> None:
        push, self.push = self.push, None
        for index in event.died:
            worker = self.fleet.get(index)
            if worker is not None and worker.restarts == push.receivers.get(index):
                self._lost(worker, "died", "died during a weight push", node_alive=True)
        if self.stopped is None and not event.died:
            self.stop(f"weights version {event.version}: {event.detail}")
        elif self.stopped is None:  # the group is rebuilt without them: each retry has fewer receivers
            self._start_push(event.version, push.task)

    def _sync_if_none_active(self) -> None:
        """Collective push: started workers wait (syncing) for the next push; with none active and
        no step running, push the current version now, or nothing could run again."""
        if not self.collective or self.push is not None or self.training is not None or self.step_end is not None:
            return
        if not self.fleet.active() and any(w.state == "syncing" for w in self.fleet.workers.values()):
            self._start_push(self.staleness.version, None)

    def _on_learner_failed(self, event: ev.LearnerFailed) -> None:
        self.stop(f"{event.describe()}. The job stops; `stabledrl train --resume {self.cfg.run.output_dir}` "
                  "continues from its last checkpoint")

    def _on_checkpoint_done(self, event: ev.CheckpointDone) -> None:
        self.log(f"checkpoint: {event.path}" + (" (written in the background)" if event.background else ""))
        if self.agenda and self.agenda[0].name == "checkpoint":
            self.agenda[0].done = True

    def _on_checkpoint_written(self, event: ev.CheckpointWritten) -> None:
        self.log(event.line)

    def _on_eval_done(self, event: ev.EvalDone) -> None:
        if self.fleet.take(event.call) is None or self.held_out_run is None:
            return
        part, _ = self.held_out_run.running.pop(event.call)
        self.held_out_run.done[part] = (event.version, event.result)

    # ---- the fleet: starts, losses, sizes -----------------------------------------------------
    def _on_job_started(self, event: ev.JobStarted) -> None:
        for index, info in sorted(event.workers.items()):
            worker = self.fleet.add()
            assert worker.index == index, "the job's first workers are numbered 0..N-1"
            worker.state, worker.info = "active", dict(info)
        self.learner_ranks, self.startup = event.learner_ranks, dict(event.startup)
        self.parameters = int(next(iter(event.workers.values()), {}).get("parameters", 0))

    def _start(self, worker: WorkerState, replaces: bool, what: str) -> None:
        call = self.fleet.call("start", what, worker)
        self.emit(ev.StartWorker(call, worker.index, replaces, self.cfg.cluster.start_timeout_s))

    def _on_worker_started(self, event: ev.WorkerStarted) -> None:
        taken = self.fleet.take(event.call)
        if taken is None or taken[1] is None:
            return
        worker = taken[1]
        worker.info = dict(event.info)
        if worker.state == "retiring":
            self._remove(worker)
            return
        if self.collective:
            worker.state, weights = "syncing", "joins the next weight push"  # the group is rebuilt with it
        else:
            self.emit(ev.SetupWorkerPush(worker.index))  # runs before the load below
            newest = self.push.version if self.push is not None else self.latest  # a push still out: its version
            if newest is not None:
                self.load_weights(worker, newest)
            worker.state = "active"
            weights = f"weights version {newest}" if newest is not None else "initial weights"
        self.log(f"{worker.name} started on node {str(event.info.get('node_id'))[:12]} (pid {event.info.get('pid')}, "
                 f"{weights})")

    def _on_weights_loaded(self, event: ev.WeightsLoaded) -> None:
        taken = self.fleet.take(event.call)
        if taken is not None and taken[1] is not None:
            taken[1].version = event.version

    def _on_call_failed(self, event: ev.CallFailed) -> None:
        taken = self.fleet.take(event.call)
        if taken is None:
            return  # a call of a process already replaced (its loss was handled)
        call, worker = taken
        if call.kind == "poll":
            self.log(f"control actor did not answer ({event.detail}); `stabledrl scale` is unavailable")
        elif worker is None:
            return
        elif event.failure == "raised":
            self.stop(f"{call.what} failed: {event.detail}")
        elif call.kind == "start" and event.failure == "timed_out":
            why = f"did not start within cluster.start_timeout_s = {self.cfg.cluster.start_timeout_s:.0f} s ({event.detail})"
            if len(self.fleet.live()) - 1 < self.fleet.min_workers:
                self.stop(f"{call.what} {why}")
            else:
                self._drop(worker, why)
        else:
            self._lost(worker, event.failure, event.detail, event.node_alive, call, placeable=event.placeable)

    def _lost(self, worker: WorkerState, failure: str, detail: str, node_alive: bool, first: Any = None,
              placeable: bool = True, peers: bool = True) -> None:
        """Forget the worker's calls, re-queue its requests and evaluation part, then replace it,
        drop it (its node left) or stop the job (its restarts are used up, or it must be replaced
        and no node left could hold it). The other workers on a node that left are lost with it."""
        lost_with = self.fleet.node_left(worker) if not node_alive and peers else []
        calls = ([(0, first)] if first is not None else []) + self.fleet.forget(worker.index)
        requests = [r for _, c in calls for r in c.requests]
        if requests:
            self.staleness.abort(len(requests))
            self.requeue = sorted(self.requeue + requests, key=lambda r: r.uid)
        for run in (self.held_out_run, self.protocol_run):
            if run is not None:
                run.lost_worker(worker.index)
        hung = failure == "timed_out"
        self.counts["faults/rollout_worker_hangs" if hung else "faults/rollout_worker_deaths"] += 1
        field = "weights.timeout_s" if first is not None and first.kind == "load" else "rollout.request_timeout_s"
        what, reason = ("hung", f"no answer within {detail} ({field}); killed") if hung else ("died", detail)
        uids = ", ".join(str(r.uid) for r in requests) or "none"
        action = self.fleet.loss_action(worker, node_alive)
        if action == "remove":
            self._remove(worker)
            self.log(f"{worker.name} {what} while retiring ({reason}); prompts {uids} re-queued")
        elif action == "drop":
            self._drop(worker, f"lost with its node ({reason}); prompts {uids} re-queued")
        elif action == "replace" and not placeable:
            self.stop(f"{worker.name} was lost with its node and no node left in the cluster can hold a rollout "
                      f"worker (cluster.rollout: {self.cfg.cluster.rollout.num_cpus} CPU, "
                      f"{self.cfg.cluster.rollout.num_gpus} GPU each); fewer than rollout.min_workers = "
                      f"{self.fleet.min_workers} remain. The job stops; add a node, then `stabledrl train --resume "
                      f"{self.cfg.run.output_dir}` continues from its last checkpoint")
        elif action == "give_up":
            self.stop(f"{worker.name} {what} {worker.restarts + 1} times, the last time: {reason}; giving up "
                      f"(rollout.max_restarts = {self.fleet.max_restarts}). The job stops; "
                      f"`stabledrl train --resume {self.cfg.run.output_dir}` continues from its last checkpoint")
        else:
            new = self.fleet.replace(worker)
            self._start(new, True, f"{new.name} (replacement {new.restarts})")
            self.counts["faults/rollout_workers_replaced"] += 1
            where = "" if node_alive else (f" (its node left: it waits at most cluster.start_timeout_s = "
                                           f"{self.cfg.cluster.start_timeout_s:.0f} s for room on another node)")
            self.log(f"{worker.name} {what} ({reason}); prompts {uids} re-queued; replacement {new.restarts} of at "
                     f"most {self.fleet.max_restarts} starting{where}")
        for peer in lost_with:  # its node's other workers: gone too, whether or not their calls failed yet
            if self.stopped is None and self.fleet.get(peer.index) is peer:
                self._lost(peer, "died", f"its node left with {worker.name}", False, placeable=placeable, peers=False)

    def _drop(self, worker: WorkerState, why: str) -> None:
        self._remove(worker)
        self.fleet.target = min(self.fleet.target, len(self.fleet.alive()))  # the cluster shrank
        self.counts["faults/rollout_workers_dropped"] += 1
        self.log(f"{worker.name} {why}; continuing with {len(self.fleet.alive())} workers")

    def _remove(self, worker: WorkerState) -> None:
        self.fleet.remove(worker)
        self.emit(ev.RemoveWorker(worker.index))

    def _on_control_polled(self, event: ev.ControlPolled) -> None:
        """Between steps: the size `stabledrl scale` asked for, or (autoscale) room for one more."""
        self.fleet.take(event.call)
        if event.requested is not None and self.fleet.autoscale:
            self.log("autoscale off: `stabledrl scale` set the size")
        added, retiring = self.fleet.resize(event.requested, event.room)
        for n, worker in enumerate(added, start=len(self.fleet.live()) - len(added) + 1):
            self._start(worker, False, f"{worker.name} (added)")
            self.counts["elastic/workers_added"] += 1
            self.log(f"{worker.name} starting ({n} of {self.fleet.target} workers)")
        for worker in retiring:
            self.log(f"{worker.name} retiring ({self.fleet.target} workers requested)")

    def _retire_idle(self) -> None:
        receivers = self.push.receivers if self.push is not None else {}
        for worker in [w for w in self.fleet.workers.values() if w.state == "retiring"]:
            if worker.index not in receivers and not self.fleet.busy(worker.index):
                self._remove(worker)
                self.counts["elastic/workers_retired"] += 1
                self.log(f"{worker.name} retired; {len(self.fleet.live())} workers")

    def _on_stalled(self, event: ev.Stalled) -> None:
        self.stop(f"the loop has nothing to wait for: no rollout admitted, no step running and no worker starting "
                  f"(buffer {len(self.buffer)} groups, capacity {self.staleness.capacity()}, "
                  f"{len(self.fleet.active())} active workers)")

    # ---- output -------------------------------------------------------------------------------
    def emit(self, command: Any) -> None:
        self.out.append(command)

    def log(self, line: str) -> None:
        self.emit(ev.Log(line))

    def stop(self, reason: str) -> None:
        if self.stopped is None:
            self.stopped = reason
            self.emit(ev.Stop(reason))
