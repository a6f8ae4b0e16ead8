"""``torch.compile`` as the sampler and the learner use it: one raised recompile limit, and small
functions of tensors compiled once per process.

Every static step, every new canvas shape and every new micro-batch shape is one more
specialisation of the same code object; beyond torch's limit (8) it would silently fall back to
eager. The limit is raised once, before anything compiles.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

RECOMPILE_LIMIT = 64  # compiled specialisations per code object in one process (torch's default is 8)
_COMPILED: dict[tuple[Callable, tuple], Callable] = {}


def raise_recompile_limit() -> None:
    """torch._dynamo's recompile limit up to ``RECOMPILE_LIMIT`` (never lowered)."""
    import torch._dynamo

    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))


def compiled_once(fn: Callable, options: Optional[dict[str, Any]] = None) -> Callable:
    """``torch.compile(fn, options=options)``, built at the first request and kept for the process
    (the same object for every later request with the same options)."""
    key = (fn, tuple(sorted((options or {}).items())))
    if key not in _COMPILED:
        raise_recompile_limit()
        _COMPILED[key] = torch.compile(fn, options=options) if options else torch.compile(fn)
    return _COMPILED[key]
