"""Reward scoring that never takes the worker down: failures are isolated, counted and mapped.

``RewardScorer.score(completion, row)`` returns a ``RewardResult``, or None when the sample is
to be dropped. A reward call fails when it raises, returns a non-number, returns NaN/inf (in
the total or any part), runs past ``timeout_s``, or kills its process. A failure is counted in
``RewardStats`` under its kind and then, per ``reward.on_failure``, scored 0 (every part 0) or
dropped. Built-in and custom rewards go through the same path.

Isolation (``reward.isolation``):
- ``process``: rewards run in the reward sandbox, a child Python process (``python -m
  stabledrl.common.sandbox.child``, talking over its stdin/stdout pipes; what reward code prints goes
  to a file, and only bounded copies reach the worker's log) that forks a fresh, confined process
  for every call: memory, CPU time and file size limited, its own session and temporary
  directory, files and network confined with Landlock where the kernel offers it, metadata,
  sockets, namespaces and signals with a seccomp filter, no privileges, every process it leaves
  behind killed (``reward.sandbox``, ``stabledrl.common.sandbox.confine``). Between the worker and
  the sandbox sits its supervisor (``stabledrl.common.sandbox.supervisor``), a process no reward
  code runs in: it gives the sandbox a private tmpfs of ``sandbox.disk_mb`` as its directory, and
  kills every process the reward started, at import, in a call or at exit, when the sandbox ends.
  A call past ``timeout_s`` or a limit is killed
  and counted; a crash (``os._exit``, a segfault) too; the sandbox lives on. A batched user reward
  (``score_batch``) scores a batch in one call: its time and CPU limits are ``timeout_s`` and
  ``sandbox.cpu_seconds`` times its completions (the memory limit is the call's), its answer holds
  each completion's outcome, and a call that fails as a whole fails each of its completions. The sandbox's
  directory is ``stabledrl-reward-<worker pid>-*`` in the temporary directory; those of dead
  processes are removed when a sandbox starts. Cost: a pipe round trip and two forks per call (a
  few milliseconds).

A result must be finite and within ±``reward.max_abs``, else the call fails (``non_finite``,
``out_of_range``). ``check_reward`` runs before any actor starts: the reward file's rules and a
dry import in the sandbox.
- ``inline``: rewards run in the calling thread. Exceptions and bad values are caught, but a
  reward that hangs cannot be interrupted, so no timeout and no limit is enforced: for the
  built-in checkers, which are ours.

``check_failure_rate`` stops a job whose reward fails too often (``reward.max_failed_fraction``)
instead of training it on zeros.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import deque
from dataclasses import dataclass, fields
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Optional, Sequence

from stabledrl.common.config.base import MAX_SECONDS, ConfigError
from stabledrl.common.tasks.base import NonNumericReward, RewardResult, Row, Task
from stabledrl.common.tasks.reward_functions import RewardFunctions
from stabledrl.common.sandbox.confine import NOBODY
from stabledrl.common.tasks.build import build_task, check_custom_reward

log = logging.getLogger(__name__)
START_OVERHEAD_S = 60.0  # beyond reward.import_timeout_s: Python and the project's imports, on a loaded machine
CALL_GRACE_S = 10.0  # beyond timeout_s: the sandbox's own fork, kill and clean-up of a call
CLOSE_TIMEOUT_S = 5.0
MAX_ANSWER_BYTES = 1 << 20
FAILURE_KINDS = ("exception", "non_number", "non_finite", "out_of_range", "timeout", "crash", "limit")
WORKDIR_PREFIX = "stabledrl-reward-"
_reported: set[str] = set()  # what this process already logged about the sandbox
_PROJECT_ROOT = str(Path(__file__).resolve().parents[2])
SUPERVISOR = Path(__file__).resolve().with_name("supervisor.py")  # run as a script: python -I, no imports of ours


@dataclass
class RewardStats:
    """Counters of reward calls by outcome (add them up across workers with ``merge``)."""

    calls: int = 0
    ok: int = 0
    exception: int = 0
    non_number: int = 0
    non_finite: int = 0
    out_of_range: int = 0  # finite, but beyond reward.max_abs
    timeout: int = 0
    crash: int = 0
    limit: int = 0  # past the sandbox's memory or CPU limit
    zeroed: int = 0
    dropped: int = 0

    @property
    def failed(self) -> int:
        return sum(getattr(self, kind) for kind in FAILURE_KINDS)

    def merge(self, other: "RewardStats") -> "RewardStats":
        return RewardStats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def as_metrics(self, prefix: str = "reward/") -> dict[str, float]:
        out = {f"{prefix}{f.name}": float(getattr(self, f.name)) for f in fields(self)}
        out[f"{prefix}failed"] = float(self.failed)
        return out


class RewardFailureRate(RuntimeError):
    """The job's reward failed on more than ``reward.max_failed_fraction`` of its calls."""


def check_failure_rate(counts: dict[str, float], cfg: Any) -> None:
    """Raise RewardFailureRate once ``reward_calls/failed`` exceeds ``reward.max_failed_fraction``
    of ``reward_calls/calls`` (after ``reward.failure_check_after`` calls, or sooner: once the
    failures alone exceed that fraction of failure_check_after, the verdict at that count is
    certain, which matters for a reward whose every call times out); ``cfg`` is the task section.
    The message names the reward and the count of each kind of failure."""
    calls, failed = counts.get("reward_calls/calls", 0.0), counts.get("reward_calls/failed", 0.0)
    reward = cfg.reward
    certain = reward.max_failed_fraction < 1 and failed > reward.max_failed_fraction * reward.failure_check_after
    if (calls < reward.failure_check_after and not certain) or failed <= reward.max_failed_fraction * calls:
        return
    kinds = ", ".join(
        f"{int(counts[f'reward_calls/{k}'])} {k}" for k in FAILURE_KINDS if counts.get(f"reward_calls/{k}")
    )
    name = reward.describe_custom() if reward.custom else f"the {cfg.name} reward"
    raise RewardFailureRate(
        f"{name} failed on {int(failed)} of {int(calls)} calls ({kinds}), more than task.reward.max_failed_fraction = "
        f"{reward.max_failed_fraction:g}: the job stops instead of training on "
        f"{'zeros' if reward.on_failure == 'zero' else 'dropped samples'}. The rollout workers' log shows the first "
        "failure of each kind; fix the reward, or raise max_failed_fraction")


class RewardOutOfRange(ValueError):
    """A finite reward (or part) beyond ``reward.max_abs``."""


def checked(value: Any, max_abs: float = math.inf) -> RewardResult:
    """``value`` as a RewardResult with finite numbers within ±``max_abs``, else NonNumericReward /
    FloatingPointError / RewardOutOfRange."""
    if not isinstance(value, RewardResult):
        raise NonNumericReward(f"reward returned {type(value).__name__}, not a RewardResult")
    numbers = [value.total, *value.parts.values()]
    if not all(isinstance(v, (int, float)) for v in numbers):
        raise NonNumericReward("reward parts must be numbers")
    if not all(math.isfinite(v) for v in numbers):
        raise FloatingPointError(f"reward is not finite: total={value.total}, parts={value.parts}")
    if not all(abs(v) <= max_abs for v in numbers):
        raise RewardOutOfRange(f"reward is beyond ±task.reward.max_abs = {max_abs:g}: total={value.total:g}, "
                               f"parts={value.parts} (such a value would overflow the loss; scale the reward, or "
                               "raise max_abs)")
    return RewardResult(total=float(value.total), parts={k: float(v) for k, v in value.parts.items()})


def outcome_of(e: BaseException) -> str:
    if isinstance(e, NonNumericReward):
        return "non_number"
    if isinstance(e, FloatingPointError):
        return "non_finite"
    if isinstance(e, RewardOutOfRange):
        return "out_of_range"
    return "exception"


class _Child:
    """One sandbox process (``sandbox_child``); ``call`` returns (outcome, payload) and never raises.

    It runs in its own session and private temporary directory (also its working directory), with
    an environment stripped to what Python needs (plus ``sandbox.pass_env``); its answers are JSON,
    bounded in size and checked, never unpickled."""

    def __init__(self, cfg: Any) -> None:
        remove_stale_workdirs()
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-"))
        paths = _reward_paths(cfg)
        settings = {"task": cfg.model_dump(mode="json"), "workdir": str(self.workdir), **paths}
        command = [sys.executable, "-I", str(SUPERVISOR), str(self.workdir), str(cfg.reward.sandbox.disk_mb), "--",
                   sys.executable, "-m", "stabledrl.common.sandbox.child"]
        self.proc = subprocess.Popen(  # the supervisor, which starts the sandbox and outlives all it started
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=self.workdir, start_new_session=True,
            env=_child_env(cfg.reward.sandbox.pass_env, paths.get("read_paths", [])),
        )  # fmt: skip
        self.to_child = Connection(os.dup(self.proc.stdin.fileno()), readable=False)
        self.from_child = Connection(os.dup(self.proc.stdout.fileno()), writable=False)
        self.to_child.send_bytes(json.dumps(settings).encode())
        limit = cfg.reward.import_timeout_s + START_OVERHEAD_S
        outcome, payload = self._receive(limit, ("ready", "error"))
        if outcome != "ready" or not isinstance(payload, dict):
            self.close()
            reward = cfg.reward.describe_custom() if cfg.reward.custom else f"the {cfg.name} reward"
            if outcome == "timeout":
                payload = (
                    f"importing {reward} gave no answer in {limit:g} s (task.reward.import_timeout_s = "
                    f"{cfg.reward.import_timeout_s:g} plus {START_OVERHEAD_S:g} s to start Python): module-level "
                    "code must not hang"
                )
            field = "task.reward.custom" if cfg.reward.custom else "task.reward"
            raise ConfigError(f"{field}: the reward sandbox failed to start ({reward}): {payload}")
        self.confinement: dict[str, Any] = payload

    def call(self, completion: str | list[str], row: Row | list[Row], timeout_s: float) -> tuple[str, Any]:
        """One call: a completion, or a batch (lists; ``timeout_s`` then covers the whole batch)."""
        try:
            self.to_child.send((completion, row))
        except (OSError, EOFError) as e:
            return "crash", repr(e)
        return self._receive(timeout_s + CALL_GRACE_S, ("ok", *FAILURE_KINDS))  # the sandbox enforces timeout_s

    def _receive(self, timeout_s: float, expected: Sequence[str]) -> tuple[str, Any]:
        try:
            if not self.from_child.poll(timeout_s):
                self.close()
                return "timeout", f"no answer in {timeout_s}s"
            outcome, payload = json.loads(self.from_child.recv_bytes(MAX_ANSWER_BYTES))
        except (OSError, EOFError):
            self.close()
            return "crash", f"the reward sandbox died (exit code {self.proc.poll()})"
        except (ValueError, TypeError) as e:
            self.close()
            return "crash", f"malformed answer from the reward sandbox ({e})"
        if outcome not in expected:
            self.close()
            return "crash", f"malformed answer from the reward sandbox (outcome {str(outcome)[:40]!r})"
        return outcome, payload

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """Closing stdin ends the sandbox (it removes its directory), and the supervisor, once it
        has killed every process the reward left, exits. A sandbox that does not end within a few
        seconds is ended by SIGTERM to the supervisor (which then kills it and reaps the rest as
        well); SIGKILL only if the supervisor does not answer either."""
        for end in (self.to_child, self.proc.stdin):
            try:
                end.close()
            except OSError:
                pass
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None:
                try:
                    os.kill(self.proc.pid, sig)
                except ProcessLookupError:
                    pass
            try:
                self.proc.wait(timeout=CLOSE_TIMEOUT_S if sig != signal.SIGKILL else None)
                break
            except subprocess.TimeoutExpired:
                continue
        for end in (self.from_child, self.proc.stdout):
            try:
                end.close()
            except OSError:
                pass
        shutil.rmtree(self.workdir, ignore_errors=True)


def check_reward(cfg: Any) -> None:
    """Before any actor starts (``cfg``: the task section): the custom reward passes the file
    rules (``build.check_custom_reward``) and, where it will run in the sandbox, imports there
    within ``reward.import_timeout_s`` (a dry import: the sandbox starts, imports it, and ends).
    ConfigError naming the reward otherwise."""
    check_custom_reward(cfg.reward)
    if cfg.reward.custom and cfg.reward.resolved_isolation == "process":
        RewardScorer(cfg).close()


def remove_stale_workdirs(root: Optional[Path] = None) -> list[Path]:
    """Remove the sandbox directories (``stabledrl-reward-<pid>-*`` in the temporary directory) of
    processes of this user (as root: also those handed to nobody) that no longer exist (a job killed
    with SIGKILL leaves them); returns what was removed."""
    removed = []
    for path in Path(root or tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*-*"):
        pid = path.name[len(WORKDIR_PREFIX):].partition("-")[0]
        try:
            owners = (os.geteuid(), NOBODY) if os.geteuid() == 0 else (os.geteuid(),)  # as root: maybe handed to nobody
            if not pid.isdigit() or path.lstat().st_uid not in owners or not path.is_dir() or path.is_symlink():
                continue
            os.kill(int(pid), 0)
            continue  # its process lives
        except ProcessLookupError:
            pass
        except (OSError, ValueError):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _report(confinement: dict[str, Any]) -> None:
    """Say once per process how the sandbox confines rewards: a warning where it could not (the job's
    log says it once, from the rollout workers' start: coordinator/runtime/actors.py)."""
    line = "reward sandbox: " + "; ".join(confinement.get("notes", []))
    if line not in _reported:
        _reported.add(line)
        (log.warning if confinement.get("degraded") else log.debug)(line)


def _child_env(pass_env: Sequence[str], package_roots: Sequence[str]) -> dict[str, str]:
    """What the sandbox inherits: the project (and a custom reward's package) on PYTHONPATH, one
    thread per library, no bytecode writes, the locale; tokens and credentials of the worker's
    environment stay out."""
    keep = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "PYTHONHASHSEED", "PYTHONHOME", "LD_LIBRARY_PATH",
            *pass_env)
    env = {k: os.environ[k] for k in keep if k in os.environ}
    path = os.pathsep.join(p for p in (_PROJECT_ROOT, *package_roots, os.environ.get("PYTHONPATH")) if p)
    env.update(PYTHONPATH=path, PYTHONDONTWRITEBYTECODE="1", PYTHONSAFEPATH="1", OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


def _reward_paths(cfg: Any) -> dict[str, Any]:
    """The custom reward files (readable in the sandbox) and the sys.path entries of its packages."""
    files, roots = [], []
    for spec in cfg.reward.custom_specs:
        target = spec.rpartition(":")[0]
        if target.endswith(".py") or "/" in target:
            files.append(str(Path(target).expanduser().resolve()))
            continue
        try:
            found = importlib.util.find_spec(target.partition(".")[0])  # a top-level name: nothing is imported
        except (ImportError, ValueError):
            found = None
        if found is None or not found.origin or found.origin in ("built-in", "frozen"):
            continue
        origin = Path(found.origin).resolve()
        roots.append(str(origin.parent.parent if origin.name == "__init__.py" else origin.parent))
    paths: dict[str, Any] = {}
    if files:
        paths["reward_files"] = list(dict.fromkeys(files))
    if roots:
        paths["read_paths"] = list(dict.fromkeys(roots))
    return paths


def _checked_outcome(result: RewardResult, max_abs: float) -> tuple[str, Any]:
    try:
        return "ok", checked(result, max_abs)
    except Exception as e:  # noqa: BLE001 - a bad value is that completion's failure
        return outcome_of(e), repr(e)


class RewardScorer:
    """Scores completions for one task config; see the module docstring for the failure policy."""

    def __init__(self, cfg: Any, task: Optional[Task] = None) -> None:
        """``task``: an already built task to score inline (default: built from ``cfg``)."""
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
            if isinstance(self._task.correctness, RewardFunctions):
                self._task.correctness.load()  # fail fast on a bad spec or signature
        else:
            self._child = _Child(cfg)
            _report(self._child.confinement)

    @property
    def batched(self) -> bool:
        """Whether a batch of completions is scored in one call (a batched user function), or one
        call per completion."""
        if self._task is not None:
            return bool(getattr(self._task.correctness, "batched", False))
        return self._child is not None and bool(self._child.confinement.get("batched"))

    def score(self, completion: str, row: Row) -> Optional[RewardResult]:
        """One completion's reward (None: dropped, per ``reward.on_failure``)."""
        if self.batched:
            return self.score_batch([completion], [row])[0]
        self.stats.calls += 1
        return self._settle(*self._call(completion, row), row)

    def score_batch(self, completions: Sequence[str], rows: Sequence[Row]) -> list[Optional[RewardResult]]:
        """The rewards of ``completions`` (``rows[i]`` the prompt of completion i): one call per
        completion, or, with a batched user function, one call for them all; every completion is
        counted as a call of its own, and its failure is its own unless the batched call failed."""
        if not self.batched:
            return [self.score(c, r) for c, r in zip(completions, rows)]
        self.stats.calls += len(completions)
        return [self._settle(outcome, payload, row) for (outcome, payload), row in
                zip(self._call_batch(list(completions), list(rows)), rows)]

    def _settle(self, outcome: str, payload: Any, row: Row) -> Optional[RewardResult]:
        """Count one completion's outcome; a failure becomes 0 or a dropped sample."""
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

    @property
    def confinement(self) -> str:
        """What the sandbox confines, in words ('inline: not confined' without one)."""
        if self._child is None:
            return "inline: not confined (no timeout, no limits)"
        return "; ".join(self._child.confinement.get("notes", []))

    def _call_batch(self, completions: list[str], rows: list[Row]) -> list[tuple[str, Any]]:
        """(outcome, payload) of each completion of one batched call."""
        max_abs = self.cfg.reward.max_abs
        if self._task is not None:
            return [(outcome_of(r), repr(r)) if isinstance(r, BaseException) else _checked_outcome(r, max_abs)
                    for r in self._task.reward_batch(completions, rows)]
        if self._child is None or not self._child.alive:
            try:
                self._child = _Child(self.cfg)
            except ConfigError as e:
                return [("crash", str(e))] * len(completions)
        # the sandbox allows a batch that many times, up to the longest wait a timer holds
        timeout_s = min(self.cfg.reward.timeout_s * len(completions), MAX_SECONDS)
        outcome, payload = self._child.call(completions, rows, timeout_s)
        if outcome != "ok":  # the call failed as a whole: every completion of it did
            return [(outcome, payload)] * len(completions)
        if not isinstance(payload, list) or len(payload) != len(completions) or not all(
                isinstance(p, list) and len(p) == 2 and p[0] in ("ok", *FAILURE_KINDS) for p in payload):
            return [("crash", "malformed answer from the reward sandbox (not one outcome per completion)")] * len(rows)
        out = []
        for kind, value in payload:
            if kind != "ok":
                out.append((kind, value))
                continue
            try:
                out.append(_checked_outcome(RewardResult(total=value[0], parts=value[1]), max_abs))
            except Exception as e:  # noqa: BLE001 - an answer of the wrong shape
                out.append(("crash", f"malformed answer from the reward sandbox ({type(e).__name__})"))
        return out

    def _call(self, completion: str, row: Row) -> tuple[str, Any]:
        if self._task is not None:
            try:
                return "ok", checked(self._task.reward(completion, row), self.cfg.reward.max_abs)
            except (Exception, SystemExit) as e:  # user code calling sys.exit must not end the worker
                return outcome_of(e), repr(e)
        if self._child is None or not self._child.alive:
            try:
                self._child = _Child(self.cfg)
            except ConfigError as e:
                return "crash", str(e)
        outcome, payload = self._child.call(completion, row, self.cfg.reward.timeout_s)
        if outcome != "ok":
            return outcome, payload
        try:
            return "ok", checked(RewardResult(total=payload[0], parts=payload[1]), self.cfg.reward.max_abs)
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
