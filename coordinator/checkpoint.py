"""Checkpoints: the learner's DeepSpeed state plus everything the coordinator needs to continue.

    output_dir/checkpoints/step<N>/          DeepSpeed shards + optimizer state, per-rank RNG
    output_dir/checkpoints/latest            the newest tag (DeepSpeed writes it)
    output_dir/checkpoints/step<N>/coordinator.json   the same client state, human-readable

The client state (saved through ``LearnerEngine.save_checkpoint``) holds the step, the policy
version, the prompt stream's cursor, the staleness controller's counters, the next request uid
and the requests that were admitted but not yet trained on (re-queued on resume with their uids,
so they are sampled with the same seeds). The coordinator draws no random numbers of its own:
every seed derives from (run.seed, uid, sample index), so no coordinator RNG state is needed.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from coordinator.actors import Actors, wait

FORMAT = 1


def checkpoint_dir(output_dir: Path) -> Path:
    return Path(output_dir) / "checkpoints"


def save(actors: Actors, output_dir: Path, step: int, state: dict[str, Any], timeout_s: float) -> Path:
    """Collective save on every learner rank; returns the tag's directory."""
    directory = checkpoint_dir(output_dir)
    tag = f"step{step}"
    state = {"format": FORMAT, **state}
    wait(actors.call_learners("save_checkpoint", str(directory), state, tag), timeout_s,
         [f"learner rank {r} (checkpoint {tag})" for r in range(len(actors.learners))])
    (directory / tag / "coordinator.json").write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    return directory / tag


def load(actors: Actors, directory: Path, timeout_s: float) -> dict[str, Any]:
    """Restore every learner rank from ``directory`` (its ``latest`` tag); returns the client state."""
    directory = Path(directory)
    if not (directory / "latest").is_file():
        raise FileNotFoundError(f"run.resume_from: {directory} holds no checkpoint (no 'latest' file)")
    states = wait(actors.call_learners("load_checkpoint", str(directory)), timeout_s,
                  [f"learner rank {r} (load checkpoint)" for r in range(len(actors.learners))])
    state = states[0]
    if state.get("format") != FORMAT:
        raise ValueError(f"run.resume_from: {directory} was written by another checkpoint format ({state.get('format')})")
    return state
