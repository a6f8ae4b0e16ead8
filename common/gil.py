"""Python's GIL and the threads of one actor that each wait on the other."""
from __future__ import annotations

import contextlib
import sys
import threading
from typing import Iterator

SWITCH_S = 2e-4  # the switch interval while a weight push runs beside another thread (prompt_gil)
_lock = threading.Lock()
_held = {"blocks": 0, "before": None}


@contextlib.contextmanager
def prompt_gil(interval_s: float = SWITCH_S) -> Iterator[None]:
    """Python's switch interval at most ``interval_s`` while any such block runs.

    A thread that gives the GIL up (each store call, each copy it issues, each wait) takes it back
    only when the thread now holding it gives it up or is made to at the switch interval (5 ms by
    default). A weight push of a few dozen such calls, received by a rollout worker's thread beside
    its request thread busy in Python (or sent by a learner rank beside its checkpoint writer),
    waited up to an interval for each. The other threads are interrupted more often meanwhile (a
    switch costs microseconds), for the push's milliseconds only. Blocks may overlap, on any
    threads: the first sets the interval, the last one out puts back what the first found."""
    with _lock:
        if _held["blocks"] == 0:
            _held["before"] = sys.getswitchinterval()
        _held["blocks"] += 1
        sys.setswitchinterval(min(sys.getswitchinterval(), interval_s))
    try:
        yield
    finally:
        with _lock:
            _held["blocks"] -= 1
            if _held["blocks"] == 0:
                sys.setswitchinterval(_held["before"])
