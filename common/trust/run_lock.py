"""One job at a time in a run directory: ``run.output_dir/.lock``, held for the job's life.

Two jobs writing one output_dir interleave their metrics, overwrite each other's config.yaml and
checkpoints, and one's ``--overwrite`` deletes the other's run under it. ``lock_output_dir`` takes
an exclusive ``flock`` on ``.lock`` before anything in the directory is checked or removed, and
keeps it until this process ends (or ``release``): the kernel drops it however the process ends,
SIGKILL included, so a crashed job never leaves a stale lock. The file records who holds it (pid,
host, start time, command), for the refusal the second job prints. Where the filesystem offers no
``flock`` (some parallel filesystems mounted without it) the job says so once and runs unlocked.
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path

from stabledrl.common.config.base import ConfigError

LOCK_FILE = ".lock"
log = logging.getLogger(__name__)
_held: dict[Path, int] = {}  # directory -> the descriptor holding its lock, for this process's life


def lock_output_dir(directory: Path) -> None:
    """Hold ``directory``'s lock (created with the directory when absent); ConfigError naming the
    job that holds it otherwise. Taking it again in the same process is a no-op."""
    directory = Path(directory)
    real = Path(os.path.realpath(directory))
    if real in _held:
        return
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            holder = _holder(fd)
            os.close(fd)
            raise ConfigError(f"run.output_dir {directory} is in use by another job ({holder}): wait for it to end, "
                              "or choose another run.output_dir") from None
        os.close(fd)
        log.warning(f"stabledrl: run.output_dir {directory}: no lock on this filesystem ({e.strerror}); make sure "
                    "no other job writes there")
        return
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(),
                              "command": " ".join(sys.argv)[:500]}).encode() + b"\n", 0)
    _held[real] = fd


def release(directory: Path) -> None:
    """Give ``directory``'s lock back before this process ends (the Python API's train does)."""
    fd = _held.pop(Path(os.path.realpath(directory)), None)
    if fd is not None:
        os.close(fd)


def _holder(fd: int) -> str:
    """Who holds the lock, as its file records it."""
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info["since"])))
        return f"pid {info['pid']} on {info['host']} since {since}: {info.get('command', '')}".rstrip(": ")
    except (ValueError, KeyError, TypeError, OSError):
        return "its lock file names no holder"
