"""Build a Task from its config section, with an optional user reward function plugged in.

A user reward replaces the task's checker (the format part still applies with its weight)::

    task:
      reward: {custom: "rewards/length_penalty.py:score"}      # a file, relative to the cwd
      reward: {custom: "my_package.rewards:score"}             # or an importable module

    def score(completion: str, row: common.tasks.Row) -> float:
        '''completion: decoded text up to the first EOS; row.answer / row.meta: the reference;
        row.record: the whole data record (every column, nested fields included: a verl file's
        row.record["extra_info"], row.record["data_source"]); empty for generated tasks.'''

Any real number is accepted (bool and numpy scalars included). The function is imported lazily,
on its first call, so a worker that only renders prompts never runs user code; the reward
sandbox (``common.tasks.sandbox``) imports it at start-up to fail fast, and isolates its calls.
There each call runs in a fresh fork of the process that imported the file once: import what the
function needs at the top of the file, not inside the function (that import would be paid again
on every call).

A reward file is code the job runs, so it must be one nobody else could have changed: a regular
file owned by the user running the job (or root), not writable by others, in a directory not
writable by others (unless sticky, like /tmp). Its absolute path and SHA-256 are logged.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from common.config.base import ConfigError
from common.tasks.base import TASKS, Row, Task, stable_hash

CustomFn = Callable[[str, Row], Any]
log = logging.getLogger(__name__)


def load_reward_function(spec: str) -> CustomFn:
    """Import ``'path/to/file.py:name'`` or ``'package.module:name'`` and return the callable."""
    target, _, attr = spec.rpartition(":")
    try:
        if target.endswith(".py") or "/" in target:
            path = Path(target).expanduser().resolve()
            if not path.is_file():
                raise ConfigError(f"custom reward file {path} does not exist (spec {spec!r}, cwd {Path.cwd()})")
            check_reward_file(path)
            name = f"stabledrl_custom_reward_{stable_hash(str(path)):x}"
            module_spec = importlib.util.spec_from_file_location(name, path)
            assert module_spec is not None and module_spec.loader is not None
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except ConfigError:
        raise
    except Exception as e:  # the user's module failed to import: report it as a config problem
        raise ConfigError(f"custom reward {spec!r} failed to import: {type(e).__name__}: {e}") from e
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"custom reward {spec!r}: {attr!r} is not a callable in {target}")
    return fn


def check_reward_file(path: Path) -> None:
    """Refuse a reward file that someone other than this user (or root) could have written."""
    import hashlib
    import stat

    me = os.geteuid()
    info = path.stat()
    where = f"task.reward.custom: {path}"
    if info.st_uid not in (me, 0):
        raise ConfigError(f"{where} is owned by uid {info.st_uid}, not by this user ({me}) or root: refused "
                          "(a reward file is code the job runs)")
    if info.st_mode & stat.S_IWOTH:
        raise ConfigError(f"{where} is writable by every user (mode {stat.filemode(info.st_mode)}): refused; "
                          f"chmod o-w {path}")
    parent = path.parent.stat()
    if parent.st_mode & stat.S_IWOTH and not parent.st_mode & stat.S_ISVTX:
        raise ConfigError(f"{where}: its directory {path.parent} is writable by every user (mode "
                          f"{stat.filemode(parent.st_mode)}), so anyone could replace the file: refused")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    log.info("custom reward: %s (sha256 %s, owner uid %d)", path, digest, info.st_uid)


class CustomReward:
    """The user function behind a spec, imported on first use."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self._fn: Optional[CustomFn] = None

    def load(self) -> CustomFn:
        if self._fn is None:
            self._fn = load_reward_function(self.spec)
        return self._fn

    def __call__(self, completion: str, row: Row) -> Any:
        return self.load()(completion, row)


def build_task(cfg: Any) -> Task:
    """The Task named by ``cfg.name``, its checker replaced by ``cfg.reward.custom`` if set."""
    task = TASKS.get(cfg.name)(cfg)
    if cfg.reward.custom:
        task = dataclasses.replace(task, correctness=CustomReward(cfg.reward.custom), correctness_name="custom")
    return task
