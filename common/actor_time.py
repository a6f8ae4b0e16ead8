"""Where each actor's time goes: busy seconds per activity, measured inside the actor.

Every learner rank and rollout worker keeps one ``ActorClock``. Its work is wrapped in
``clock.timed(activity)``; ``snapshot()`` returns the cumulative seconds per activity, the wall
time since the actor started, its GPU (the physical index Ray assigned) and its peak GPU memory.
Snapshots (keys ``clock/<name>``) ride back on results the coordinator receives anyway (the
``clock`` of a RolloutResult and of a StepResult, common/types.py); ``ActorTimes`` on the
coordinator turns them into per-step metrics:

    time/<actor>/<activity>   seconds spent on it since the actor's previous snapshot
    time/<actor>/wall         seconds since the previous snapshot
    time/<actor>/idle         wall - the busy seconds of the actor's main thread
    actor/<actor>/gpu, actor/<actor>/peak_memory_gib

Activities on a thread of their own (a rollout worker staging weights while it generates, a
learner's background checkpoint write) are reported but not subtracted from the wall: they
overlap the main thread's work, so idle counts only the main thread. Parts of an activity
(``within``: a learner's push split into the GPU work it waited for, the gathers and copies, and the
memory it handed back) are reported beside it and not added to the main thread's busy time twice.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Iterable, Iterator, Optional

import torch

PREFIX = "clock/"
# a learner's background checkpoint write (a push's activities on threads of their own, and its
# parts: common/transport/clocks.py)
BACKGROUND = ("checkpoint_write", "checkpoint_snapshot")
# the parts of a learner rank's step, timed inside "train": DeepSpeed's optimizer step (the gradients' reduction,
# clipping, the update and the parameters' gather) and its estimates without a gradient (the frozen reference's of a
# KL term; the old policy's under per-iteration masks)
TRAIN_PARTS = ("train_optimizer", "train_score")


class ActorClock:
    def __init__(self, background: Iterable[str] = (), within: Iterable[str] = ()) -> None:
        """``background``: activities that run beside the main thread (not subtracted for idle);
        ``within``: parts of another activity, timed inside it (not subtracted a second time)."""
        self.start = time.perf_counter()
        self.busy: dict[str, float] = {}
        self.background = frozenset(background)
        self.within = frozenset(within)
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def timed(self, activity: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(activity, time.perf_counter() - t0)

    def add(self, activity: str, seconds: float) -> None:
        with self._lock:
            self.busy[activity] = self.busy.get(activity, 0.0) + float(seconds)

    def snapshot(self) -> dict[str, float]:
        """``clock/<activity>`` cumulative seconds, ``clock/wall``, ``clock/main_busy`` (the main
        thread's activities), ``clock/gpu`` and ``clock/peak_memory_gib`` (when on a GPU)."""
        with self._lock:
            busy = dict(self.busy)
        out = {PREFIX + k: v for k, v in busy.items()}
        out[PREFIX + "wall"] = time.perf_counter() - self.start
        out[PREFIX + "main_busy"] = sum(v for k, v in busy.items() if k not in self.background | self.within)
        gpu = physical_gpu()
        if gpu is not None:
            out[PREFIX + "gpu"] = float(gpu)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out[PREFIX + "peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        return out


def physical_gpu() -> Optional[int]:
    """The index of this process's first GPU as the driver (nvidia-smi) numbers it: Ray sets
    CUDA_VISIBLE_DEVICES to the GPUs it assigned. None on a CPU or with UUID-style ids."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(visible) if visible.isdigit() and torch.cuda.is_available() else None


class ActorTimes:
    """The coordinator's side: the newest snapshot of every actor, turned into per-step deltas."""

    NOT_TIMES = ("wall", "main_busy", "gpu", "peak_memory_gib")

    def __init__(self) -> None:
        self.latest: dict[str, dict[str, float]] = {}
        self.logged: dict[str, dict[str, float]] = {}

    def update(self, actor: str, snapshot: dict[str, float]) -> None:
        if snapshot:
            self.latest[actor] = {k.removeprefix(PREFIX): v for k, v in snapshot.items()}

    def step_metrics(self) -> dict[str, float]:
        """Deltas since the previous call for every actor with a newer snapshot (see the module
        docstring); an actor restarted since (its wall went back) starts from zero again."""
        out: dict[str, float] = {}
        for actor, now in sorted(self.latest.items()):
            before = self.logged.get(actor, {})
            if before.get("wall", -1.0) > now["wall"]:
                before = {}
            if now["wall"] == before.get("wall"):
                continue
            wall = now["wall"] - before.get("wall", 0.0)
            out[f"time/{actor}/wall"] = wall
            out[f"time/{actor}/idle"] = max(0.0, wall - (now["main_busy"] - before.get("main_busy", 0.0)))
            for key, value in now.items():
                if key not in self.NOT_TIMES:
                    out[f"time/{actor}/{key}"] = value - before.get(key, 0.0)
            for key in ("gpu", "peak_memory_gib"):
                if key in now:
                    out[f"actor/{actor}/{key}"] = now[key]
            self.logged[actor] = now
        return out
