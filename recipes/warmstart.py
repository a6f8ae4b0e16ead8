"""The warm start: a short masked-diffusion SFT stage, run once and cached by content hash.

A random tiny model never samples a right answer, so RL has no signal to work with. The job
therefore first fine-tunes the model on the task's *training* rows and their reference completions
(``learner.sft.run_sft``, LLaDA's SFT loss) for a few hundred steps, saves it as a model directory
and trains RL from there. Held-out rows are never seen.

    path = warm_start(cfg)                       # cfg: JobConfig with a warmstart section
    policy, tokenizer = load_policy(ModelConfig(path=path))

The directory is ``cfg.warmstart.cache_dir / f"{model}-{task}-{key}"`` where ``key`` hashes
everything that determines the weights: the model section (and, for a checkpoint, its files'
names, sizes and mtimes), the task section, the warmstart section (but not ``cache_dir`` or
``log_every``), the canvas width ``sampler.gen_length``, ``run.seed`` and ``WARMSTART_FORMAT``.
A directory holding ``warmstart.json`` is complete and reused; it is written under a temporary
name and renamed into place, so concurrent jobs and interrupted runs never see a partial one.
The manifest lists every file of the directory with its size and SHA-256; a reused directory is
checked against it first, and a file added, missing or changed since (a cache others can write to)
is refused, naming the file, before anything is loaded from it.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from common.checkpoint_files import CheckpointError
from common.config.base import ConfigError
from common.config.job import JobConfig
from common.models import export_hf, load_policy
from common.models.loading import quiet_progress
from common.models.model_dir import resolve_model_dir
from common.tasks import load_task_data
from learner.sft import run_sft

WARMSTART_FORMAT = 2  # bump when the SFT code changes what one config produces (2: files hashed)
MANIFEST = "warmstart.json"
Log = Callable[[str], None]


def warmstart_key(cfg: JobConfig) -> str:
    """16 hex digits of a SHA-256 over everything that determines the warm-started weights."""
    if cfg.warmstart is None:
        raise ConfigError("warmstart: this job has no warmstart section")
    parts: dict[str, Any] = {
        "format": WARMSTART_FORMAT,
        "model": cfg.model.model_dump(mode="json"),
        "model_files": _fingerprint(resolve_model_dir(cfg.model.path, cfg.model.revision)) if cfg.model.path is not None else None,
        "task": cfg.task.model_dump(mode="json"),
        "warmstart": cfg.warmstart.model_dump(mode="json", exclude={"cache_dir", "log_every"}),
        "gen_length": cfg.sampler.gen_length,
        "seed": cfg.run.seed,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def warmstart_dir(cfg: JobConfig) -> Path:
    """Where the warm start of ``cfg`` is (or will be) cached."""
    source = cfg.model.preset or Path(cfg.model.path).name
    return Path(cfg.warmstart.cache_dir).expanduser() / f"{source}-{cfg.task.name}-{warmstart_key(cfg)}"


def warm_start(cfg: JobConfig, log: Log = print) -> Path:
    """The directory of ``cfg.model`` fine-tuned on ``cfg.task``'s training rows (built if absent).

    Training runs in float32 on CUDA when available, else on the CPU with the current torch thread
    count; the directory is written with ``export_hf`` and loads with ``ModelConfig(path=...)``.
    """
    final = warmstart_dir(cfg)
    if (final / MANIFEST).is_file():
        check_cached(final)
        log(f"warm start: reusing {final}")
        return final
    if final.exists():
        raise FileExistsError(f"{final} exists but holds no {MANIFEST}; it was not written by warm_start, remove it")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary directory
    try:
        _build(cfg, tmp, log)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / MANIFEST).is_file():
                raise
            log(f"warm start: another job cached {final} first; using it")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"warm start: cached at {final}")
    return final


def _build(cfg: JobConfig, directory: Path, log: Log) -> None:
    ws = cfg.warmstart
    t0 = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    policy, tokenizer = load_policy(cfg.model, device=device, dtype="float32")
    data = load_task_data(cfg.task, tokenizer=tokenizer)
    n_params = sum(p.numel() for p in policy.parameters())
    log(
        f"warm start: SFT of {cfg.model.preset or cfg.model.path} ({n_params / 1e6:.2f}M parameters) on "
        f"{len(data.train)} {cfg.task.name} training rows, {ws.steps} steps of {ws.batch_size} on {device}"
    )
    metrics = run_sft(
        policy, tokenizer, data.train, data.task, ws, cfg.run.seed,
        gen_length=cfg.sampler.gen_length, log=lambda line: log(f"warm start: {line}"),
    )  # fmt: skip
    with quiet_progress():  # no transformers progress bar in the job's log
        export_hf(policy.to("cpu"), tokenizer, directory)
    manifest = {
        "files": file_hashes(directory),
        "key": warmstart_key(cfg),
        "model": cfg.model.model_dump(mode="json"),
        "task": cfg.task.model_dump(mode="json"),
        "warmstart": cfg.warmstart.model_dump(mode="json"),
        "gen_length": cfg.sampler.gen_length,
        "seed": cfg.run.seed,
        "train_rows": len(data.train),
        "metrics": metrics,
        "time_s": time.perf_counter() - t0,
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def file_hashes(directory: Path) -> dict[str, dict[str, Any]]:
    """{name: {bytes, sha256}} of every file of a model directory but the manifest."""
    out = {}
    for file in sorted(p for p in directory.iterdir() if p.name != MANIFEST):
        digest = hashlib.sha256()
        with open(file, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        out[file.name] = {"bytes": file.stat().st_size, "sha256": digest.hexdigest()}
    return out


def check_cached(directory: Path) -> None:
    """Refuse a cached warm start whose files differ from its manifest (CheckpointError naming one)."""
    try:
        listed = json.loads((directory / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{directory / MANIFEST} cannot be read or lists no files ({e!r}); "
                              f"remove {directory} to rebuild the warm start") from None
    found = file_hashes(directory) if all(p.is_file() for p in directory.iterdir()) else None
    if found is None:
        raise CheckpointError(f"{directory} holds a subdirectory; a warm start holds files only: remove it to rebuild")
    for name in sorted(set(listed) | set(found)):
        if listed.get(name) != found.get(name):
            what = "is not in" if name not in listed else "is missing, listed in" if name not in found else "differs from"
            raise CheckpointError(f"{directory / name} {what} the warm start's manifest ({MANIFEST}): refused "
                                  f"(changed after it was written); remove {directory} to rebuild it")


def _fingerprint(path: Path) -> list[tuple[str, int, int]]:
    """(name, size, mtime_ns) of every file of a checkpoint directory: a cheap content identity."""
    path = path.expanduser()
    if not path.is_dir():
        raise ConfigError(f"model.path {path} is not a directory")
    return sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in path.iterdir() if f.is_file())
