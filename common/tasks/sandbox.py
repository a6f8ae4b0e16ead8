"""Reward scoring that never takes the worker down: failures are isolated, counted and mapped.

``RewardScorer.score(completion, row)`` returns a ``RewardResult``, or None when the sample is
to be dropped. A reward call fails when it raises, returns a non-number, returns NaN/inf (in
the total or any part), runs past ``timeout_s``, or kills its process. A failure is counted in
``RewardStats`` under its kind and then, per ``reward.on_failure``, scored 0 (every part 0) or
dropped. Built-in and custom rewards go through the same path.

Isolation (``reward.isolation``):
- ``process``: rewards run in a child Python process (``python -m common.tasks.sandbox_child``,
  talking over its stdin/stdout pipes; the child's own prints go to stderr). A call that
  outlives ``timeout_s`` gets its child killed; the next call starts a fresh one. A crash
  (``sys.exit``, segfault, out of memory) is contained the same way. This isolates faults, not
  privileges: user code runs with the worker's permissions. Cost: one pipe round trip per call.
- ``inline``: rewards run in the calling thread. Exceptions and bad values are caught, but a
  reward that hangs cannot be interrupted, so timeouts are not enforced.
"""
from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
from collections import deque
from dataclasses import dataclass, fields
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Optional

from common.config.base import ConfigError
from common.tasks.base import NonNumericReward, RewardResult, Row, Task

log = logging.getLogger(__name__)
START_TIMEOUT_S = 120.0
_PROJECT_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass
class RewardStats:
    """Counters of reward calls by outcome (add them up across workers with ``merge``)."""

    calls: int = 0
    ok: int = 0
    exception: int = 0
    non_number: int = 0
    non_finite: int = 0
    timeout: int = 0
    crash: int = 0
    zeroed: int = 0
    dropped: int = 0

    @property
    def failed(self) -> int:
        return self.exception + self.non_number + self.non_finite + self.timeout + self.crash

    def merge(self, other: "RewardStats") -> "RewardStats":
        return RewardStats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def as_metrics(self, prefix: str = "reward/") -> dict[str, float]:
        out = {f"{prefix}{f.name}": float(getattr(self, f.name)) for f in fields(self)}
        out[f"{prefix}failed"] = float(self.failed)
        return out


def checked(value: Any) -> RewardResult:
    """``value`` as a RewardResult with finite numbers, else NonNumericReward / FloatingPointError."""
    if not isinstance(value, RewardResult):
        raise NonNumericReward(f"reward returned {type(value).__name__}, not a RewardResult")
    numbers = [value.total, *value.parts.values()]
    if not all(isinstance(v, (int, float)) for v in numbers):
        raise NonNumericReward("reward parts must be numbers")
    if not all(math.isfinite(v) for v in numbers):
        raise FloatingPointError(f"reward is not finite: total={value.total}, parts={value.parts}")
    return RewardResult(total=float(value.total), parts={k: float(v) for k, v in value.parts.items()})


def outcome_of(e: BaseException) -> str:
    if isinstance(e, NonNumericReward):
        return "non_number"
    if isinstance(e, FloatingPointError):
        return "non_finite"
    return "exception"


class _Child:
    """One sandbox process; ``call`` returns (outcome, payload) and never raises."""

    def __init__(self, task_config: dict) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PROJECT_ROOT, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "common.tasks.sandbox_child"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        self.to_child = Connection(os.dup(self.proc.stdin.fileno()), readable=False)
        self.from_child = Connection(os.dup(self.proc.stdout.fileno()), writable=False)
        self.to_child.send(task_config)
        outcome, payload = self._receive(START_TIMEOUT_S)
        if outcome != "ready":
            self.close()
            raise ConfigError(f"reward sandbox failed to start: {payload}")

    def call(self, completion: str, row: Row, timeout_s: float) -> tuple[str, Any]:
        try:
            self.to_child.send((completion, row))
        except (OSError, EOFError) as e:
            return "crash", repr(e)
        return self._receive(timeout_s)

    def _receive(self, timeout_s: float) -> tuple[str, Any]:
        try:
            if not self.from_child.poll(timeout_s):
                self.close()
                return "timeout", f"no answer in {timeout_s}s"
            return self.from_child.recv()
        except (OSError, EOFError):
            self.close()
            return "crash", f"exit code {self.proc.poll()}"

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for end in (self.to_child, self.from_child, self.proc.stdin, self.proc.stdout):
            try:
                end.close()
            except OSError:
                pass


class RewardScorer:
    """Scores completions for one task config; see the module docstring for the failure policy."""

    def __init__(self, cfg: Any, task: Optional[Task] = None) -> None:
        """``task``: an already built task to score inline (default: built from ``cfg``)."""
        from common.tasks.build import CustomReward, build_task

        self.cfg = cfg
        self.stats = RewardStats()
        self.recent_failures: deque[tuple[str, str]] = deque(maxlen=8)  # (kind, message), for logs
        self.isolation = cfg.reward.resolved_isolation
        self._child: Optional[_Child] = None
        self._task: Optional[Task] = None
        if task is not None and self.isolation == "process":
            raise ValueError("a prebuilt task can only be scored inline; the sandbox child builds its own from cfg")
        if self.isolation == "inline":
            self._task = task or build_task(cfg)
            if isinstance(self._task.correctness, CustomReward):
                self._task.correctness.load()  # fail fast on a bad spec
        else:
            self._child = _Child(cfg.model_dump(mode="json"))

    def score(self, completion: str, row: Row) -> Optional[RewardResult]:
        self.stats.calls += 1
        outcome, payload = self._call(completion, row)
        if outcome == "ok":
            self.stats.ok += 1
            return payload
        if not getattr(self.stats, outcome):
            log.warning("reward %s on prompt %s: %s (further ones are only counted)", outcome, row.prompt_id, payload)
        setattr(self.stats, outcome, getattr(self.stats, outcome) + 1)
        self.recent_failures.append((outcome, str(payload)[:500]))
        if self.cfg.reward.on_failure == "drop":
            self.stats.dropped += 1
            return None
        self.stats.zeroed += 1
        return RewardResult(total=0.0, parts={})

    def _call(self, completion: str, row: Row) -> tuple[str, Any]:
        if self._task is not None:
            try:
                return "ok", checked(self._task.reward(completion, row))
            except (Exception, SystemExit) as e:  # user code calling sys.exit must not end the worker
                return outcome_of(e), repr(e)
        if self._child is None or not self._child.alive:
            try:
                self._child = _Child(self.cfg.model_dump(mode="json"))
            except ConfigError as e:
                return "crash", str(e)
        outcome, payload = self._child.call(completion, row, self.cfg.reward.timeout_s)
        if outcome != "ok":
            return outcome, payload
        try:
            return "ok", checked(RewardResult(total=payload[0], parts=payload[1]))
        except Exception as e:
            return outcome_of(e), repr(e)

    def close(self) -> None:
        if self._child is not None:
            self._child.close()
            self._child = None

    def __enter__(self) -> "RewardScorer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_child", None) is not None:
            try:
                self.close()
            except Exception:  # interpreter shutdown: the child dies with its stdin anyway
                pass
