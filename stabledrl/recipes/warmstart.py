"""The warm start: a short masked-diffusion SFT stage, run once and cached by content hash.

A random tiny model never samples a right answer, so RL has no signal to work with. The job
therefore first fine-tunes the model on the task's *training* rows and their reference completions
(``stabledrl.learner.sft.run_sft``, LLaDA's SFT loss) for a few hundred steps, saves it as a model directory
and trains RL from there. Held-out rows are never seen.

    path = warm_start(cfg)                       # cfg: JobConfig with a warmstart section
    policy, tokenizer = load_policy(ModelConfig(path=path))

The directory is ``cfg.warmstart.cache_dir / f"{model}-{task}-{key}"`` where ``key`` hashes
everything that determines the weights: the model section (and, for a checkpoint, its files'
names, sizes and mtimes), the task section, the warmstart section (not ``cache_dir`` or
``log_every``), the canvas width ``sampler.gen_length``, the SFT's seed (``warmstart.seed``, else
``run.seed``), the device and, on the CPU, the torch thread count the SFT runs with (``seed`` and
``threads`` enter by these effective values), and ``WARMSTART_FORMAT``. The weights also depend
on the processor's floating-point path: another CPU model may give another warm start from the
same config, and the cache is local to the machine.
A directory holding ``warmstart.json`` is complete and reused; it is written under a temporary
name and renamed into place, so concurrent jobs and interrupted runs never see a partial one.
The manifest lists every file of the directory with its size and SHA-256 and is sealed under the
user's key (common/trust/seal.py: an HMAC, so hashes rewritten after a weight swap do not match it);
a reused directory is checked against it first, and a manifest that fails its seal, or a file
added, missing or changed since (a cache others can write to) is refused, naming the file, before
anything is loaded from it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from stabledrl.common.trust.checkpoint_files import CheckpointError
from stabledrl.common.trust.seal import json_is_sealed, key_file, seal_json
from stabledrl.common.config.base import ConfigError
from stabledrl.common.config.job import JobConfig
from stabledrl.common.models import export_hf, load_policy
from stabledrl.common.models.loading import quiet_progress
from stabledrl.common.models.model_dir import resolve_model_dir
from stabledrl.common.tasks import load_task_data
from stabledrl.learner.sft import run_sft

WARMSTART_FORMAT = 3  # bump when the SFT code changes what one config produces (2: files hashed; 3: manifest sealed)
MANIFEST = "warmstart.json"
log = logging.getLogger(__name__)


def warmstart_key(cfg: JobConfig) -> str:
    """16 hex digits of a SHA-256 over everything that determines the warm-started weights."""
    if cfg.warmstart is None:
        raise ConfigError("warmstart: this job has no warmstart section")
    parts: dict[str, Any] = {
        "format": WARMSTART_FORMAT,
        "model": cfg.model.model_dump(mode="json"),
        "model_files": _fingerprint(resolve_model_dir(cfg.model.path, cfg.model.revision))
        if cfg.model.path is not None
        else None,
        "task": cfg.task.model_dump(mode="json"),
        "warmstart": cfg.warmstart.model_dump(mode="json", exclude={"cache_dir", "log_every", "seed", "threads"}),
        "gen_length": cfg.sampler.gen_length,
        "seed": sft_seed(cfg),
        "device": _device(),
        "threads": sft_threads(cfg) if _device() == "cpu" else None,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def sft_seed(cfg: JobConfig) -> int:
    """The seed of the SFT's row order and masks: ``warmstart.seed``, else ``run.seed``."""
    return cfg.run.seed if cfg.warmstart.seed is None else cfg.warmstart.seed


def sft_threads(cfg: JobConfig) -> int:
    """The torch thread count the SFT runs with on the CPU: ``warmstart.threads``, else the current one."""
    return cfg.warmstart.threads or torch.get_num_threads()


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def warmstart_dir(cfg: JobConfig) -> Path:
    """Where the warm start of ``cfg`` is (or will be) cached."""
    source = cfg.model.preset or Path(cfg.model.path).name
    return Path(cfg.warmstart.cache_dir).expanduser() / f"{source}-{cfg.task.name}-{warmstart_key(cfg)}"


def warm_start(cfg: JobConfig) -> Path:
    """The directory of ``cfg.model`` fine-tuned on ``cfg.task``'s training rows (built if absent).

    Training runs in float32 on CUDA when available, else on the CPU with ``sft_threads(cfg)`` torch
    threads (the process's count is restored afterwards); the directory is written with ``export_hf``
    and loads with ``ModelConfig(path=...)``.
    """
    final = warmstart_dir(cfg)
    if (final / MANIFEST).is_file():
        check_cached(final)
        log.info(f"warm start: reusing {final}")
        return final
    if final.exists():
        raise FileExistsError(f"{final} exists but holds no {MANIFEST}; it was not written by warm_start, remove it")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary directory
    try:
        _build(cfg, tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / MANIFEST).is_file():
                raise
            log.info(f"warm start: another job cached {final} first; using it")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info(f"warm start: cached at {final}")
    return final


def _build(cfg: JobConfig, directory: Path) -> None:
    ws = cfg.warmstart
    t0 = time.perf_counter()
    device, threads = _device(), torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(sft_threads(cfg))
    try:
        metrics = _train(cfg, directory, device)
    finally:
        torch.set_num_threads(threads)
    manifest = {
        "files": file_hashes(directory),
        "key": warmstart_key(cfg),
        "model": cfg.model.model_dump(mode="json"),
        "task": cfg.task.model_dump(mode="json"),
        "warmstart": ws.model_dump(mode="json"),
        "gen_length": cfg.sampler.gen_length,
        "seed": sft_seed(cfg),
        "device": device,
        "threads": sft_threads(cfg) if device == "cpu" else None,
        "train_rows": metrics.pop("train_rows"),
        "metrics": metrics,
        "time_s": time.perf_counter() - t0,
    }
    (directory / MANIFEST).write_text(json.dumps(seal_json(manifest), indent=2, sort_keys=True) + "\n")


def _train(cfg: JobConfig, directory: Path, device: str) -> dict[str, Any]:
    """The SFT itself: ``cfg.model`` trained on the training rows and exported to ``directory``."""
    ws = cfg.warmstart
    policy, tokenizer = load_policy(cfg.model, device=device, dtype="float32")
    data = load_task_data(cfg.task, tokenizer=tokenizer)
    n_params = sum(p.numel() for p in policy.parameters())
    log.info(
             f"warm start: SFT of {cfg.model.preset or cfg.model.path} ({n_params / 1e6:.2f}M parameters) on "
             f"{len(data.train)} {cfg.task.name} training rows, {ws.steps} steps of {ws.batch_size} on {device}"
             + (f" ({torch.get_num_threads()} threads, " if device == "cpu" else " (") + f"seed {sft_seed(cfg)})"
    )
    metrics = run_sft(
        policy, tokenizer, data.train, data.task, ws, sft_seed(cfg),
        gen_length=cfg.sampler.gen_length, label="warm start: sft",
    )  # fmt: skip
    with quiet_progress():  # no transformers progress bar in the job's log
        export_hf(policy.to("cpu"), tokenizer, directory)
    return {**metrics, "train_rows": len(data.train)}


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
        manifest = json.loads((directory / MANIFEST).read_text())
        listed = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{directory / MANIFEST} cannot be read or lists no files ({e!r}); "
                              f"remove {directory} to rebuild the warm start") from None
    if not json_is_sealed(manifest):  # hashes rewritten with the weights they cover would otherwise pass
        raise CheckpointError(
            f"{directory / MANIFEST} does not match its seal under {key_file()} (its hashes were "
            f"rewritten, or another user or machine built it): refused; remove {directory} to rebuild "
            "the warm start"
        )
    found = file_hashes(directory) if all(p.is_file() for p in directory.iterdir()) else None
    if found is None:
        raise CheckpointError(f"{directory} holds a subdirectory; a warm start holds files only: remove it to rebuild")
    for name in sorted(set(listed) | set(found)):
        if listed.get(name) != found.get(name):
            what = (
                "is not in" if name not in listed else "is missing, listed in" if name not in found else "differs from"
            )
            raise CheckpointError(f"{directory / name} {what} the warm start's manifest ({MANIFEST}): refused "
                                  f"(changed after it was written); remove {directory} to rebuild it")


def _fingerprint(path: Path) -> list[tuple[str, int, int]]:
    """(name, size, mtime_ns) of every file of a checkpoint directory: a cheap content identity."""
    path = path.expanduser()
    if not path.is_dir():
        raise ConfigError(f"model.path {path} is not a directory")
    return sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in path.iterdir() if f.is_file())
