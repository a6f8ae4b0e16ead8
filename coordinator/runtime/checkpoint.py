"""Checkpoints: the learner's DeepSpeed state plus everything the coordinator needs to continue,
checked before a resume trusts any of it.

    output_dir/checkpoints/latest                     the newest tag (DeepSpeed writes it)
    output_dir/checkpoints/step<N>/                   DeepSpeed shards + optimizer state, rng_rank<r>.pt
    output_dir/checkpoints/step<N>/episodes.*         groups generated but not yet trained on (episode_io)
    output_dir/checkpoints/step<N>/coordinator.json   written last: the client state, the resolved
                                                      config, parameter shapes, every file's size,
                                                      sealed under the user's key (common/trust/seal.py)
    output_dir/checkpoints/step<N>/.written_rank<r>   a background save: rank r's files are durable

With ``run.async_checkpoint`` (``begin_save``) each learner rank writes its files from a thread
of its own and leaves its marker when they are durable; the coordinator checks the markers between
steps (``PendingSave.poll``) and only then writes the episodes, coordinator.json and ``latest``.

The client state holds the step, the policy version, the prompt stream's cursor, the staleness
controller's counters, the next request uid, the requests re-queued after a fault and not yet
re-admitted, the reward-call and fault counters. Every RNG of the job is covered: each learner
rank saves its Python / NumPy / torch (/ CUDA) generators; rollout seeds derive from
(run.seed, uid, sample index) and the coordinator draws none, so no other RNG state exists.

``verify`` runs before any actor starts and refuses, with the reason: a tag without
coordinator.json (a save that did not finish: the previous complete tag is used instead, and
said so), a file whose size differs from the manifest (truncated or partly copied) or that the
manifest does not list, a file that does not read as a torch checkpoint or that would unpickle
anything beyond the few DeepSpeed classes its optimizer state holds (``stabledrl.common.trust.checkpoint_files``,
which each learner rank runs again before it loads, under torch's restricted unpickler), and a
config that differs in a field the saved state depends on.
``check_shapes`` refuses a checkpoint of another model once the learner reports its shapes.
"""
from __future__ import annotations

import json
import logging
import os
import stat
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from stabledrl.common.trust.seal import seal_json
from stabledrl.common.trust.checkpoint_files import (
    FORMAT, STATE_FILE, CheckpointError, clear_incomplete, read_latest, verify_tag,
)
from stabledrl.coordinator.runtime.actors import Actors, wait
from stabledrl.coordinator.runtime.episode_io import load_episodes, save_episodes
from stabledrl.common.types import Episode
from stabledrl.learner.async_checkpoint import marker_name

log = logging.getLogger(__name__)

# fields the saved state depends on (dotted prefixes); everything else may change on resume
# (learner.num_ranks and learner.deepspeed.zero_stage may change: the learner re-shards, learner/reshard.py)
MUST_MATCH = ("model", "task", "sampler", "estimator", "loss", "algorithm", "learner.lora", "run.seed")
MAY_DIFFER = (
    "sampler.max_batch_size",
    "sampler.cuda_graph",
    "algorithm.micro_batch_size",
    "model.gradient_checkpointing",
    "learner.lora.push",
    # the reward's confinement: a resume may tighten it; loosening it needs --allow-weaker-sandbox
    # (common/trust/seal.py)
    "task.reward.isolation",
    "task.reward.sandbox",
    "task.reward.timeout_s",
)


def checkpoint_dir(output_dir: Path) -> Path:
    return Path(output_dir) / "checkpoints"


def save(actors: Actors, output_dir: Path, step: int, state: dict[str, Any], episodes: list[Episode],
         timeout_s: float) -> Path:
    """Collective save on every learner rank, then the episodes, then coordinator.json (last, atomically:
    its presence marks the tag complete). ``state`` must hold "config" and "parameter_shapes"."""
    directory = checkpoint_dir(output_dir)
    tag = f"step{step}"
    clear_incomplete(directory / tag)
    ensure_writable(directory / tag)
    state = {"format": FORMAT, "tag": tag, **state}
    client = {k: v for k, v in state.items() if k not in ("config", "parameter_shapes")}
    wait(actors.call_learners("save_checkpoint", str(directory), client, tag), timeout_s,
         [f"learner rank {r} (checkpoint {tag})" for r in range(len(actors.learners))])
    with disk_errors(directory / tag):
        save_episodes(directory / tag, episodes)
        write_state(directory / tag, state)
    return directory / tag


def begin_save(actors: Actors, output_dir: Path, step: int, state: dict[str, Any], episodes: list[Episode],
               timeout_s: float) -> "PendingSave":
    """``save`` with the learner files written in the background (learner/checkpoint_process.py):
    returns once every rank has handed its state to its writer. The tag is complete only after
    ``PendingSave.finish``: every rank's marker file says its files are durable, then the episodes,
    coordinator.json and ``latest`` are written."""
    directory = checkpoint_dir(output_dir)
    tag = f"step{step}"
    clear_incomplete(directory / tag)
    ensure_writable(directory / tag)
    state = {"format": FORMAT, "tag": tag, **state}
    client = {k: v for k, v in state.items() if k not in ("config", "parameter_shapes")}
    wait(actors.call_learners("save_checkpoint", str(directory), client, tag, background=True), timeout_s,
         [f"learner rank {r} (checkpoint {tag})" for r in range(len(actors.learners))])
    return PendingSave(directory / tag, len(actors.learners), state, list(episodes))


@dataclass
class PendingSave:
    """A checkpoint whose learner files are being written; each rank leaves a marker file when its
    files are durable (or its write failed), which the coordinator reads from the shared directory,
    so a rank that dies after its write still leaves a checkpoint that can complete."""

    path: Path
    ranks: int
    state: dict[str, Any]
    episodes: list[Episode]
    started: float = field(default_factory=time.monotonic)

    def written(self) -> bool:
        """Whether every rank's files are durable; CheckpointError if a rank's write failed."""
        for rank in range(self.ranks):
            marker = self.path / marker_name(rank)
            if not marker.is_file():
                return False
            report = json.loads(marker.read_text())
            if "error" in report:
                raise CheckpointError(f"learner rank {rank} could not write checkpoint {self.path}: {report['error']}"
                                      f"{kept_note(self.path.parent)}")
        return True

    def poll(self) -> bool:
        """Finish the checkpoint if every rank's files are durable; never blocks."""
        if not self.written():
            return False
        self.finish()
        return True

    def wait(self, timeout_s: float) -> bool:
        """Finish it once every rank's files are durable, waiting at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not self.written():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        self.finish()
        return True

    def finish(self) -> None:
        with disk_errors(self.path):
            save_episodes(self.path, self.episodes)
            write_state(self.path, self.state)
            latest = self.path.parent / ".latest.tmp"
            latest.write_text(self.path.name)
            os.replace(latest, self.path.parent / "latest")


@contextmanager
def disk_errors(path: Path) -> Iterator[None]:
    """An OSError of the coordinator's checkpoint writes (no space, a quota, permissions) as a
    CheckpointError in one line: the cause, the path, and the checkpoint a resume would use."""
    try:
        yield
    except OSError as e:
        raise CheckpointError(f"cannot write checkpoint {path}: {e.strerror or e} ({e.filename or path})"
                              f"{kept_note(path.parent)}") from None


def kept_note(directory: Path) -> str:
    """'; the last complete checkpoint, stepN, is kept' (or that there is none yet)."""
    try:
        return f"; the last complete checkpoint, {read_latest(directory)}, is kept"
    except (CheckpointError, OSError):
        return "; no complete checkpoint was written before it"


def ensure_writable(directory: Path) -> None:
    """Create ``directory`` and prove a file can be written in it; a CheckpointError that says why
    not (torch.save would only say that the parent directory does not exist)."""
    probe = Path(directory) / f".write-test-{os.getpid()}"
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        blocked = Path(e.filename or directory)
        while not blocked.exists() and blocked != blocked.parent:
            blocked = blocked.parent
        info = blocked.stat()
        raise CheckpointError(
            f"cannot write the checkpoint {directory}: {e.strerror or e} ({blocked} is owned by uid {info.st_uid}, "
            f"mode {stat.filemode(info.st_mode)}; this job runs as uid {os.geteuid()}): run.output_dir must be "
            "writable by the job") from None


def write_state(path: Path, state: dict[str, Any]) -> None:
    """coordinator.json with the size of every other file of the tag, written atomically."""
    state = seal_json({**state, "files": {p.name: p.stat().st_size for p in sorted(path.iterdir())
                                          if p.is_file() and not p.name.startswith(".") and p.name != STATE_FILE}})
    tmp = path / f".{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path / STATE_FILE)


@dataclass
class Resume:
    directory: Path
    tag: str
    state: dict[str, Any]
    episodes: list[Episode] = field(default_factory=list)


def verify(directory: Path, config: dict[str, Any]) -> Resume:
    """The newest complete checkpoint under ``directory`` checked against ``config`` (the job's
    resolved config as JSON); CheckpointError with the reason otherwise."""
    directory = Path(directory)
    latest = directory / "latest"
    if not latest.is_file() and not latest.is_symlink():  # a symlink is refused, naming it, by read_latest
        raise CheckpointError(f"run.resume_from: {directory} holds no checkpoint (no 'latest' file)")
    tags = sorted((p.name for p in directory.glob("step*") if p.is_dir()), key=_step_of, reverse=True)
    first = read_latest(directory)  # a plain tag name: never a path out of the directory
    tags = [first] + [t for t in tags if t != first and _step_of(t) < _step_of(first)]
    for tag in tags:
        if (directory / tag / STATE_FILE).is_file():
            break
        log.info(f"checkpoint {directory / tag} is incomplete (no {STATE_FILE}: its save did not finish); "
                 "trying the one before")
    else:
        raise CheckpointError(f"run.resume_from: no complete checkpoint under {directory} (tags tried: {tags})")
    path = directory / tag
    state = verify_tag(path)
    _check_config(state["config"], config, path)
    try:
        episodes = load_episodes(path)
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    return Resume(directory, tag, state, episodes)


def load(actors: Actors, resume: Resume, timeout_s: float) -> dict[str, Any]:
    """Restore every learner rank from the verified tag; returns the client state."""
    seed = int(resume.state.get("config", {}).get("run", {}).get("seed", 0))
    states = wait(actors.call_learners("load_checkpoint", str(resume.directory), resume.tag, seed), timeout_s,
                  [f"learner rank {r} (load checkpoint {resume.tag})" for r in range(len(actors.learners))])
    if states[0].get("step") != resume.state["step"]:
        raise CheckpointError(f"{resume.directory / resume.tag}: DeepSpeed's client state is step "
                              f"{states[0].get('step')}, {STATE_FILE} says {resume.state['step']}")
    return states[0]


def check_shapes(saved: dict[str, list[int]], current: dict[str, list[int]], where: Path) -> None:
    """Refuse a checkpoint of another model: parameters missing, extra, or of another shape."""
    problems = [f"{n}: checkpoint {saved[n]}, model {current[n]}" for n in sorted(set(saved) & set(current))
                if list(saved[n]) != list(current[n])]
    problems += [f"{n}: only in the checkpoint" for n in sorted(set(saved) - set(current))]
    problems += [f"{n}: only in the model" for n in sorted(set(current) - set(saved))]
    if problems:
        raise CheckpointError(f"{where} holds another model ({len(problems)} parameters differ), e.g. "
                              + "; ".join(problems[:3]))


# ---- the checks -----------------------------------------------------------------------------
def _step_of(tag: str) -> int:
    digits = tag.removeprefix("step")
    return int(digits) if digits.isdigit() else -1


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: data}


def _check_config(saved: dict[str, Any], current: dict[str, Any], where: Path) -> None:
    def relevant(key: str) -> bool:
        under = lambda p: key == p or key.startswith(p + ".")  # noqa: E731
        return any(under(p) for p in MUST_MATCH) and not any(under(p) for p in MAY_DIFFER)

    old, new = _flatten(saved), _flatten(current)
    differ = [f"{k}: checkpoint {old.get(k)!r}, config {new.get(k)!r}" for k in sorted(set(old) | set(new))
              if relevant(k) and old.get(k) != new.get(k)]
    if differ:
        raise CheckpointError(f"{where} was written by another config; these fields must match to resume: "
                              + "; ".join(differ))
