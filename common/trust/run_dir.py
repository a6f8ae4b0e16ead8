"""Checks of a run directory that `stabledrl train` and `stabledrl eval` run before Ray starts.

- ``check_output_dir``: run.output_dir must be a directory this job can write, not a file, not
  under /proc, /sys or /dev; one that already holds a run (config.yaml, metrics.jsonl or
  checkpoints/) is refused unless the job resumes it (``--resume``) or the user passes
  ``--overwrite`` (then the old run's files are removed first, so no old checkpoint sits beside
  the new run's and no old metrics line is mixed into the new file).
- ``lock_output_dir`` (common/trust/run_lock.py), taken first: one job at a time in a run.output_dir.
- ``check_checkpoint_space``: a resume needs the space one checkpoint of the run takes.
- ``check_resume_trust`` / ``check_eval_trust``: the run's config against what the run wrote
  (common/trust/seal.py): an unsealed config naming code is refused without ``--trust-run``, a
  sandbox weaker than the run's without ``--allow-weaker-sandbox``.
"""
from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any, Optional

from stabledrl.common.config.base import ConfigError
from stabledrl.common.trust.checkpoint_files import CheckpointError, read_latest, read_state
from stabledrl.common.trust.run_lock import lock_output_dir
from stabledrl.common.trust.seal import RUN_MARKS, check_confinement, check_run_config, json_is_sealed

RUN_FILES = ("config.yaml", "metrics.jsonl", "metrics.before_resume.jsonl", "checkpoints", "final_model",
             "final_adapter", "tensorboard", "latest")
SYSTEM_TREES = ("/proc", "/sys", "/dev")
PROBE_BYTES = 1 << 20


def holds_run(directory: Path) -> list[str]:
    """What of a run ``directory`` holds (its config, or anything a job writes: RUN_MARKS)."""
    return [name for name in ("config.yaml", *RUN_MARKS) if os.path.lexists(Path(directory) / name)]


def check_output_dir(directory: Path, *, resuming: bool, overwrite: bool) -> None:
    """ConfigError naming run.output_dir when the job could not, or must not, write there."""
    directory = Path(directory)
    real = Path(os.path.realpath(directory))
    tree = next((t for t in SYSTEM_TREES if real == Path(t) or Path(t) in real.parents), None)
    if tree is not None:
        raise ConfigError(f"run.output_dir {directory} is under {tree}, a system tree, not storage: choose a "
                          "directory on a disk")
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"run.output_dir {directory} is a file, not a directory: choose another run.output_dir")
    try:  # first: nothing of a running job's directory is judged or removed by another
        lock_output_dir(directory)
    except OSError as e:
        raise ConfigError(f"run.output_dir {directory} cannot be written: {disk_error(e, directory)}") from None
    found = holds_run(directory) if directory.is_dir() else []
    if found and not resuming:
        if not overwrite:
            raise ConfigError(f"run.output_dir {directory} already holds a run ({', '.join(found)}): continue it with "
                              f"`stabledrl train --resume {directory}`, choose another run.output_dir, or pass "
                              "--overwrite to delete that run and start again")
        for name in RUN_FILES:
            path = directory / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
    probe = directory / f".write-test-{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:  # data, not an empty file: a full disk still has inodes to spare
            f.write(b"\0" * PROBE_BYTES)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise ConfigError(f"run.output_dir {directory} cannot be written: {disk_error(e, directory)}") from None
    finally:
        if probe.exists():
            probe.unlink()


def check_checkpoint_space(run_dir: Path, writes_checkpoints: bool) -> None:
    """``train --resume``: ConfigError when run.output_dir has less space free than one checkpoint
    of this run takes (the newest manifest's files), rather than failing at the first save after
    Ray, the actors and a step of training."""
    checkpoints = Path(run_dir) / "checkpoints"
    if not writes_checkpoints or not (checkpoints / "latest").is_file():
        return
    try:
        tag = checkpoints / read_latest(checkpoints)
        size = sum(int(n) for n in read_state(tag).get("files", {}).values())
    except (CheckpointError, OSError, TypeError, ValueError):
        return  # the resume's own verification names what is wrong with it
    free = shutil.disk_usage(run_dir).free
    if free < size:
        raise ConfigError(f"run.output_dir {run_dir} has {_gib(free)} free, but a checkpoint of this run takes "
                          f"{_gib(size)} ({tag}): free space there, then run the same command again")


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def disk_error(e: OSError, path: Path) -> str:
    """One line for a write that failed: the cause by name and the path."""
    where = e.filename or path
    if e.errno == errno.ENOSPC:
        return f"No space left on device ({where}): free space there, then run the same command again"
    if e.errno == errno.EDQUOT:
        return f"Disk quota exceeded ({where}): free space or raise the quota, then run the same command again"
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{e.strerror} ({where}): the job (uid {os.geteuid()}) must be able to write there"
    return f"{e.strerror or e} ({where})"


def check_resume_trust(config_file: Path, run_dir: Path, now: dict[str, Any], *, trust_run: bool,
                       allow_weaker: bool) -> None:
    """``train --resume RUN_DIR``: the config read (RUN_DIR/config.yaml unless --config) checked as
    the run wrote it, and its reward sandbox against the one of the run's last checkpoint."""
    check_run_config(config_file, trust_run=trust_run,
                     run_dir=run_dir if Path(config_file).resolve().parent == Path(run_dir).resolve() else None)
    started = checkpoint_config(Path(run_dir) / "checkpoints")
    if started is not None:
        check_confinement(started, now, run_dir, allow_weaker=allow_weaker)


def check_eval_trust(config_file: Path, checkpoint: Optional[str], model: Optional[str], now: dict[str, Any], *,
                     trust_run: bool, allow_weaker: bool) -> None:
    """``stabledrl eval``: a run's config checked as the run wrote it; with --checkpoint, its reward
    sandbox against the one the checkpoint's run trained with."""
    check_run_config(Path(config_file), trust_run=trust_run)
    if checkpoint is None:
        return
    started = checkpoint_config(Path(checkpoint))
    if started is not None:
        check_confinement(started, now, Path(checkpoint), allow_weaker=allow_weaker)


def checkpoint_config(path: Path) -> Optional[dict[str, Any]]:
    """The config the run at ``path`` (its output_dir, its checkpoints/ or one tag) trained with,
    as its newest checkpoint's sealed manifest records it; a manifest that fails its seal (edited,
    or sealed under another key) proves nothing, and the baseline is then the default sandbox, the
    strictest a config gets without saying more. None when there is no manifest to read (the
    later verification says why)."""
    for directory, tag in ((path / "checkpoints", None), (path, None), (path.parent, path.name)):
        try:
            if tag is None and (directory / "latest").is_file():
                state = read_state(directory / read_latest(directory))
            elif tag is not None and (directory / tag / "coordinator.json").is_file():
                state = read_state(directory / tag)
            else:
                continue
        except CheckpointError:
            return None
        return state["config"] if json_is_sealed(state) else {}
    return None
