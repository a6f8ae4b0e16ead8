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
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import ray

from common.config.job import JobConfig
from common.metrics import MetricsLogger
from common.tasks import PromptStream, load_task_data
from common.transport.weights import transfer_weights
from coordinator import checkpoint
from coordinator.actors import ActorFailure, Actors, start_actors, wait
from coordinator.buffer import GroupBuffer
from coordinator.evaluation import HeldOutResult, evaluate_held_out
from coordinator.staleness import StalenessController
from coordinator.step_metrics import forwards_per_estimate, merge_ranks, perf_metrics, rollout_metrics
from learner.worker import LearnerWorker
from rollout.workflow import Episode, PromptRequest
from rollout.worker import RolloutWorker


@dataclass
class Pending:
    """A call the loop waits for; ``what`` names it when it times out or fails."""

    kind: str  # "rollout" | "train" | "ack"
    what: str
    since: float = field(default_factory=time.perf_counter)
    worker: int = -1
    requests: tuple[PromptRequest, ...] = ()


@dataclass
class RunResult:
    steps: int
    version: int
    before: Optional[HeldOutResult]
    after: Optional[HeldOutResult]
    output_dir: str


class Driver:
    def __init__(self, cfg: JobConfig, *, rollout_cls: type = RolloutWorker, learner_cls: type = LearnerWorker,
                 log: Callable[[str], None] = print, record_batches: bool = False) -> None:
        self.cfg, self.rollout_cls, self.learner_cls, self.log = cfg, rollout_cls, learner_cls, log
        self.record_batches = record_batches
        self.batches: list[list[Episode]] = []  # the batch of every step (tests read it)
        self.step = 0
        self.next_uid = 0
        self.requeue: list[PromptRequest] = []
        self.pending: dict[ray.ObjectRef, Pending] = {}
        self.training: Optional[dict[str, Any]] = None
        self.staleness = StalenessController(cfg.algorithm.max_staleness, cfg.algorithm.groups_per_step)
        self.buffer = GroupBuffer(self.staleness)
        self.actors: Optional[Actors] = None
        self.metrics: Optional[MetricsLogger] = None
        self.worker_versions: list[int] = []
        self.history: list[dict[str, float]] = []

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
        finally:
            self.close()
        if before is not None and after is not None:
            self.log(f"held-out accuracy: {100 * before.pass_at_1:.1f}% -> {100 * after.pass_at_1:.1f}%")
        else:
            self.log("held-out accuracy: n/a (the task has no held-out rows: set task.held_out)")
        return RunResult(self.step, self.staleness.version, before, after, str(self.cfg.run.output_dir))

    def setup(self) -> None:
        t0 = time.perf_counter()
        cfg = self.cfg
        if cfg.warmstart is not None:
            from coordinator.warmstart import warm_start

            path = warm_start(cfg, log=self.log)
            self.log(f"warm start: {path} ({time.perf_counter() - t0:.1f} s)")
            model = cfg.model.model_copy(update={"path": path, "preset": None, "preset_shape": None})
            self.cfg = cfg = cfg.model_copy(update={"model": model})
        data = load_task_data(cfg.task)
        self.rows = {r.prompt_id: r for r in data.train}
        self.held_out = data.held_out[: cfg.eval.num_prompts]
        self.stream = PromptStream(data.train, seed=cfg.run.seed)
        self.metrics = MetricsLogger(cfg.run.output_dir, tensorboard=cfg.run.tensorboard,
                                     wandb_project=cfg.run.wandb_project, run_config=cfg.model_dump(mode="json"),
                                     append=cfg.run.resume_from is not None)
        t1 = time.perf_counter()
        self.actors = start_actors(cfg, rollout_cls=self.rollout_cls, learner_cls=self.learner_cls, log=self.log)
        self.worker_versions = [0] * len(self.actors.rollouts)
        self.setup_weight_push()
        if cfg.run.resume_from is not None:
            self.restore(checkpoint.load(self.actors, cfg.run.resume_from, cfg.cluster.start_timeout_s))
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
                batch = self.buffer.take(batch_size)  # groups older than η are dropped and counted here
                if batch is not None:
                    self.start_training(batch)
            for ref, job in self.wait_any():
                if job.kind == "rollout":
                    self.on_rollout(ref, job)
                elif job.kind == "ack":
                    self.on_ack(ref, job)
                elif self.training is not None and all(r not in self.pending for r in self.training["refs"]):
                    record = self.finish_step()
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

    def feed_workers(self) -> None:
        """Give each worker requests up to its queue depth while the admission bound allows."""
        per_request, depth = self.cfg.rollout.prompts_per_request, self.cfg.rollout.requests_per_worker
        queued = [0] * len(self.actors.rollouts)
        for job in self.pending.values():
            if job.kind == "rollout":
                queued[job.worker] += 1
        while True:
            worker = min(range(len(queued)), key=queued.__getitem__)
            n = min(per_request, self.staleness.capacity())
            if queued[worker] >= depth or n == 0 or not self.staleness.try_start(n):
                return
            requests = tuple(self.next_request() for _ in range(n))
            ref = self.actors.rollouts[worker].generate.remote(list(requests))
            uids = f"{requests[0].uid}..{requests[-1].uid}" if n > 1 else str(requests[0].uid)
            self.pending[ref] = Pending("rollout", f"rollout worker {worker} (prompts {uids})", worker=worker,
                                        requests=requests)
            queued[worker] += 1

    def on_rollout(self, ref: ray.ObjectRef, job: Pending) -> None:
        for episode in self.get(ref, job):
            self.buffer.add(episode)

    # ---- learner steps and weights ------------------------------------------------------------
    def start_training(self, batch: list[Episode]) -> None:
        refs = self.actors.train([e.group for e in batch], self.staleness.version)
        for rank, ref in enumerate(refs):
            self.pending[ref] = Pending("train", f"learner rank {rank} (step {self.step + 1})")
        self.training = {"refs": refs, "batch": batch, "start": time.perf_counter()}

    def finish_step(self) -> dict[str, float]:
        batch, start = self.training["batch"], self.training["start"]
        results = [ray.get(r) for r in self.training["refs"]]
        train_s = time.perf_counter() - start
        version = self.staleness.advance()
        push_s = self.push_weights(version)
        self.step += 1
        self.training = None
        if self.record_batches:
            self.batches.append(batch)
        record = self.log_step(batch, merge_ranks(results), train_s, push_s)
        every = self.cfg.run.checkpoint_every
        if every and self.step % every == 0 and self.step < self.cfg.run.steps:
            self.save_checkpoint()
        if self.cfg.eval.every and self.step % self.cfg.eval.every == 0 and self.step < self.cfg.run.steps:
            self.evaluate()
        return record

    def setup_weight_push(self) -> None:
        cfg, actors = self.cfg.weights, self.actors
        timeout = self.cfg.cluster.start_timeout_s
        if cfg.resolved_backend == "object_store":
            refs = actors.call_learners("setup_weight_push", cfg) + [w.setup_weight_push.remote(cfg) for w in actors.rollouts]
        else:
            addr, port = wait([actors.learners[0].rendezvous_address.remote()], timeout, "learner rank 0 (address)")[0]
            world = 1 + len(actors.rollouts)
            names = [f"rollout worker {i}" for i in range(len(actors.rollouts))]
            refs = actors.call_learners("setup_weight_push", cfg, rank=0, world_size=world, master_addr=addr,
                                        master_port=port, peer_names=names)
            refs += [w.setup_weight_push.remote(cfg, rank=i + 1, world_size=world, master_addr=addr, master_port=port)
                     for i, w in enumerate(actors.rollouts)]
        wait(refs, timeout, "weight push set-up on every learner rank and rollout worker")

    def push_weights(self, version: int) -> float:
        """Learner rank 0 -> every rollout worker as ``version``. Object store: the learner puts
        the weights once, each worker loads them before its next request and acknowledges later
        (tracked by the loop, with the push timeout); a broadcast runs on all of them at once."""
        t0 = time.perf_counter()
        cfg, actors = self.cfg.weights, self.actors
        if cfg.resolved_backend != "object_store":
            transfer_weights(cfg, [a.push_weights.remote for a in actors.learners],
                             [w.receive_weights.remote for w in actors.rollouts], version)
            self.worker_versions = [version] * len(actors.rollouts)
            return time.perf_counter() - t0
        handle = wait(actors.call_learners("push_weights", version), cfg.timeout_s,
                      f"learner ranks (weights version {version})")[0]
        for i, worker in enumerate(actors.rollouts):
            self.pending[worker.receive_weights.remote(handle)] = Pending(
                "ack", f"rollout worker {i} (weights version {version})", worker=i)
        return time.perf_counter() - t0

    def on_ack(self, ref: ray.ObjectRef, job: Pending) -> None:
        self.worker_versions[job.worker] = self.get(ref, job)

    # ---- waiting ------------------------------------------------------------------------------
    def wait_any(self) -> list[tuple[ray.ObjectRef, Pending]]:
        """Every pending call that has finished (at least one), or an error naming all of them."""
        timeout = self.cfg.rollout.request_timeout_s
        if not self.pending:
            raise ActorFailure("the loop has nothing to wait for: no rollout admitted and no step running "
                               f"(buffer {len(self.buffer)} groups, capacity {self.staleness.capacity()})")
        ready, _ = ray.wait(list(self.pending), num_returns=1, timeout=timeout)
        now = time.perf_counter()
        # an ack waits behind the worker's queued requests, then for the transfer itself
        ack_timeout = timeout * self.cfg.rollout.requests_per_worker + self.cfg.weights.timeout_s
        late = [f"{j.what} for {now - j.since:.0f} s" for j in self.pending.values()
                if now - j.since > (ack_timeout if j.kind == "ack" else timeout)]
        if not ready or late:
            waiting = late or [f"{j.what} for {now - j.since:.0f} s" for j in self.pending.values()]
            raise ActorFailure("no answer within the timeout from: " + "; ".join(waiting))
        ready, _ = ray.wait(list(self.pending), num_returns=len(self.pending), timeout=0)
        return [(ref, self.pending.pop(ref)) for ref in ready]

    def get(self, ref: ray.ObjectRef, job: Pending) -> Any:
        try:
            return ray.get(ref)
        except ray.exceptions.RayError as e:
            raise ActorFailure(f"{job.what} failed: {e}") from e

    def drain(self) -> None:
        """Let admitted rollouts and weight acks finish (their groups are not trained on)."""
        while self.pending:
            for ref, job in self.wait_any():
                (self.on_rollout if job.kind == "rollout" else self.on_ack)(ref, job)

    # ---- logging, evaluation, checkpoints -------------------------------------------------------
    def log_step(self, batch: list[Episode], learner: dict[str, float], train_s: float, push_s: float) -> dict[str, float]:
        now = time.perf_counter()
        step_s, self.last_step_end = now - self.last_step_end, now
        info = self.actors.info
        record = {**rollout_metrics(batch), **learner, **self.staleness.step_metrics()}
        record.update({"time/step": step_s, "time/train": train_s, "time/weight_push": push_s,
                       "time/generate": record["rollout/generate_s"], "version": float(self.staleness.version),
                       "rollout/worker_version_min": float(min(self.worker_versions)),
                       "rollout/empty_groups_total": float(self.buffer.empty)})
        sequence_tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for e in batch for s in e.group.samples)
        record.update(perf_metrics(
            step_s=step_s, train_s=train_s, samples=record["learner/samples"], tokens=record["learner/tokens"],
            sequence_tokens=sequence_tokens, inner_iterations=self.cfg.algorithm.inner_iterations,
            forwards_per_estimate=forwards_per_estimate(self.cfg.estimator),
            parameters=info["rollouts"][0]["parameters"], learner_devices=len(self.actors.learners),
            peak_tflops=self.cfg.run.peak_tflops))
        if self.step == 1:
            record.update(self.startup)
        self.history.append(self.metrics.log(self.step, record))
        return record

    def log_reward_stats(self) -> None:
        """The reward calls of the whole run, summed over workers (failures isolated and counted)."""
        stats = wait([w.reward_stats.remote() for w in self.actors.rollouts], self.cfg.rollout.request_timeout_s,
                     "rollout workers (reward statistics)")
        total = {k: sum(s[k] for s in stats) for k in stats[0]}
        self.metrics.log(self.step, total)
        if total.get("rollout/reward_calls/failed"):
            self.log(f"reward: {int(total['rollout/reward_calls/failed'])} of {int(total['rollout/reward_calls/calls'])} "
                     "calls failed (see rollout/reward_calls/* in metrics.jsonl)")

    def evaluate(self) -> Optional[HeldOutResult]:
        if not self.held_out:
            return None
        e = self.cfg.eval
        result = evaluate_held_out(self.actors.rollouts, self.held_out, e.samples_per_prompt, e.seed,
                                   self.cfg.rollout.request_timeout_s)
        self.metrics.log(self.step, result.metrics())
        self.log(f"step {self.step}: held-out pass@1 {100 * result.pass_at_1:.1f}% on {result.num_prompts} prompts "
                 f"(weights version {result.version}, {result.time_s:.1f} s)")
        return result

    def client_state(self) -> dict[str, Any]:
        in_flight = [r for j in self.pending.values() if j.kind == "rollout" for r in j.requests]
        training = [] if self.training is None else [(e.uid, e.prompt_id) for e in self.training["batch"]]
        requeue = sorted(training + [(r.uid, r.row.prompt_id) for r in in_flight + self.requeue]
                         + self.buffer.pending_uids())
        return {"step": self.step, "version": self.staleness.version, "stream": self.stream.state_dict(),
                "staleness": self.staleness.state_dict(), "next_uid": self.next_uid, "requeue": requeue}

    def save_checkpoint(self) -> None:
        path = checkpoint.save(self.actors, self.cfg.run.output_dir, self.step, self.client_state(),
                               self.cfg.cluster.start_timeout_s)
        self.log(f"checkpoint: {path}")

    def export(self) -> None:
        directory = self.cfg.run.output_dir / "final_model"
        wait(self.actors.call_learners("export", str(directory)), self.cfg.cluster.start_timeout_s,
             [f"learner rank {r} (export)" for r in range(len(self.actors.learners))])
        self.log(f"policy exported: {directory} (model.path={directory} loads it)")

    def restore(self, state: dict[str, Any]) -> None:
        self.step, self.next_uid = int(state["step"]), int(state["next_uid"])
        self.stream.load_state_dict(state["stream"])
        self.staleness.load_state_dict(state["staleness"])
        self.requeue = [PromptRequest(int(uid), self.rows[pid]) for uid, pid in state["requeue"]]
        self.push_weights(self.staleness.version)
        self.drain()
        self.log(f"resumed at step {self.step} (weights version {self.staleness.version}) from {self.cfg.run.resume_from}")

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        if self.actors is not None:
            self.actors.shutdown()
            self.actors = None


def _tty() -> bool:
    import sys

    return sys.stderr.isatty()


def progress_line(step: int, steps: int, record: dict[str, float]) -> str:
    return (f"step {step}/{steps}: reward {record['rollout/reward_mean']:.3f}, loss {record['train/loss']:.4f}, "
            f"grad norm {record['train/grad_norm']:.3f}, staleness {record['staleness/mean']:.2f} "
            f"(dropped {int(record['staleness/dropped_total'])}), {record['time/step']:.2f} s/step")
