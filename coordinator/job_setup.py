"""What a job checks and prepares before its first actor starts (coordinator/driver.py calls it).

    job = prepare(cfg, stages, config)   # resources, the checkpoint to resume from, warm start, model, data

Everything here can refuse the job with a message a user acts on: the stages the config needs
(``Stages``), the resources the cluster offers, the checkpoint to resume from and its config,
the model files, the task's data. It also writes output_dir/config.yaml and, for a resume, trims
metrics.jsonl back to the checkpoint's step.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import ray

from stabledrl.common.config.base import ConfigError
from stabledrl.common.config.job import JobConfig, check_resources
from stabledrl.common.metrics import MetricsLogger, restore_metrics
from stabledrl.common.models.loading import check_model_files, load_model_tokenizer
from stabledrl.common.tasks import Row, TaskData, load_task_data
from stabledrl.coordinator.runtime import checkpoint
from stabledrl.coordinator.decisions import events as ev
from stabledrl.coordinator.runtime.actors import wait
from stabledrl.coordinator.decisions.held_out import held_out_rows
from stabledrl.coordinator.decisions.step_metrics import data_metrics
from stabledrl.common.trust.seal import sealed_text

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stages:
    """What the command layer wires into a job as plain callables (stabledrl/recipes/stages.py has
    `stabledrl train`'s): the warm start, ``cfg -> the SFT model's directory``, and the
    in-training protocol evaluation, ``cfg -> ProtocolRunner`` (coordinator/decisions/commands.py)."""

    warm_start: Optional[Callable[..., Any]] = None
    protocol_eval: Optional[Callable[[JobConfig], ev.ProtocolRunner]] = None

    def check(self, cfg: JobConfig) -> None:
        """A config that needs a stage this driver lacks fails before anything starts, naming it."""
        for field, needed, stage in (("warmstart", cfg.warmstart is not None, self.warm_start),
                                     ("eval.protocol", cfg.eval.protocol is not None, self.protocol_eval)):
            if needed and stage is None:
                raise ConfigError(f"{field} is set, but this driver was built without that stage (pass "
                                  "stages=stabledrl.recipes.stages.JOB_STAGES, as `stabledrl train` does)")


NO_STAGES = Stages()  # a driver built without the command layer's stages


@dataclass
class PreparedJob:
    """What ``prepare`` checked and read: the config to run (a warm start changes model.path)."""

    cfg: JobConfig
    resume: Optional[checkpoint.Resume]
    data: TaskData
    rows: dict[Any, Row]  # the training rows by prompt id (a resume restores its buffer from them)
    held_out: list[Row]
    seconds: float  # how long the preparation took


def prepare(cfg: JobConfig, stages: Stages, config: dict[str, Any]) -> PreparedJob:
    """Everything that can refuse the job runs before the first actor starts: the resources the
    cluster offers, the checkpoint to resume from, the data. ``config`` is the job's config as
    given (``config_json``): what config.yaml records and a resume is checked against."""
    t0 = time.perf_counter()
    stages.check(cfg)
    check_resources(cfg, ray.cluster_resources())
    resume = None
    if cfg.run.resume_from is not None:
        resume = checkpoint.verify(cfg.run.resume_from, config)
    if cfg.warmstart is not None:  # the job's first stage: an SFT recipe, cached
        path = stages.warm_start(cfg)
        log.info(f"warm start: {path} ({time.perf_counter() - t0:.1f} s)")
        model = cfg.model.model_copy(update={"path": path, "preset": None, "preset_shape": None})
        cfg = cfg.model_copy(update={"model": model})
    check_model_files(cfg.model)  # a pickle in model.path or the warm start is refused here, before any actor
    data = load_task_data(cfg.task, tokenizer=load_model_tokenizer(cfg.model))  # max_prompt_tokens in model tokens
    held_out, note = held_out_rows(data.held_out, cfg.eval.num_prompts)
    if note:
        log.info(note)
    write_config(cfg, config)
    if resume is not None:
        dropped = restore_metrics(cfg.run.output_dir, int(resume.state["step"]))
        if dropped:
            log.info(f"metrics.jsonl: {dropped} lines after step {resume.state['step']} removed (they are "
                     "recomputed; the old file is metrics.before_resume.jsonl)")
    return PreparedJob(cfg, resume, data, {r.prompt_id: r for r in data.train}, held_out, time.perf_counter() - t0)


def config_json(job_cfg: JobConfig) -> dict[str, Any]:
    """The job's config as given (``run.resume_from`` left out): what config.yaml and every
    checkpoint record, and what a resume is checked against."""
    run = job_cfg.run.model_copy(update={"resume_from": None})
    return job_cfg.model_copy(update={"run": run}).model_dump(mode="json")


def write_config(cfg: JobConfig, config: dict[str, Any], file: Optional[Path] = None) -> None:
    """output_dir/config.yaml (or ``file``: an export's): the resolved config, which `stabledrl
    train --resume` and `stabledrl eval --model EXPORT` read back, sealed under this user's key
    (common/trust/seal.py)."""
    import yaml

    file = file or cfg.run.output_dir / "config.yaml"
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(sealed_text(yaml.safe_dump(config, sort_keys=False)))


def log_data(reports: list[Any], metrics: MetricsLogger, record: bool = True) -> None:
    """Rows read, kept and skipped by reason (task.on_bad_row: skip), in the log and (``record``:
    not on a resume, whose metrics.jsonl has them from the run's start) as data/*."""
    for report in reports:
        if report.n_skipped:
            reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(report.skipped.items()))
            examples = "; ".join(report.examples[:3])
            log.info(f"data: {report.source}: kept {report.kept} of {report.read} rows, skipped {reasons}"
                     + (f" (e.g. {examples})" if examples else ""))
    if record:
        metrics.log(0, data_metrics(reports))


def load_checkpoint(resume: checkpoint.Resume, runtime: Any, scheduler: Any, rows: dict[Any, Row],
                    cfg: JobConfig) -> Any:
    """After ``checkpoint.verify`` accepted the files and the config, and the actors started: check
    the model's shapes, load every learner rank and restore the scheduler's state; returns the
    checkpoint's directory (the driver then pushes the restored weights to every worker)."""
    actors, timeout = runtime.actors, cfg.cluster.start_timeout_s
    where = resume.directory / resume.tag
    checkpoint.check_shapes(resume.state["parameter_shapes"], runtime.parameter_shapes(), where)
    state = checkpoint.load(actors, resume, timeout)
    saved = wait([actors.learners[0].resharded_from.remote()], timeout, "learner rank 0 (re-shard)")[0]
    if saved is not None:
        log.info(f"checkpoint re-sharded: written by {saved[0]} learner ranks (ZeRO-{saved[1]}), loaded into "
                 f"{len(actors.learners)} (ZeRO-{cfg.learner.deepspeed.zero_stage}); fp32 masters and Adam "
                 f"moments exact, each rank's RNG streams derived from (run.seed, step, rank)")
    try:
        scheduler.load_state_dict(state, rows, resume.episodes)
    except (ValueError, KeyError) as e:
        raise checkpoint.CheckpointError(f"{where}: the task's rows changed ({e})") from None
    except OverflowError as e:
        raise checkpoint.CheckpointError(f"{where}: {e}") from None
    return where
