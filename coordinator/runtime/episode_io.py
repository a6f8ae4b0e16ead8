"""Finished episodes on disk, for a checkpoint: tensors in safetensors, everything else in JSON.

A checkpoint keeps the groups that were generated but not yet trained on, so that a resumed run
trains on the very samples (same behaviour estimates, same policy versions, hence the same
staleness) the uninterrupted run would have. Nothing here is unpickled: ``load_episodes`` reads a
safetensors file and a JSON list, and checks that every tensor a record names is there.

    episodes.safetensors   "<uid>/<index>/<field>" -> tensor  (prompt_ids, completion_ids, and
                           decode_step / behaviour_token_logp where the sample has them)
    episodes.json          [{uid, prompt_id, worker, stats, samples: [{sample_id, reward, ...}]}]
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import torch

from stabledrl.common.types import Episode, Group, Sample

TENSORS = ("prompt_ids", "completion_ids", "decode_step", "behaviour_token_logp")
SCALARS = ("sample_id", "prompt_id", "index", "completion_length", "reward", "reward_parts", "policy_version",
           "behaviour_logp", "estimator", "mask_seed", "answer")


def save_episodes(directory: Path, episodes: Sequence[Episode]) -> None:
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    records = []
    for e in episodes:
        if e.group is None:
            continue
        for s in e.group.samples:
            for name in TENSORS:
                value = getattr(s, name)
                if value is not None:  # a view into a request's batch: copy it out
                    tensors[f"{e.uid}/{s.index}/{name}"] = value.detach().to("cpu").contiguous().clone()
        records.append({"uid": e.uid, "prompt_id": e.prompt_id, "worker": e.worker, "stats": e.stats,
                        "samples": [{k: getattr(s, k) for k in SCALARS} for s in e.group.samples]})
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "episodes.safetensors"))
    (directory / "episodes.json").write_text(json.dumps(records) + "\n")


def load_episodes(directory: Path) -> list[Episode]:
    """The episodes ``save_episodes`` wrote; ValueError naming what is missing or malformed."""
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(directory / "episodes.safetensors"))
        records = json.loads((directory / "episodes.json").read_text())
    except Exception as e:  # a missing, truncated or foreign file
        raise ValueError(f"cannot read the buffered episodes of {directory}: {e}") from e
    try:
        return [_episode(directory, r, tensors) for r in records]
    except (TypeError, KeyError, AttributeError, ValueError) as e:  # a field added, missing or of another type
        raise ValueError(
            f"{directory / 'episodes.json'} does not hold the episodes this job writes ({type(e).__name__}: "
            f"{e}): edited or written by another version; resume from another checkpoint"
        ) from None


def _episode(directory: Path, r: dict, tensors: dict) -> Episode:
    samples = []
    for fields in r["samples"]:
        key = f"{r['uid']}/{fields['index']}"
        for required in ("prompt_ids", "completion_ids"):
            if f"{key}/{required}" not in tensors:
                raise ValueError(f"episode {r['uid']} sample {fields['index']} has no {required}")
        samples.append(Sample(**fields, **{n: tensors.get(f"{key}/{n}") for n in TENSORS}))
    return Episode(uid=int(r["uid"]), prompt_id=r["prompt_id"], group=Group(r["prompt_id"], samples),
                   worker=int(r["worker"]), stats=dict(r["stats"]))
