"""The job driver: owns the policy version, the prompt stream and the staleness bound; wires the
rollout workers to the learner ranks.

    driver = Driver(load_job_config("deploy/configs/quickstart.yaml"))
    result = driver.run()          # warm start, actors, eval, train loop, eval, checkpoint

The loop (``train``) is event-driven over Ray object refs: rollout requests, the learner's step
and the workers' weight acknowledgements each finish when they finish, and nothing waits on a
whole-batch barrier. How far rollouts may run ahead is the staleness controller's admission bound
(AReaL): with η = 0 the next batch's prompts are admitted only after the weights they must be
sampled with exist (synchronous RL); with η ≥ 1 the next batch is generated while the learner
trains on this one. Weights reach a worker in order with its requests (Ray runs an actor's calls
in submission order), so every request submitted after a push is sampled with the new version.

Rollout workers come and go while the loop runs (coordinator/workers.py): a worker whose process
dies has its requests re-queued under their uids (so they are sampled again with the same seeds)
and is replaced; workers are added or retired between steps. A learner rank that fails ends the
job at once, naming the rank; ``stabledrl train --resume RUN_DIR`` continues from the last
checkpoint (coordinator/checkpoint.py), which holds everything the next steps depend on.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import ray

from common.actor_time import ActorTimes, split_clock
from common.config.job import JobConfig, check_resources
from common.metrics import MetricsLogger
from common.models.loading import load_model_tokenizer
from common.tasks import PromptStream, load_task_data
from common.tasks.sandbox import check_failure_rate
from coordinator import checkpoint
from coordinator.actors import ActorFailure, Actors, start_actors
from coordinator.buffer import GroupBuffer
from coordinator.evaluation import HeldOutResult, evaluate_held_out
from coordinator.inflight import Inflight, Pending
from coordinator.staleness import StalenessController
from coordinator.resume import Checkpoints
from coordinator.step_metrics import data_metrics, forwards_per_estimate, merge_ranks, perf_metrics, rollout_metrics
from coordinator.workers import WorkerEvents
from learner.worker import LearnerWorker
from rollout.workflow import Episode, PromptRequest
from rollout.worker import RolloutWorker


@dataclass
class RunResult:
    steps: int
    version: int
    before: Optional[HeldOutResult]
    after: Optional[HeldOutResult]
    output_dir: str


class Driver(WorkerEvents, Checkpoints):
    def __init__(self, cfg: JobConfig, *, rollout_cls: type = RolloutWorker, learner_cls: type = LearnerWorker,
                 log: Callable[[str], None] = print, record_batches: bool = False) -> None:
        self.cfg = self.job_cfg = cfg  # job_cfg stays as given (a warm start changes cfg.model.path)
        self.rollout_cls, self.learner_cls, self.log = rollout_cls, learner_cls, log
        self.record_batches = record_batches
        self.batches: list[list[Episode]] = []  # the batch of every step (tests read it)
        self.step = 0
        self.next_uid = 0
        self.requeue: list[PromptRequest] = []  # not admitted: a dead worker's requests, by uid
        a, r = cfg.algorithm, cfg.rollout
        self.depth = math.ceil((a.max_staleness + 1) * a.groups_per_step / r.prompts_per_request) if a.in_order \
            else r.requests_per_worker  # requests queued per worker (in order: every admitted one at once)
        self.inflight = Inflight({"rollout": r.request_timeout_s * (self.depth if a.in_order else 1),
                                  "train": r.request_timeout_s, "start": cfg.cluster.start_timeout_s,
                                  # an ack waits behind the worker's queued requests, then for the transfer
                                  "ack": r.request_timeout_s * self.depth + cfg.weights.timeout_s})
        self.training: Optional[dict[str, Any]] = None
        self.staleness = StalenessController(a.max_staleness, a.groups_per_step)
        self.buffer = GroupBuffer(self.staleness)
        self.actors: Optional[Actors] = None
        self.metrics: Optional[MetricsLogger] = None
        self.history: list[dict[str, float]] = []
        self.reward_calls: dict[str, float] = {}
        self.shapes: Optional[dict[str, list[int]]] = None
        self.actor_times = ActorTimes()  # time/<actor>/*: each actor's own clock (common/actor_time.py)
        self.pending_save: Optional[checkpoint.PendingSave] = None  # a checkpoint written in the background
        WorkerEvents.__init__(self)

    # ---- the run --------------------------------------------------------------------------
    def run(self) -> RunResult:
        try:
            self.setup()
            before = self.evaluate()
            self.train()
            self.drain()
            self.log_reward_stats()
            after = self.evaluate()
            if self.cfg.run.save_final_checkpoint:
                self.save_checkpoint()
            if self.cfg.run.export_final:
                self.export()
            self.finish_checkpoint()
        finally:
            self.close()
        if before is not None and after is not None:
            self.log(f"held-out accuracy: {100 * before.pass_at_1:.1f}% -> {100 * after.pass_at_1:.1f}% "
                     f"(pass@1, {self.cfg.eval.describe(self.cfg.sampler)}, {after.num_prompts} prompts never trained on)")
        else:
            self.log("held-out accuracy: n/a (the task has no held-out rows: set task.held_out)")
        return RunResult(self.step, self.staleness.version, before, after, str(self.cfg.run.output_dir))

    def setup(self) -> None:
        """Everything that can refuse the job runs before the first actor starts: the resources
        the cluster offers, the checkpoint to resume from, the data."""
        t0 = time.perf_counter()
        cfg = self.cfg
        check_resources(cfg, ray.cluster_resources())
        resume = None
        if cfg.run.resume_from is not None:
            resume = checkpoint.verify(cfg.run.resume_from, self.config_json(), self.log)
        if cfg.warmstart is not None:
            from recipes.warmstart import warm_start

            path = warm_start(cfg, log=self.log)
            self.log(f"warm start: {path} ({time.perf_counter() - t0:.1f} s)")
            model = cfg.model.model_copy(update={"path": path, "preset": None, "preset_shape": None})
            self.cfg = cfg = cfg.model_copy(update={"model": model})
        data = load_task_data(cfg.task, tokenizer=load_model_tokenizer(cfg.model))  # max_prompt_tokens in model tokens
        self.rows = {r.prompt_id: r for r in data.train}
        self.held_out = data.held_out[: cfg.eval.num_prompts]
        self.stream = PromptStream(data.train, seed=cfg.run.seed)
        self.write_config()
        if resume is not None:
            dropped = checkpoint.restore_metrics(cfg.run.output_dir, int(resume.state["step"]))
            if dropped:
                self.log(f"metrics.jsonl: {dropped} lines after step {resume.state['step']} removed (they are "
                         "recomputed; the old file is metrics.before_resume.jsonl)")
        self.metrics = MetricsLogger(cfg.run.output_dir, tensorboard=cfg.run.tensorboard,
                                     wandb_project=cfg.run.wandb_project, run_config=cfg.model_dump(mode="json"),
                                     append=resume is not None)
        self.log_data(data.reports)
        t1 = time.perf_counter()
        self.start_control()
        self.actors = start_actors(cfg, rollout_cls=self.rollout_cls, learner_cls=self.learner_cls, log=self.log)
        self.setup_weight_push()
        if resume is not None:
            self.restore(resume)
        self.startup = {"time/startup_prepare": t1 - t0, "time/startup_actors": time.perf_counter() - t1}
        self.log(f"{len(data.train)} training prompts, {len(self.held_out)} held-out; startup "
                 f"{time.perf_counter() - t0:.1f} s")

    def train(self) -> None:
        """The asynchronous loop (module docstring)."""
        from tqdm import tqdm

        steps, batch_size = self.cfg.run.steps, self.cfg.algorithm.groups_per_step
        bar = tqdm(total=steps, initial=self.step, desc="train", disable=not self.cfg.run.progress or not _tty(),
                   dynamic_ncols=True)
        self.last_step_end = time.perf_counter()
        while self.step < steps:
            self.feed_workers()  # admit every rollout the staleness bound allows
            if self.training is None:
                before = self.first_outstanding() if self.cfg.algorithm.in_order else None
                batch = self.buffer.take(batch_size, before=before)  # groups older than η are dropped, counted
                if batch is not None:
                    self.start_training(batch)
            for record in self.handle_events():
                bar.update(1)
                bar.set_postfix(reward=f"{record['rollout/reward_mean']:.3f}", loss=f"{record['train/loss']:.4f}",
                                dropped=int(record["staleness/dropped_total"]))
                if self.cfg.run.progress and bar.disable and self.step % max(1, steps // 20) == 0:
                    self.log(progress_line(self.step, steps, record))  # a log file gets lines, not a bar
        bar.close()

    # ---- rollouts ---------------------------------------------------------------------------
    def next_request(self) -> PromptRequest:
        if self.requeue:
            return self.requeue.pop(0)
        request = PromptRequest(self.next_uid, self.stream.next())
        self.next_uid += 1
        return request

    def first_outstanding(self) -> Optional[int]:
        """The oldest uid admitted or re-queued and not yet back (in-order batches wait for it)."""
        uids = [r.uid for r in self.inflight.requests()] + [r.uid for r in self.requeue]
        return min(uids) if uids else None

    def feed_workers(self) -> None:
        """Give each active worker requests up to its queue depth while the admission bound allows."""
        per_request = self.cfg.rollout.prompts_per_request
        queued = {w.index: self.inflight.queued(w.index) for w in self.pool.active()}
        while queued:
            index = min(queued, key=queued.__getitem__)
            n = min(per_request, self.staleness.capacity())
            if queued[index] >= self.depth or n == 0 or not self.staleness.try_start(n):
                return
            requests = tuple(self.next_request() for _ in range(n))
            worker = self.pool[index]
            uids = f"{requests[0].uid}..{requests[-1].uid}" if n > 1 else str(requests[0].uid)
            self.inflight.add(worker.actor.generate.remote(list(requests)),
                              Pending("rollout", f"{worker.name} (prompts {uids})", worker=index,
                                      incarnation=worker.restarts, requests=requests))
            queued[index] += 1

    def on_rollout(self, job: Pending, episodes: list[Episode]) -> None:
        if episodes:
            episodes[0].stats, clock = split_clock(episodes[0].stats)
            self.actor_times.update(f"rollout{job.worker}", clock)
        for episode in episodes:
            for key, value in episode.stats.items():
                if key.startswith("reward_calls/"):
                    self.reward_calls[key] = self.reward_calls.get(key, 0.0) + value
            self.buffer.add(episode)
        check_failure_rate(self.reward_calls, self.cfg.task)  # stop rather than train on zeros

    # ---- learner steps and weights ------------------------------------------------------------
    def start_training(self, batch: list[Episode]) -> None:
        refs = self.actors.train([e.group for e in batch], self.staleness.version)
        for rank, ref in enumerate(refs):
            self.inflight.add(ref, Pending("train", f"learner rank {rank} (step {self.step + 1})"))
        self.training = {"refs": refs, "results": {}, "batch": batch, "start": time.perf_counter()}

    def on_train(self, ref: ray.ObjectRef, job: Pending) -> Optional[dict[str, float]]:
        """A rank's result; the step's record once every rank is back. A rank that failed or died
        ends the job now (the others may be stuck in a collective with it): fail fast, name it."""
        try:
            self.training["results"][ref] = ray.get(ref)
        except ray.exceptions.RayError as e:
            raise ActorFailure(self.learner_failure(ref, job, e)) from e
        if len(self.training["results"]) == len(self.training["refs"]):
            return self.finish_step()
        return None

    def learner_failure(self, ref: ray.ObjectRef, job: Pending, error: Exception) -> str:
        """What failed: a rank that died is named first (its peers then fail in their collectives),
        then ranks that raised, then ranks still running (stalled, or stuck waiting for the others)."""
        others = {r: j for r, j in self.inflight.jobs.items() if j.kind == "train"}
        if others:  # give the peers a moment to fail too, so that the dead rank is the one named
            ray.wait(list(others), num_returns=len(others), timeout=5)
        died, failed, running = [], [], []
        for r, j in [(ref, job), *others.items()]:
            if not ray.wait([r], timeout=0)[0]:
                running.append(j)
                continue
            try:
                ray.get(r)
            except ray.exceptions.RayActorError as e:
                died.append(f"{j.what} died ({_first_line(e)})")
            except ray.exceptions.RayError as e:
                failed.append(f"{j.what} failed: {_first_line(getattr(e, 'cause', None) or e)}")
        parts = died + failed + ([f"still running: {self.inflight.describe(running)}"] if running else [])
        return ("; ".join(parts) + f". The job stops; `stabledrl train --resume {self.cfg.run.output_dir}` continues "
                "from its last checkpoint")

    def finish_step(self) -> dict[str, float]:
        batch, start = self.training["batch"], self.training["start"]
        results = []
        for rank, ref in enumerate(self.training["refs"]):
            result, clock = split_clock(self.training["results"][ref])
            self.actor_times.update(f"learner{rank}", clock)
            results.append(result)
        train_s = time.perf_counter() - start
        version = self.staleness.advance()
        push_s = self.push_weights(version)
        self.step += 1
        self.training = None
        if self.record_batches:
            self.batches.append(batch)
        record = self.log_step(batch, results, train_s, push_s)
        every = self.cfg.run.checkpoint_every
        if every and self.step % every == 0 and self.step < self.cfg.run.steps:
            self.save_checkpoint()
        if self.cfg.eval.every and self.step % self.cfg.eval.every == 0 and self.step < self.cfg.run.steps:
            self.evaluate()
        self.poll_checkpoint()
        self.between_steps()
        return record

    # ---- waiting ------------------------------------------------------------------------------
    def handle_events(self) -> list[dict[str, float]]:
        """Handle every call that finished (at least one) and every late one; returns the records
        of the steps that finished. A late call fails the job naming it, except a worker's start."""
        if not len(self.inflight):
            raise ActorFailure("the loop has nothing to wait for: no rollout admitted, no step running and no "
                               f"worker starting (buffer {len(self.buffer)} groups, capacity {self.staleness.capacity()}, "
                               f"{len(self.pool.active())} active workers)")
        ready, late = self.wait_any()
        records = []
        for i, (ref, job) in enumerate(ready):
            try:
                if job.kind == "train":
                    record = self.on_train(ref, job)
                    if record is not None:
                        records.append(record)
                else:
                    self.on_worker_result(ref, job)
            except BaseException:  # the job fails: the calls not handled yet stay owed, none is lost
                for unhandled in ready[i + 1 :]:
                    self.inflight.add(*unhandled)
                raise
        fatal = []
        for ref, job in late:
            if job.kind == "start" and ref in self.inflight:
                self.on_start_timeout(ref, job)
            elif ref in self.inflight:
                fatal.append(job)
        if fatal:
            raise ActorFailure("no answer within the timeout from: " + self.inflight.describe(fatal))
        self.retire_idle()
        return records

    def wait_any(self) -> tuple[list[tuple[ray.ObjectRef, Pending]], list[tuple[ray.ObjectRef, Pending]]]:
        """(finished calls, late calls) of the loop (Inflight.wait_any); a subclass may stop here."""
        return self.inflight.wait_any()

    def drain(self) -> None:
        """Let admitted rollouts, weight acks and starting workers finish (no new admissions)."""
        while len(self.inflight):
            self.handle_events()

    # ---- logging, evaluation, checkpoints -------------------------------------------------------
    def log_step(self, batch: list[Episode], results: list[dict[str, float]], train_s: float,
                 push_s: float) -> dict[str, float]:
        now = time.perf_counter()
        step_s, self.last_step_end = now - self.last_step_end, now
        info, a = self.actors.info, self.cfg.algorithm
        record = {**rollout_metrics(batch), **merge_ranks(results), **self.staleness.step_metrics()}
        record.update({"time/step": step_s, "time/train": train_s, "time/weight_push": push_s,
                       "time/generate": record["rollout/generate_s"], "version": float(self.staleness.version),
                       "rollout/empty_groups_total": float(self.buffer.empty), **self.worker_metrics(),
                       **{f"rollout/{k}": v for k, v in self.reward_calls.items()}, **self.actor_times.step_metrics()})
        sequence_tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for e in batch for s in e.group.samples)
        record.update(perf_metrics(
            step_s=step_s, train_s=train_s, samples=record["learner/samples"], tokens=record["learner/tokens"],
            sequence_tokens=sequence_tokens, inner_iterations=a.inner_iterations,
            forwards_per_estimate=forwards_per_estimate(self.cfg.estimator),
            parameters=info["rollouts"][0]["parameters"], learner_devices=len(self.actors.learners),
            peak_tflops=self.cfg.run.peak_tflops))
        if self.step == 1:
            record.update(self.startup)
        self.history.append(self.metrics.log(self.step, record))
        return record

    def log_data(self, reports: list[Any]) -> None:
        """Rows read, kept and skipped by reason (task.on_bad_row: skip), in the log and as data/*."""
        for report in reports:
            if report.n_skipped:
                reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(report.skipped.items()))
                examples = "; ".join(report.examples[:3])
                self.log(f"data: {report.source}: kept {report.kept} of {report.read} rows, skipped {reasons}"
                         + (f" (e.g. {examples})" if examples else ""))
        self.metrics.log(self.step, data_metrics(reports))

    def log_reward_stats(self) -> None:
        """The reward calls of the whole run, counted from the delivered requests (failures isolated)."""
        total = {f"rollout/{k}": v for k, v in self.reward_calls.items()}
        self.metrics.log(self.step, total)
        failed, calls = total.get("rollout/reward_calls/failed", 0), total.get("rollout/reward_calls/calls", 0)
        if failed:
            self.log(f"reward: {int(failed)} of {int(calls)} calls failed (see rollout/reward_calls/* in metrics.jsonl)")

    def evaluate(self) -> Optional[HeldOutResult]:
        if not self.held_out:
            return None
        e = self.cfg.eval
        result = evaluate_held_out(self.actors.rollouts, self.held_out, e.samples_per_prompt, e.seed,
                                   self.cfg.rollout.request_timeout_s, e.sampler_for(self.cfg.sampler))
        self.metrics.log(self.step, result.metrics())
        self.log(f"step {self.step}: held-out pass@1 {100 * result.pass_at_1:.1f}% on {result.num_prompts} prompts "
                 f"({e.describe(self.cfg.sampler)}, weights version {result.version}, {result.time_s:.1f} s)")
        return result

    def close(self) -> None:
        if self.pending_save is not None:  # the job failed after a save began: complete it if its files are durable
            self.finish_checkpoint(timeout_s=0.0)
        if self.metrics is not None:
            self.metrics.close()
        if self.actors is not None:
            self.versions_at_close = self.worker_versions
            self.actors.shutdown()
            self.actors = None
        self.stop_control()


def _first_line(e: BaseException) -> str:
    lines = [line for line in str(e).strip().splitlines() if line.strip()]
    return lines[-1][:400] if lines else type(e).__name__


def _tty() -> bool:
    import sys

    return sys.stderr.isatty()


def progress_line(step: int, steps: int, record: dict[str, float]) -> str:
    return (f"step {step}/{steps}: reward {record['rollout/reward_mean']:.3f}, loss {record['train/loss']:.4f}, "
            f"grad norm {record['train/grad_norm']:.3f}, staleness {record['staleness/mean']:.2f} "
            f"(dropped {int(record['staleness/dropped_total'])}), {record['time/step']:.2f} s/step")
