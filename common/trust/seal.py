"""A run directory is the user's data: what in it decides which code runs is sealed by the job that
wrote it, and checked before a resume or an evaluation uses it.

Hashes kept beside the files they cover prove nothing against someone who can write both: they
rewrite the hash with the file. The seal is therefore an HMAC-SHA256 under a key that never enters
a run directory: ``$STABLEDRL_KEY_FILE``, else ``~/.config/stabledrl/run.key`` (32 random bytes,
mode 0600, created by the first job that writes a run). Sealed:

- ``RUN/config.yaml``: its last line is ``# stabledrl-seal: <hmac of the bytes before it>``
  (a YAML comment: every reader ignores it);
- every checkpoint's ``coordinator.json`` (the manifest: file sizes, the resolved config, the
  step): its ``seal`` field covers the rest of the manifest;
- a warm start's ``warmstart.json`` (the SHA-256 of every file of the cached model): a manifest
  whose hashes were rewritten after a weight swap no longer matches its seal;
- an export's ``stabledrl_config.yaml`` (the job's config, carried with its weights) like config.yaml.

``check_run_config`` refuses a run's config that is not as the run wrote it (no seal, or one
that does not match: edited since, or written under another user's key) when it names code to
run (``task.reward.custom``), unless the user passes ``--trust-run``. A run's config is one that
bears a seal line, wherever it lies, and any config in a directory the project wrote into
(``is_run_dir``: checkpoints, tags, ``latest``, metrics, an export). A config file names code to
run: use only your own, or a run's that verifies. ``check_confinement`` refuses a config
whose reward sandbox is weaker than the one the run started with (isolation, Landlock, network,
readable paths, environment, limits) unless the user passes ``--allow-weaker-sandbox``.
A run copied from another machine is sealed under that machine's key: it resumes and evaluates as
usual when its reward is a built-in one; a custom reward needs ``--trust-run`` once the user has
read it. (A shared home directory, or one ``STABLEDRL_KEY_FILE`` on shared storage, gives every
node of a cluster the same key.)
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path
from typing import Any, Optional

from stabledrl.common.config.base import load_yaml
from stabledrl.common.config.task import RewardConfig

SEAL_LINE = "# stabledrl-seal: "
KEY_BYTES = 32
KEY_ENV = "STABLEDRL_KEY_FILE"
EXPORT_CONFIG = "stabledrl_config.yaml"  # the job's sealed config, inside an exported model directory
# what a job writes into its output_dir: any one of them marks a directory as a run
RUN_MARKS = ("checkpoints", "metrics.jsonl", "metrics.before_resume.jsonl", "final_model", "final_adapter", "latest",
             EXPORT_CONFIG)


class RunTrustError(ValueError):
    """A run's file that cannot be used as it is; the message names it and the flag that overrides."""


def key_file() -> Path:
    return Path(os.environ.get(KEY_ENV) or Path.home() / ".config" / "stabledrl" / "run.key").expanduser()


def run_key(create: bool = False) -> Optional[bytes]:
    """This user's key (created with ``create`` when absent; None when absent otherwise).
    RunTrustError, naming the file, for a key that cannot serve: not a regular file, unreadable,
    or too short (a key that is not one must not read as 'this run was written elsewhere')."""
    path = key_file()
    what = f"{path} (the key that seals run directories{', $STABLEDRL_KEY_FILE' if os.environ.get(KEY_ENV) else ''})"
    if not os.path.lexists(path) and create:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(KEY_BYTES))
        except FileExistsError:  # another job created it first
            pass
        except OSError as e:
            raise RunTrustError(f"{what} cannot be created: {e.strerror or e}; point {KEY_ENV} at a file this "
                                "user can write") from None
    if not os.path.lexists(path):
        return None
    if not path.is_file():
        kind = "a directory" if path.is_dir() else "a dangling symlink" if path.is_symlink() else "not a regular file"
        raise RunTrustError(f"{what} is {kind}: point {KEY_ENV} at a key file, or remove {path} so that the next "
                            "run writes a new key")
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:  # whoever can read it can seal a run they tampered with
        raise RunTrustError(f"{what} is readable or writable by others (mode {mode:03o}): anyone who reads it can seal "
                            f"a run they changed. chmod 600 {path}")
    try:
        key = path.read_bytes()
    except OSError as e:
        raise RunTrustError(f"{what} cannot be read: {e.strerror or e}") from None
    if len(key) < 16:
        raise RunTrustError(f"{what} is {len(key)} bytes, not a key (at least 16); remove it so the next run writes a "
                            "new one (runs sealed with the old key then need --trust-run)")
    return key


def check_key(create: bool) -> None:
    """The key, checked before anything starts (``train``: created when absent): a key file that
    cannot serve fails here, in one line, rather than once the job runs."""
    run_key(create=create)


def mac(data: bytes, key: Optional[bytes] = None) -> str:
    key = key if key is not None else run_key(create=True)
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def _matches(data: bytes, seal: Any) -> bool:
    key = run_key()
    return key is not None and isinstance(seal, str) and hmac.compare_digest(mac(data, key), seal)


# ---- config.yaml ---------------------------------------------------------------------------------
def sealed_text(text: str) -> str:
    """``text`` with its seal as the last line."""
    text = text if text.endswith("\n") else text + "\n"
    return f"{text}{SEAL_LINE}{mac(text.encode())}\n"


def text_is_sealed(text: str) -> bool:
    """Whether ``text`` ends with a seal line that matches the bytes before it under this user's key."""
    body, _, last = text.rstrip("\n").rpartition("\n")
    if not last.startswith(SEAL_LINE):
        return False
    return _matches((body + "\n").encode(), last.removeprefix(SEAL_LINE).strip())


# ---- JSON manifests (coordinator.json, warmstart.json) -----------------------------------------------
def _canonical(data: dict[str, Any]) -> bytes:
    return json.dumps({k: v for k, v in data.items() if k != "seal"}, sort_keys=True, separators=(",", ":")).encode()


def seal_json(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with a ``seal`` field over everything else in it."""
    return {**data, "seal": mac(_canonical(data))}


def json_is_sealed(data: dict[str, Any]) -> bool:
    return isinstance(data, dict) and _matches(_canonical(data), data.get("seal"))


# ---- the checks ------------------------------------------------------------------------------------
def is_run_dir(directory: Path) -> bool:
    """A directory a job wrote (a config.yaml there is the run's own, not one the user wrote):
    anything the project writes marks it, its checkpoints (``checkpoints/``, or tags moved to its
    root: ``latest``, a directory holding ``coordinator.json``), metrics, an export."""
    directory = Path(directory)
    if any(os.path.lexists(directory / name) for name in RUN_MARKS):
        return True
    try:
        return (directory / "coordinator.json").exists() or any(
            (child / "coordinator.json").exists() for child in directory.iterdir() if child.is_dir())
    except OSError:
        return False


def names_code(config: dict[str, Any]) -> Optional[str]:
    """'task.reward.custom = ...' when the config names code of its own to run, else None."""
    custom = ((config.get("task") or {}).get("reward") or {}).get("custom")
    return f"task.reward.custom = {custom!r}" if custom else None


def check_run_config(path: Path, *, trust_run: bool = False, run_dir: Optional[Path] = None) -> None:
    """Refuse the config ``path`` when it names code to run and is a run's config that is not as
    the run wrote it, unless ``trust_run``. A run's config is one that bears a seal line (wherever
    it lies: a config handed over with a model, or moved out of its run), one inside a run
    directory (``run_dir``, or a directory ``is_run_dir`` recognises beside it). Any other config
    is the user's own and is not checked: a config names code, so run only your own or a verified
    one."""
    path = Path(path)
    text = path.read_text(encoding="utf-8", errors="replace")
    code = names_code(load_yaml(path))
    if code is None or trust_run:
        return
    if SEAL_LINE not in text and run_dir is None and not is_run_dir(path.parent):
        return
    if text_is_sealed(text):
        return
    why = ("has no seal (it was written by hand, by an older version, or the seal line was removed)"
           if SEAL_LINE not in text else f"does not match its seal under {key_file()} (edited after the run wrote it, "
           "or written by another user or machine)")
    raise RunTrustError(
        f"{path} is a run's config that {why}, and it names code to run: {code}. Refused: nothing in a run "
        f"directory runs unless the run wrote it. Restore the config the run wrote (each checkpoint's coordinator.json "
        f"holds it), or, if you have read that code and trust it, pass --trust-run")


# what the reward sandbox's confinement depends on, and which way is weaker
def confinement(config: dict[str, Any]) -> dict[str, Any]:
    reward = dict((config.get("task") or {}).get("reward") or {})
    try:  # the defaults of the fields a config leaves out
        reward = RewardConfig.model_validate(reward).model_dump(mode="json")
    except Exception:  # noqa: BLE001 - a config of another version: compare what it says
        pass
    sandbox = reward.get("sandbox") or {}
    isolation = reward.get("isolation", "auto")
    if isolation == "auto":
        isolation = "process" if reward.get("custom") else "inline"
    return {"isolation": isolation, **{k: sandbox.get(k) for k in (
        "landlock", "allow_network", "read_paths", "pass_env", "memory_mb", "cpu_seconds", "file_size_mb",
        "disk_mb")},
        "timeout_s": reward.get("timeout_s")}


def weakened(started: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """The confinement fields of ``now`` that are weaker than in ``started`` (both whole configs;
    ``started`` {}: the default sandbox of the reward ``now`` names)."""
    if not started:
        started = {"task": {"reward": {"custom": ((now.get("task") or {}).get("reward") or {}).get("custom")}}}
    a, b = confinement(started), confinement(now)
    out = []
    if a["isolation"] == "process" and b["isolation"] != "process":
        out.append(f"task.reward.isolation: {a['isolation']} -> {b['isolation']}")
    if a["landlock"] is not False and b["landlock"] is False:
        out.append("task.reward.sandbox.landlock: true -> false")
    if not a["allow_network"] and b["allow_network"]:
        out.append("task.reward.sandbox.allow_network: false -> true")
    for key in ("read_paths", "pass_env"):
        added = sorted(set(b[key] or []) - set(a[key] or []))
        if added:
            out.append(f"task.reward.sandbox.{key}: adds {added}")
    for key in ("memory_mb", "cpu_seconds", "file_size_mb", "disk_mb", "timeout_s"):
        if a[key] is not None and b[key] is not None and b[key] > a[key]:
            field = f"task.reward.{'' if key == 'timeout_s' else 'sandbox.'}{key}"
            out.append(f"{field}: {a[key]} -> {b[key]}")
    return out


def check_confinement(started: dict[str, Any], now: dict[str, Any], where: Path, *, allow_weaker: bool = False) -> None:
    """Refuse ``now`` (the config about to run) if its reward sandbox confines less than ``started``
    (the config the run at ``where`` started with), unless ``allow_weaker``."""
    if not names_code(now) or allow_weaker:
        return
    weaker = weakened(started, now)
    if weaker:
        raise RunTrustError(
            f"this config confines the reward less than the run {where} started with ({'; '.join(weaker)}); "
            "refused: restore those fields, or pass --allow-weaker-sandbox if you mean it"
        )
