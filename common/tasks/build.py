"""Build a Task from its config section, with the user's reward functions plugged in.

User rewards replace the task's checker (the format part still applies with its weight)::

    task:
      reward: {custom: "rewards/length_penalty.py:score"}      # a file, relative to the working directory
      reward: {custom: "my_package.rewards:score"}             # or an importable module
      reward: {custom: ["rewards.py:accuracy", "rewards.py:brevity"], custom_weights: [1.0, 0.2]}

    def score(completion: str, row: stabledrl.common.tasks.Row) -> float:
        '''completion: decoded text up to the first EOS; row.answer / row.meta: the reference;
        row.record: the whole data record (every column, nested fields included: a verl file's
        row.record["extra_info"], row.record["data_source"]); empty for generated tasks.'''

    def accuracy(prompts, completions, answer, **kwargs) -> list[float]:   # TRL's batched form
        ...

Both forms, their arguments and how several functions combine: ``reward_functions.py`` and
docs/rewards.md. Any real number is accepted (bool and numpy scalars included). The functions are
imported lazily, on their first call, so a worker that only renders prompts never runs user code;
the reward sandbox (``stabledrl.common.sandbox.scorer``) imports them at start-up to fail fast, and
isolates their calls. There each call runs in a fresh fork of the process that imported the files
once: import what a function needs at the top of its file, not inside the function (that import
would be paid again on every call).

A reward file is code the job runs, so it must be one nobody else could have changed
(``check_reward_file``, at config load and again where it is imported):

- a regular file owned by the user running the job (or root), writable by neither group nor
  others;
- in a directory owned by that user (or root), writable by neither group nor others (so not
  directly in /tmp, sticky or not);
- every directory above it, up to /, owned by that user or root and writable by neither group
  nor others unless sticky (/tmp may be an ancestor: its sticky bit keeps others from renaming
  what is ours; a 777 grandparent is refused);
- no symlink on the path as written lies in a directory that group or others may write;
- with ``reward.allowed_roots`` set, its real path lies under one of them.

A ``module:function`` reward naming a standard-library module (``os:system``) is refused by the
config unless ``reward.allowed_modules`` lists it. The file's absolute path and SHA-256 are logged.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import logging
import os
import stat
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from stabledrl.common.config.base import ConfigError
from stabledrl.common.tasks.base import TASKS, Task, stable_hash
from stabledrl.common.tasks.reward_functions import RewardFunctions

CustomFn = Callable[..., Any]
log = logging.getLogger(__name__)


def load_reward_function(spec: str, allowed_roots: Sequence[str] = ()) -> CustomFn:
    """Import ``'path/to/file.py:name'`` or ``'package.module:name'`` and return the callable."""
    target, _, attr = spec.rpartition(":")
    try:
        if target.endswith(".py") or "/" in target:
            path = check_reward_file(Path(target), allowed_roots)
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
        raise ConfigError(f"task.reward.custom: {spec!r} failed to import: {type(e).__name__}: {e}") from e
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"task.reward.custom: {spec!r}: {attr!r} is not a callable in {target}")
    return fn


def check_reward_file(given: Path, allowed_roots: Sequence[str] = ()) -> Path:
    """Refuse a reward file that someone other than this user (or root) could have written or
    replaced (the rules are in the module docstring); returns its real path."""
    import hashlib

    me = os.geteuid()
    where = f"task.reward.custom: {given}"
    given = Path(os.path.abspath(os.path.expanduser(given)))
    path = given.resolve()
    if not path.is_file():
        raise ConfigError(f"{where} does not exist or is not a file (a relative path is relative to the working "
                          f"directory the config is loaded in, {Path.cwd()})")
    for link in [p for p in (given, *given.parents) if p.is_symlink()]:
        parent = link.parent.stat()
        if _writable_by_others(parent) or parent.st_uid not in (me, 0):
            raise ConfigError(f"{where}: its path goes through the symlink {link}, in a directory others may change "
                              f"({link.parent}, mode {stat.filemode(parent.st_mode)}, owner uid {parent.st_uid}): "
                              "refused; name the real file")
    info = path.stat()
    if info.st_uid not in (me, 0):
        raise ConfigError(f"{where} is owned by uid {info.st_uid}, not by this user ({me}) or root: refused "
                          "(a reward file is code the job runs)")
    if info.st_mode & (stat.S_IWOTH | stat.S_IWGRP):
        who = "every user" if info.st_mode & stat.S_IWOTH else "its group"
        raise ConfigError(f"{where} is writable by {who} (mode {stat.filemode(info.st_mode)}): refused; "
                          f"chmod go-w {path}")
    ray_own = _ray_unpacked(path)
    if ray_own:
        log.warning("custom reward: %s is in the files Ray unpacked for the job's working_dir, under directories "
                    "Ray makes writable by every user; on a node shared with other users, set RAY_TMPDIR to a "
                    "private directory", path)
    for directory in path.parents:
        d = directory.stat()
        sticky_ancestor = d.st_mode & stat.S_ISVTX and directory != path.parent
        if directory in ray_own and d.st_uid in (me, 0):
            continue
        if d.st_uid not in (me, 0) or (_writable_by_others(d) and not sticky_ancestor):
            whose = f"owned by uid {d.st_uid}" if d.st_uid not in (me, 0) else "writable by others"
            raise ConfigError(f"{where}: the directory {directory} on its path is {whose} (mode "
                              f"{stat.filemode(d.st_mode)}), so someone else could replace the file: refused; keep "
                              "reward files in a directory only you can write (not directly in /tmp)")
    roots = [Path(os.path.expanduser(r)).resolve() for r in allowed_roots]
    if roots and not any(path.is_relative_to(r) for r in roots):
        raise ConfigError(f"{where} ({path}) is not under task.reward.allowed_roots ({', '.join(map(str, roots))}): "
                          "refused; move it there or add its directory")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    log.debug("custom reward: %s (sha256 %s, owner uid %d)", path, digest, info.st_uid)
    return path


def _ray_unpacked(path: Path) -> set[Path]:
    """Ray's own directories above a file of a job's working_dir / py_modules (`ray job submit
    --working-dir`): RAY_TMPDIR, its session_*, runtime_resources and {working_dir,py_modules}_files,
    which Ray makes writable by every user. Accepted when this user or root owns them; the package directories
    below them and the file itself are still checked."""
    for resources in path.parents:
        if resources.name == "runtime_resources" and resources.parent.name.startswith("session_"):
            files = [p for p in path.parents if p.parent == resources and p.name in ("working_dir_files",
                                                                                    "py_modules_files")]
            return {resources.parent.parent, resources.parent, resources, *files} if files else set()
    return set()


def _writable_by_others(info: os.stat_result) -> bool:
    return bool(info.st_mode & (stat.S_IWOTH | stat.S_IWGRP))


def check_custom_reward(reward: Any) -> None:
    """The config-time check of ``task.reward`` (``reward`` is that section): each reward file must
    exist and pass ``check_reward_file``; each module must be importable as a spec (nothing is
    imported here). ConfigError naming the field otherwise."""
    for spec in reward.custom_specs:
        target = spec.rpartition(":")[0]
        if target.endswith(".py") or "/" in target:
            check_reward_file(Path(target), reward.allowed_roots)
            continue
        try:
            found = importlib.util.find_spec(target.partition(".")[0])
        except (ImportError, ValueError):
            found = None
        if found is None:
            raise ConfigError(f"task.reward.custom: no module {target.partition('.')[0]!r} can be imported here "
                              f"(sys.path: the project and the environment's packages)")


def custom_reward(reward: Any) -> RewardFunctions:
    """The functions ``task.reward.custom`` names (imported on first use)."""
    return RewardFunctions(reward.custom_specs, reward.custom_weights, reward.allowed_roots)


def build_task(cfg: Any) -> Task:
    """The Task named by ``cfg.name``, its checker replaced by ``cfg.reward.custom`` if set."""
    task = TASKS.get(cfg.name)(cfg)
    if cfg.reward.custom:
        task = dataclasses.replace(task, correctness=custom_reward(cfg.reward), correctness_name="custom")
    return task
