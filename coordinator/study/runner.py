"""Running a study: one warm start, one Ray session, every (method, seed) run through the
coordinator's own loop, ``concurrency`` runs at a time on warm actors.

    study = load_study_config("deploy/configs/study_cpu.yaml")
    result = run_study(study)        # output_dir/METHOD/seedN/metrics.jsonl, table.md, results.json, figure.png

Runs go in seed-major order (every method's seed 0, then seed 1, ...), so a study cut short by
its deadline still compares the methods on the same seeds. The report is rewritten after every
finished run. A run that fails is recorded with its error and its lane gets fresh actors.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from common.config.job import JobConfig
from coordinator.driver import Driver
from coordinator.study.actors import Slot
from coordinator.study.config import StudyConfig, run_config, warmstart_config

Log = Callable[[str], None]


class StudyStopped(RuntimeError):
    """The study's deadline passed while this run was training."""


class StudyDriver(Driver):
    """The coordinator's Driver on a lane's warm actors: ``setup`` resets them instead of
    starting new ones (the rest as ``Driver.setup``, without warm start or resume: the study
    warm-starts once and never resumes), ``close`` leaves them to the lane, and ``wait_any``
    gives up once the study's deadline has passed."""

    def __init__(self, cfg: JobConfig, slot: Slot, *, log: Log, deadline: Optional[float] = None) -> None:
        super().__init__(cfg, log=log)
        self.slot, self.deadline = slot, deadline

    def setup(self) -> None:
        from common.metrics import MetricsLogger
        from common.tasks import PromptStream, load_task_data

        t0 = time.perf_counter()
        cfg = self.cfg
        data = load_task_data(cfg.task)
        self.rows = {r.prompt_id: r for r in data.train}
        self.held_out = data.held_out[: cfg.eval.num_prompts]
        self.stream = PromptStream(data.train, seed=cfg.run.seed)
        self.metrics = MetricsLogger(cfg.run.output_dir, tensorboard=cfg.run.tensorboard,
                                     wandb_project=cfg.run.wandb_project, run_config=cfg.model_dump(mode="json"))
        t1 = time.perf_counter()
        self.actors = self.slot.prepare(cfg)
        self.worker_versions = [0] * len(self.actors.rollouts)
        self.setup_weight_push()
        self.startup = {"time/startup_prepare": t1 - t0, "time/startup_actors": time.perf_counter() - t1}

    def wait_any(self):
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise StudyStopped(f"study deadline reached at step {self.step}")
        return super().wait_any()

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        self.actors = None  # the lane owns them


@dataclass
class RunOutcome:
    method: str
    seed: int
    output_dir: Path
    status: str  # "finished" | "stopped" (deadline) | "failed" | "not started"
    wall_s: float = 0.0
    error: str = ""


@dataclass
class StudyResult:
    outcomes: list[RunOutcome] = field(default_factory=list)
    warmstart_s: float = 0.0
    wall_s: float = 0.0
    model_path: Optional[Path] = None


def run_study(study: StudyConfig, *, log: Log = print, on_run_end: Optional[Callable[[StudyResult], None]] = None) -> StudyResult:
    """Warm-start once, then every run (see the module docstring). Ray is started here (a local
    instance) unless it is already initialised; ``on_run_end`` is called after every run (the
    report writer)."""
    import ray

    t_start = time.monotonic()
    result = StudyResult()
    result.model_path = shared_warm_start(study, log)
    result.warmstart_s = time.monotonic() - t_start
    deadline = t_start + study.deadline_s if study.deadline_s else None
    own_ray = not ray.is_initialized()
    if own_ray:
        start_local_ray(warmstart_config(study))
    queue = list(study.runs)
    lock = threading.Lock()

    def lane(index: int) -> None:
        slot = Slot(index, log=log)
        try:
            while True:
                with lock:
                    if not queue:
                        return
                    method, seed = queue.pop(0)
                    if deadline is not None and time.monotonic() > deadline:
                        result.outcomes.append(RunOutcome(method, seed, study.output_dir / method / f"seed{seed}", "not started"))
                        continue
                outcome = run_one(study, method, seed, slot, result.model_path, log, deadline)
                with lock:
                    result.outcomes.append(outcome)
                    if on_run_end is not None:
                        on_run_end(result)
        finally:
            slot.shutdown()

    try:
        threads = [threading.Thread(target=lane, args=(i,), name=f"study-lane-{i}", daemon=True)
                   for i in range(min(study.concurrency, len(queue)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        if own_ray:
            ray.shutdown()
    result.wall_s = time.monotonic() - t_start
    return result


def run_one(study: StudyConfig, method: str, seed: int, slot: Slot, model_path: Path, log: Log,
            deadline: Optional[float]) -> RunOutcome:
    """One run on ``slot``'s actors; a failed or stopped run leaves the lane with fresh actors to come."""
    cfg = run_config(study, method, seed, model_path=model_path)
    name = f"{method}/seed{seed}"
    t0 = time.monotonic()
    try:
        driver = StudyDriver(cfg, slot, log=lambda line: log(f"[{name}] {line}"), deadline=deadline)
        outcome = driver.run()
    except StudyStopped as e:
        slot.shutdown()
        log(f"[{name}] stopped: {e}")
        return RunOutcome(method, seed, cfg.run.output_dir, "stopped", time.monotonic() - t0, str(e))
    except Exception as e:  # one run's failure is reported, the study goes on
        slot.shutdown()
        log(f"[{name}] failed: {type(e).__name__}: {e}")
        return RunOutcome(method, seed, cfg.run.output_dir, "failed", time.monotonic() - t0, f"{type(e).__name__}: {e}")
    wall = time.monotonic() - t0
    after = "n/a" if outcome.after is None else f"{100 * outcome.after.pass_at_1:.1f}%"
    log(f"[{name}] done: {outcome.steps} steps in {wall:.0f} s, held-out pass@1 {after}")
    return RunOutcome(method, seed, cfg.run.output_dir, "finished", wall)


def shared_warm_start(study: StudyConfig, log: Log) -> Path:
    """The one warm-started model every run starts from (cached by content hash), or the job's
    own model directory when the job has no warmstart section."""
    cfg = warmstart_config(study)
    if cfg.warmstart is None:
        if cfg.model.path is None:
            raise ValueError("job: a study needs a model directory (model.path) or a warmstart section; "
                             "a random preset would give every method nothing to learn from")
        return Path(cfg.model.path)
    from coordinator.warmstart import warm_start

    t0 = time.monotonic()
    path = warm_start(cfg, log=log)
    log(f"warm start: {path} ({time.monotonic() - t0:.1f} s)")
    return Path(path)


def start_local_ray(cfg: JobConfig) -> None:
    """A local Ray instance for the study (RAY_ADDRESS set: join that cluster instead). The
    repository goes on the workers' PYTHONPATH, so the actors import it without an install."""
    import logging

    import ray

    repo = str(Path(__file__).resolve().parents[2])
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(filter(None, [repo, os.environ.get("PYTHONPATH")])))
    if os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=True)
        return
    ray.init(address="local", num_cpus=cfg.cluster.local_num_cpus, include_dashboard=False, log_to_driver=True,
             logging_level=logging.WARNING)
