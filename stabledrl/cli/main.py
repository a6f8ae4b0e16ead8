"""`stabledrl` command line.

    stabledrl train --config deploy/configs/quickstart.yaml [key.path=value ...] [--dry-run]
    python -m stabledrl train --config ...
    stabledrl train --resume runs/quickstart [key.path=value ...]   # continue from the last checkpoint
    stabledrl scale --job quickstart [--workers N] [--address HOST:PORT]   # a running job's rollout workers
    stabledrl config [task.reward]          # the config reference: every key, type, default, description
    stabledrl eval | plot | study ...        (stabledrl/cli/reports.py)

The config is validated (file, overrides and every cross-section rule) before Ray starts; a bad
one exits with status 2 and the dotted names of the fields to fix. ``--dry-run`` prints the
resolved config as YAML, then (as comment lines) what the run needs that is missing here, with the
command that fetches it, and the run's plan, and exits (stabledrl/cli/dry_run.py). With RAY_ADDRESS set
(``ray job submit`` sets it for its entrypoint) the job joins that cluster; otherwise it starts a
local Ray instance for itself.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Optional

import stabledrl
from stabledrl.cli import reports
from stabledrl.cli.reports import add_trust_flags
from stabledrl.common.config import schema
from stabledrl.common.config.base import ConfigError
from stabledrl.common.config.job import JobConfig, check_installed, load_job_config
from stabledrl.common.config.reference import reference
from stabledrl.common.job_log import show_log
from stabledrl.common.sandbox.scorer import RewardFailureRate, check_reward
from stabledrl.common.tasks import DataError
from stabledrl.common.trust.checkpoint_files import CheckpointError
from stabledrl.common.trust.run_dir import check_checkpoint_space, check_output_dir, check_resume_trust, disk_error
from stabledrl.common.trust.seal import RunTrustError, check_key, check_run_config
from stabledrl.coordinator.decisions.events import ActorFailure

QUICKSTART = Path(__file__).resolve().parents[2] / "deploy" / "configs" / "quickstart.yaml"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="stabledrl", description="RL post-training of diffusion LMs on Ray + DeepSpeed"
    )
    parser.add_argument("--version", action="version", version=f"stabledrl {stabledrl.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="run an RL job (see deploy/configs/)")
    train.add_argument("--config", default=str(QUICKSTART), help=f"YAML job config (default: {QUICKSTART})")
    train.add_argument("--dry-run", action="store_true", help="print the resolved config, the missing inputs "
                       "(model, data) with how to fetch them, and the run's plan (GPUs, actors, updates, samples, "
                       "evaluations, outputs); then exit. Needs neither the model nor the data")
    train.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint "
                       "(its config.yaml, unless --config is given; overrides still apply)")
    train.add_argument("--overwrite", action="store_true", help="run.output_dir holds an earlier run: delete it and "
                       "start again (without it such a directory is refused; --resume continues it)")
    add_trust_flags(train)
    train.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algorithm.max_staleness=1 run.steps=20")
    scale = sub.add_parser("scale", help="show or change the rollout workers of a running job")
    scale.add_argument("--job", required=True, help="the job's run.name (default: the last part of its output_dir)")
    scale.add_argument("--workers", type=reports.counted(1), help="rollout workers wanted (rollout.min_workers .. "
                       "max_workers)")
    scale.add_argument("--address", default=os.environ.get("RAY_ADDRESS", "auto"),
                       help="the cluster's GCS address, HOST:PORT (default: $RAY_ADDRESS, else the local cluster)")
    config = sub.add_parser("config", help="print the config reference: every key of a job config with its type, "
                            "default and description (docs/config.md)")
    config.add_argument("section", nargs="?", help="one section's dotted path, e.g. task.reward (default: all)")
    reports.add_commands(sub)  # eval, plot, study
    args = parser.parse_args(argv)
    undo = show_log()  # the job's lines on stdout (common/job_log.py)
    try:
        return command(args)
    finally:
        undo()


def command(args: argparse.Namespace) -> int:
    """Carry out the parsed command; its exit status."""
    if args.command in reports.COMMANDS:
        return reports.run(args)
    if args.command == "config":
        return config_reference(args.section)
    if args.command == "scale":
        from stabledrl.cli.scale import scale_command  # Ray: loaded only to reach a running job

        return scale_command(args.job, args.workers, args.address)

    try:
        check_key(create=not args.dry_run)  # what seals the run: a key that cannot serve fails here, before anything
        cfg = load_job_config(*resume_source(args)) if args.resume else load_job_config(args.config, args.overrides)
        if not args.dry_run:
            from stabledrl.common.models.job_check import check_sampler_layout  # torch: not for --dry-run

            check_sampler_layout(cfg)
        check_installed(cfg)
        check_run(args, cfg)
        check_reward(cfg.task)  # the reward file's rules, and a dry import in the sandbox, before any actor
    except (ConfigError, RunTrustError) as e:
        print(f"stabledrl: {e}", file=sys.stderr)
        return 2
    if args.dry_run:  # the config, what is missing and the plan; no model or data needed (stabledrl/cli/dry_run.py)
        from stabledrl.cli.dry_run import dry_run  # torch, for the model's files

        return dry_run(cfg)
    return train_job(cfg)


def config_reference(section: Optional[str]) -> int:
    """Print the reference of every key (or of ``section``'s); exit 2 naming the sections when the
    section is unknown."""
    try:
        print(reference(JobConfig, only=section), end="")
    except KeyError:
        close = schema.did_you_mean(section, list(schema.field_paths(JobConfig)))
        hint = f"; did you mean {close}?" if close else ""
        print(f"stabledrl: config: no section {section!r}{hint} (sections: {', '.join(JobConfig.model_fields)})",
              file=sys.stderr)
        return 2
    return 0


def check_run(args: argparse.Namespace, cfg: JobConfig) -> None:
    """The run directory before Ray starts (common/trust/run_dir.py): its config as the run wrote it (resume),
    and run.output_dir writable and not holding another run."""
    if args.resume:
        config_file, _ = resume_source(args)
        run = cfg.run.model_copy(update={"resume_from": None})
        check_resume_trust(
            Path(config_file),
            Path(args.resume),
            cfg.model_copy(update={"run": run}).model_dump(mode="json"),
            trust_run=args.trust_run,
            allow_weaker=args.allow_weaker_sandbox,
        )
    else:  # a new run started from another run's config.yaml: the same check of that file
        check_run_config(Path(args.config), trust_run=args.trust_run)
    if not args.dry_run:
        check_output_dir(cfg.run.output_dir, resuming=bool(args.resume), overwrite=args.overwrite)
    if args.resume and not args.dry_run:
        check_checkpoint_space(cfg.run.output_dir, bool(cfg.run.checkpoint_every or cfg.run.save_final_checkpoint))


def resume_source(args: argparse.Namespace) -> tuple[str, list[str]]:
    """(config file, overrides) of ``train --resume RUN_DIR``: the run's own config.yaml (written
    when it started) unless --config names another, pointed at RUN_DIR and its checkpoints."""
    run_dir = Path(args.resume)
    config = args.config if args.config != str(QUICKSTART) else run_dir / "config.yaml"
    if not Path(config).is_file():
        raise ConfigError(f"--resume {run_dir}: no {config} (is it a run directory?); pass --config")
    return str(config), [*args.overrides, f"run.output_dir={run_dir}", f"run.resume_from={run_dir / 'checkpoints'}"]


def train_job(cfg: JobConfig) -> int:
    """Run the job; one line on stderr for each way it can end early (exit 2: refused, 1: failed,
    130: interrupted, with the command that resumes it)."""
    import ray  # the job's own dependencies (torch, Ray) load only when a job runs

    from stabledrl.coordinator.driver import Driver
    from stabledrl.recipes.stages import JOB_STAGES

    driver, code, message = None, 0, None
    _received.clear()
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        _start_ray(cfg)
        signal.signal(signal.SIGTERM, _interrupt)  # ray.init installs its own (a bare exit, no resume line)
        driver = Driver(cfg, stages=JOB_STAGES)
        driver.run()
    except KeyboardInterrupt:
        by = _received[-1] if _received else signal.SIGINT
        code = 128 + by
        message = interrupted_line(cfg, driver.step if driver is not None else 0, signal.Signals(by).name)
    except (
        ConfigError,
        CheckpointError,
        DataError,
    ) as e:  # refused (before any actor started, or a checkpoint it cannot write)
        code, message = 2, f"stabledrl: {e}"
    except (ActorFailure, RewardFailureRate) as e:
        code, message = 1, f"stabledrl: job failed: {e}"
    except OSError as e:  # a write of the driver's own (metrics, config) the disk refused: the cause, in one line
        code, message = 1, f"stabledrl: job failed: {disk_error(e, cfg.run.output_dir)}"
    finally:
        ray.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if message:
        print(message, file=sys.stderr, flush=True)
    return code


def _start_ray(cfg: JobConfig) -> None:
    from stabledrl.api import start_ray  # Ray and transformers

    where = start_ray(cfg)
    print(f"stabledrl: {cfg.run.steps} steps, {cfg.learner.num_ranks} learner ranks (ZeRO-"
          f"{cfg.learner.deepspeed.zero_stage}), {cfg.rollout.num_workers} rollout workers, loss {cfg.loss.name}, "
          f"η = {cfg.algorithm.max_staleness}, on {where}; output in {cfg.run.output_dir}", flush=True)


_received: list[int] = []  # the signals that stopped the job


def _interrupt(signum: int, frame: object) -> None:
    """The first Ctrl-C or SIGTERM (a scheduler's, `kill`'s) stops the job cleanly
    (KeyboardInterrupt); a second one ends the process at once (the watchdog still ends the
    processes of a local Ray instance)."""
    _received.append(signum)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _: os._exit(128 + signum))
    raise KeyboardInterrupt


def interrupted_line(cfg: JobConfig, step: int, by: str = "SIGINT") -> str:
    """The one line a Ctrl-C (or SIGTERM) leaves: where the run stopped and how to continue it."""
    latest = Path(cfg.run.output_dir) / "checkpoints" / "latest"
    head = f"stabledrl: {'interrupted' if by == 'SIGINT' else f'stopped by {by}'} at step {step} of {cfg.run.steps}"
    if latest.is_file():
        return (
            f"{head}; continue with: stabledrl train --resume {cfg.run.output_dir} (from {latest.read_text().strip()})"
        )
    return (f"{head}; no checkpoint was written (run.checkpoint_every = {cfg.run.checkpoint_every}), so it cannot be "
            "resumed: run it again")
