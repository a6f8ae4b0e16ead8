"""Deterministic seeds derived from (seed, step, prompt id, sample index, ...), never global RNG.

A run is a function of (config, seed): every random draw in sampling and likelihood estimation
takes a ``torch.Generator`` seeded from a key built here, so the rollout worker and the learner can
reproduce the same masks from the ``mask_seed`` carried by a sample.
"""
from __future__ import annotations

import hashlib

import torch

_MASK63 = (1 << 63) - 1


def derive_seed(*parts: object) -> int:
    """A 63-bit seed that depends only on ``parts`` (stable across processes and Python runs;
    ``hash()`` is salted per process, so it is not used)."""
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little") & _MASK63


def generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g
