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
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from common.config.base import ConfigError
from common.tasks.base import TASKS, Row, Task, stable_hash

CustomFn = Callable[[str, Row], Any]


def load_reward_function(spec: str) -> CustomFn:
    """Import ``'path/to/file.py:name'`` or ``'package.module:name'`` and return the callable."""
    target, _, attr = spec.rpartition(":")
    try:
        if target.endswith(".py") or "/" in target:
            path = Path(target).expanduser().resolve()
            if not path.is_file():
                raise ConfigError(f"custom reward file {path} does not exist (spec {spec!r}, cwd {Path.cwd()})")
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
