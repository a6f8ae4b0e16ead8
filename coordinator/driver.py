"""The job driver: sets the job up, then joins the scheduler (decisions) to the runtime (Ray).

    driver = Driver(load_job_config("deploy/configs/quickstart.yaml"))
    result = driver.run()          # warm start, actors, eval, train loop, eval, checkpoint, export

``setup`` does everything that can refuse the job before the first actor starts (resources,
the checkpoint to resume from, the data: coordinator/job_setup.py), then starts the actors and the
weight transport. The
warm start and the in-training protocol evaluation are recipes: the command layer passes them in
(``stages``, stabledrl/recipes/stages.py), so nothing here imports upward.
Every phase after it is a goal of the scheduler (coordinator/decisions/scheduler.py), reached by one loop,
``_drive``: carry out the scheduler's commands (coordinator/runtime/executor.py turns them into Ray calls),
wait for what they started, hand each event back to the scheduler, until the goal is reached.
How far rollouts run ahead of the learner is the staleness bound (η = 0: synchronous RL; η >= 1:
the next batch is sampled while the learner trains on this one). ``stabledrl train --resume
RUN_DIR`` continues from the last checkpoint (coordinator/runtime/checkpoint.py).
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Optional

import ray

from stabledrl.common.config.job import JobConfig
from stabledrl.common.metrics import MetricsLogger
from stabledrl.common.tasks import PromptStream
from stabledrl.common.trust.seal import EXPORT_CONFIG
from stabledrl.common.types import Episode
from stabledrl.common.transport.clocks import push_metrics
from stabledrl.common.transport.plan import PushInputs, plan_push
from stabledrl.coordinator.runtime import checkpoint
from stabledrl.coordinator.decisions import events as ev
from stabledrl.coordinator.decisions import held_out
from stabledrl.coordinator.runtime.actors import start_actors
from stabledrl.coordinator.runtime.control import start_control
from stabledrl.coordinator.decisions.held_out import HeldOutResult
from stabledrl.coordinator.job_setup import (
    NO_STAGES, Stages, config_json, load_checkpoint, log_data, prepare, write_config,
)
from stabledrl.coordinator.progress import Progress
from stabledrl.coordinator.runtime.executor import RayRuntime
from stabledrl.coordinator.decisions.scheduler import Scheduler
from stabledrl.coordinator.decisions.snapshot import SchedulerSnapshot
from stabledrl.coordinator.runtime.weight_sync import WeightSync
from stabledrl.learner.worker import LearnerWorker
from stabledrl.rollout.worker import RolloutWorker

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    steps: int
    version: int
    before: Optional[HeldOutResult]  # a resumed run: its own first evaluation (step 0), from metrics.jsonl
    after: Optional[HeldOutResult]
    output_dir: str


class DeadlineReached(RuntimeError):
    """The driver's ``deadline`` (wall-clock seconds since the epoch) passed while it ran."""


class Driver:
    def __init__(self, cfg: JobConfig, *, rollout_cls: type = RolloutWorker, learner_cls: type = LearnerWorker,
                 record_batches: bool = False, deadline: Optional[float] = None, stages: Stages = NO_STAGES) -> None:
        self.cfg = self.job_cfg = cfg  # job_cfg stays as given (a warm start changes cfg.model.path)
        self.rollout_cls, self.learner_cls = rollout_cls, learner_cls
        self.record_batches, self.deadline, self.stages = record_batches, deadline, stages
        self.history: list[dict[str, float]] = []  # every step's metrics.jsonl record
        self.batches: list[list[Episode]] = []  # every step's batch (with record_batches: tests read it)
        self.evaluations: list[HeldOutResult] = []  # every held-out evaluation of the run, BEFORE first
        self.scheduler: Optional[Scheduler] = None
        self.runtime: Optional[RayRuntime] = None
        self.metrics: Optional[MetricsLogger] = None
        self.control: Any = None
        self.progress: Optional[Progress] = None

    # ---- the run --------------------------------------------------------------------------------
    def run(self) -> RunResult:
        try:
            self.setup()
            before = self.evaluate() if self.evaluation_due() else None
            self.train()
            self.drain()
            self.log_reward_totals()
            after = self.evaluate()
            if self.cfg.run.save_final_checkpoint:
                self.save_checkpoint()
            if self.cfg.run.export_final:
                self.export()
            self.finish_checkpoint(self.cfg.cluster.start_timeout_s)
        finally:
            self.close()
        self.evaluations = list(self.scheduler.snapshot().evaluations)
        if self.cfg.run.resume_from is not None:  # the run's own BEFORE and evaluations, not this process's
            before = self.first_evaluation() or before
            self.evaluations = self.recorded_evaluations() or self.evaluations
        if before is not None and after is not None:
            log.info(f"held-out accuracy: {100 * before.pass_at_1:.1f}% -> {100 * after.pass_at_1:.1f}% "
                     f"± {100 * after.stderr:.1f} (pass@1, {self.cfg.eval.describe(self.cfg.sampler)}, "
                     f"{after.num_prompts} prompts never trained on; ± one standard error over the prompts"
                     f"{self.final_window_text()})")
        else:
            log.info("held-out accuracy: n/a (the task has no held-out rows: set task.held_out)")
        return RunResult(self.step, self.scheduler.snapshot().version, before, after, str(self.cfg.run.output_dir))

    def setup(self) -> None:
        """Everything that can refuse the job runs before the first actor starts: the resources
        the cluster offers, the checkpoint to resume from, the data."""
        job = prepare(self.cfg, self.stages, self.config_json())
        self.cfg = cfg = job.cfg
        self.rows, resume, data = job.rows, job.resume, job.data
        self.metrics = MetricsLogger(cfg.run.output_dir, tensorboard=cfg.run.tensorboard,
                                     wandb_project=cfg.run.wandb_project, run_config=cfg.model_dump(mode="json"),
                                     append=resume is not None)
        log_data(data.reports, self.metrics, record=resume is None)
        t1 = time.perf_counter()
        t0 = t1 - job.seconds
        c = cfg.cluster
        inputs = PushInputs.of(cfg)
        plan = plan_push(inputs)  # the weight push at the start: the scheduler, the pool and the sync read it
        self.scheduler = Scheduler(cfg, PromptStream(data.train, seed=cfg.run.seed), job.held_out,
                                   collective_push=plan.collective)
        self.control = start_control(cfg.run.job_name, cfg.rollout.min_workers, cfg.rollout.worker_limit)
        actors = start_actors(cfg, plan, rollout_cls=self.rollout_cls, learner_cls=self.learner_cls)
        sync = WeightSync(inputs, actors, c.start_timeout_s, plan=plan)
        self.runtime = RayRuntime(actors, sync, control=self.control,
                                  output_dir=cfg.run.output_dir, config=self.config_json(),
                                  start_timeout_s=c.start_timeout_s, autoscale=cfg.rollout.autoscale,
                                  protocol=self.stages.protocol_eval(cfg) if cfg.eval.protocol is not None else None,
                                  async_checkpoint=cfg.run.async_checkpoint)
        self.runtime.sync.setup(self.runtime.nodes)
        workers = dict(enumerate(actors.info["rollouts"]))
        self.scheduler.handle(ev.JobStarted(workers, len(actors.learners)))
        if resume is not None:
            self.restore(resume)
        self.scheduler.handle(ev.StartupTimed({"time/startup_prepare": t1 - t0,
                                               "time/startup_actors": time.perf_counter() - t1}))
        log.info(f"{len(data.train)} training prompts, {len(job.held_out)} held-out; startup "
                 f"{time.perf_counter() - t0:.1f} s")

    def evaluate(self) -> Optional[HeldOutResult]:
        """Held-out pass@k with the current weights (None when the task has no held-out rows)."""
        self._drive(self.scheduler.begin("evaluate"))
        return self.scheduler.snapshot().last_eval

    def evaluation_due(self) -> bool:
        """Whether the evaluation before training is one of the run's: always for a new run; for a
        resumed one only where an uninterrupted run evaluates at the checkpoint's step (and not at
        the last step: the evaluation after training is that one) and metrics.jsonl lacks it (the
        process stopped between its checkpoint and its evaluation). So a resumed run's metrics read
        as the uninterrupted run's."""
        if self.cfg.run.resume_from is None:
            return True
        step, every, steps = self.step, self.cfg.eval.every, self.cfg.run.steps
        if step >= steps or not held_out.scheduled_evaluation(step, every, steps):
            return False
        protocol = self.cfg.eval.protocol is not None and not self.scheduler.evaluation.held_out
        return step not in held_out.evaluated_steps(self.cfg.run.output_dir, protocol=protocol)

    def final_window_text(self) -> str:
        """'; mean of the last N evaluations: X%' over the evaluations after BEFORE (eval.final_window > 1
        and at least two of them), else ''."""
        window = self.evaluations[1:][-self.cfg.eval.final_window :]
        if self.cfg.eval.final_window == 1 or len(window) < 2:
            return ""
        mean = sum(r.pass_at_1 for r in window) / len(window)
        return f"; mean of the last {len(window)} evaluations: {100 * mean:.1f}%"

    def train(self) -> None:
        """Train to ``run.steps``, rollouts running ahead as far as the staleness bound allows."""
        run = self.cfg.run
        self.progress = Progress(run.steps, self.step, run.progress, every_s=run.progress_every_s)
        try:
            self._drive(self.scheduler.begin("train", at=time.perf_counter()))
        finally:
            self.progress.close()
            self.progress = None

    def drain(self) -> None:
        """Let admitted rollouts, weight loads and starting workers finish (no new admissions)."""
        self._drive(self.scheduler.begin("drain"))

    def save_checkpoint(self) -> None:
        self._drive(self.scheduler.begin("checkpoint"))

    def finish_checkpoint(self, timeout_s: float) -> None:
        """Complete a checkpoint still written in the background (``run.async_checkpoint``), waiting
        at most ``timeout_s`` for its files; one unwritten after that stays incomplete, and said so."""
        for event in self.runtime.finish_save(timeout_s):
            log.info(event.line)

    def export(self) -> None:
        """The trained policy in its family's released format (final_model) and, for a LoRA run, its
        adapters as a PEFT folder for the base model (final_adapter): docs/exports.md. Each carries
        the job's sealed config (`stabledrl eval --model DIR` / `--adapter DIR` needs no other)."""
        directory = self.cfg.run.output_dir / "final_model"
        adapters = self.cfg.run.output_dir / "final_adapter" if self.cfg.learner.lora is not None else None
        self.runtime.export(directory, adapters)
        for exported in (directory, adapters):
            if exported is not None:
                write_config(self.cfg, self.config_json(), exported / EXPORT_CONFIG)
        log.info(f"policy exported: {directory} (model.path={directory} loads it)")
        if adapters is not None:
            log.info(f"LoRA adapters exported: {adapters} (a PEFT folder for model.path; `stabledrl eval --adapter "
                     f"{adapters}` evaluates them unmerged)")

    def close(self) -> None:
        if self.runtime is not None and self.runtime.saving is not None:
            try:  # the job failed after a save began: complete it if its files are durable
                self.finish_checkpoint(0.0)
            except checkpoint.CheckpointError as e:
                log.info(str(e))
        if self.metrics is not None:
            self.metrics.close()
        if self.runtime is not None:
            self.runtime.close()
        elif self.control is not None:
            ray.kill(self.control)
        self.runtime = self.control = None

    # ---- the loop -------------------------------------------------------------------------------
    def _drive(self, commands: list[ev.Command]) -> None:
        """Carry out commands, wait for what they started, hand each event to the scheduler, until
        the scheduler's goal is reached (or a Stop command ends the job)."""
        pending = deque(commands)
        while True:
            while pending:
                pending.extend(self._carry_out(pending.popleft()))
            if self.scheduler.done:
                return
            if self.deadline is not None and time.time() > self.deadline:
                raise DeadlineReached(f"deadline reached at step {self.step}")
            for event in self.runtime.wait():
                pending.extend(self.scheduler.handle(event))

    def _carry_out(self, command: ev.Command) -> list[ev.Command]:
        """The driver's own commands here; the rest by the runtime (its events answered at once)."""
        match command:
            case ev.Log(line):
                log.info(line)
            case ev.Record():
                self._record(command)
            case ev.Stop(reason):
                raise ev.ActorFailure(reason)
            case _:
                return [c for event in self.runtime.execute(command) for c in self.scheduler.handle(event)]
        return []

    def _record(self, command: ev.Record) -> None:
        metrics = command.metrics
        if command.batch is not None:  # a step's record: every actor's time since the step before
            times = self.runtime.times.step_metrics()
            metrics = {**metrics, **times, **push_metrics(times)}
        written = self.metrics.log(command.step, metrics)
        if command.batch is None:
            return
        self.history.append(written)
        if self.record_batches:
            self.batches.append(command.batch)
        if self.progress is not None:
            self.progress.step(command.step, written)

    # ---- checkpoints and logs -------------------------------------------------------------------
    def config_json(self) -> dict[str, Any]:
        """The job's config as given, without run.resume_from (coordinator/job_setup.py)."""
        return config_json(self.job_cfg)

    def write_config(self) -> None:
        write_config(self.cfg, self.config_json())

    def restore(self, resume: checkpoint.Resume) -> None:
        """After ``checkpoint.verify`` accepted the files and the config, and the actors started:
        check the model's shapes, load every learner rank, restore the scheduler's state and push
        the restored weights to every worker."""
        where = load_checkpoint(resume, self.runtime, self.scheduler, self.rows, self.cfg)
        self._drive(self.scheduler.begin("restore"))
        log.info(f"resumed at step {self.step} (weights version {self.scheduler.snapshot().version}, "
                 f"{len(resume.episodes)} buffered groups) from {where}")

    def first_evaluation(self) -> Optional[HeldOutResult]:
        """The run's evaluation at step 0, as metrics.jsonl recorded it (a resumed run's BEFORE)."""
        return held_out.first_evaluation(self.cfg.run.output_dir)

    def recorded_evaluations(self) -> list[HeldOutResult]:
        """The run's held-out evaluations, at the steps an uninterrupted run evaluates (metrics.jsonl)."""
        return held_out.recorded_evaluations(self.cfg.run.output_dir, self.cfg.eval.every, self.cfg.run.steps)

    def log_reward_totals(self) -> None:
        """The reward calls of the whole run, counted from the delivered requests (failures isolated)."""
        total = dict(self.scheduler.snapshot().reward_totals)
        self.metrics.log(self.step, total)
        failed, calls = total.get("rollout/reward_calls/failed", 0), total.get("rollout/reward_calls/calls", 0)
        if failed:
            log.info(
                f"reward: {int(failed)} of {int(calls)} calls failed (see rollout/reward_calls/* in metrics.jsonl)"
            )

    # ---- what tests and tools read --------------------------------------------------------------
    @property
    def step(self) -> int:
        return self.scheduler.step if self.scheduler is not None else 0

    @property
    def pending_save(self) -> Optional[checkpoint.PendingSave]:
        """A checkpoint still being written in the background (None when none is)."""
        return self.runtime.saving if self.runtime is not None else None

    @property
    def actors(self) -> Any:
        """The job's actors (None before setup and after close)."""
        return self.runtime.actors if self.runtime is not None else None

    def active_rollouts(self) -> list[Any]:
        """The handles of the active rollout workers, by index (a test asks them for their weights)."""
        return [self.runtime.actors.pool[w.index] for w in sorted(self.scheduler.fleet.active(), key=lambda w: w.index)]

    def snapshot(self) -> SchedulerSnapshot:
        """The scheduler's state as one frozen value: step, versions, uids, counts, evaluations
        (coordinator/decisions/snapshot.py)."""
        return self.scheduler.snapshot()
