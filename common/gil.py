"""Latency of a thread that shares its process with busy ones: Python's GIL and its cyclic
garbage collector, for a weight push received or sent beside an actor's other work."""
from __future__ import annotations

import contextlib
import gc
import sys
import threading
from typing import Iterator

SWITCH_S = 2e-4  # the switch interval while a weight push runs beside another thread (prompt_gil)
_lock = threading.Lock()
_held = {"blocks": 0, "before": None, "gc": False}


@contextlib.contextmanager
def prompt_gil(interval_s: float = SWITCH_S) -> Iterator[None]:
    """While any such block runs: Python's switch interval at most ``interval_s``, and no cyclic
    garbage collection starts.

    A thread that gives the GIL up (each store call, each copy it issues, each wait) takes it back
    only when the thread now holding it gives it up or is made to at the switch interval (5 ms by
    default). A weight push of a few dozen such calls, received by a rollout worker's thread beside
    its request thread busy in Python (or sent by a learner rank beside its checkpoint writer),
    waited up to an interval for each. A collection of the generation that holds a worker's
    libraries and model (350,000 objects: 0.15-0.18 s, ``settle_heap``) holds the GIL throughout,
    whichever thread's allocation set it off; the push's own allocations (its handles, its rows)
    set some off. The other threads are interrupted more often meanwhile (a switch costs
    microseconds), for the push's milliseconds only; what they allocate meanwhile is collected
    after. Blocks may overlap, on any threads: the first sets both, the last one out puts back
    what the first found."""
    with _lock:
        if _held["blocks"] == 0:
            _held["before"], _held["gc"] = sys.getswitchinterval(), gc.isenabled()
            gc.disable()
        _held["blocks"] += 1
        sys.setswitchinterval(min(sys.getswitchinterval(), interval_s))
    try:
        yield
    finally:
        with _lock:
            _held["blocks"] -= 1
            if _held["blocks"] == 0:
                sys.setswitchinterval(_held["before"])
                if _held["gc"]:
                    gc.enable()


def settle_heap(actors_only: bool = True) -> int:
    """Collect, then leave every object alive now out of later collections (``gc.freeze``): an
    actor's libraries and model, once it is set up. A full collection then walks only what came
    after: in a process holding a worker's imports (torch, transformers, ray, deepspeed; 350,000
    objects) one took 0.17 s on a 2-core CPU, and 0.0 s after this. What is frozen is never
    collected, so an actor calls it once, after its set-up; ``actors_only``: nothing happens
    outside a Ray actor's process (a test or a driver that builds a worker in its own process).
    Returns the objects frozen in all (0: none)."""
    if actors_only and not _in_actor():
        return 0
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def _in_actor() -> bool:
    try:
        import ray

        return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None
    except Exception:  # noqa: BLE001 - no Ray, or no runtime context: not an actor
        return False
