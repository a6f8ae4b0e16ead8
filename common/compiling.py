"""``torch.compile`` as the sampler and the learner use it: one raised recompile limit, small
functions of tensors compiled once per process, and the count of graphs compiled.

Every static step, every new canvas shape and every new micro-batch shape is one more
specialisation of the same code object; beyond torch's limit (8) it would silently fall back to
eager. The limit is raised once, before anything compiles.

A job reports the graphs compiled in each step (``rollout/compiles``, ``learner/compiles``): after
the first shapes they stay at zero. A count that keeps rising means a guard specialises on
something that changes from call to call: every call pays a compilation, and past the limit the
code runs eager, at a fraction of its speed, with nothing else to show it.
"""
from __future__ import annotations

import sys
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


def graphs_compiled() -> int:
    """Graphs ``torch.compile`` has compiled in this process so far (dynamo's own count; 0 while
    nothing has been compiled)."""
    utils = sys.modules.get("torch._dynamo.utils")
    return 0 if utils is None else int(utils.counters["stats"]["unique_graphs"])
