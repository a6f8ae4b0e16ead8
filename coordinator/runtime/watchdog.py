"""Nothing of a job outlives its driver: a watchdog process for the local Ray instance a job starts.

``watch_descendants()`` (called by the driver right after it started its own Ray) spawns
``python -m stabledrl.coordinator.runtime.watchdog DRIVER_PID`` in a session of its own, holding the read end of a
pipe whose write end only the driver has. While the driver lives, the watchdog notes every
process below it once a second (Ray's GCS, raylet, agents and dashboard, the actors' workers, their
reward sandboxes). When the pipe reports end-of-file (the driver ended: finished, interrupted,
crashed or SIGKILLed), it sends SIGTERM to every noted process still running (checked by start
time, so a reused pid is left alone), SIGKILL three seconds later, and exits.

Why: Ray's agents, whose raylet died with a SIGKILLed driver, try to report to a GCS that is gone
and stay up for minutes; nothing else would stop them.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

SNAPSHOT_EVERY_S = 1.0
TERM_GRACE_S = 3.0
_pipe: Optional[int] = None  # the driver's end, open for the life of the driver


def watch_descendants() -> None:
    """Start the watchdog for this process (once); it cleans up after this process ends."""
    global _pipe
    if _pipe is not None or not Path("/proc/self/stat").exists():
        return
    read, _pipe = os.pipe()  # both ends non-inheritable: no process the driver starts holds the write end
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    subprocess.Popen([sys.executable, "-m", "stabledrl.coordinator.runtime.watchdog", str(os.getpid())], stdin=read,
                     start_new_session=True, env=env, stdout=subprocess.DEVNULL)
    os.close(read)


def _stat(pid: int) -> Optional[tuple[int, int]]:
    """(parent pid, start time) of ``pid`` from /proc, or None if it is gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()
    return int(fields[1]), int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """{pid: start time} of every process below ``root``."""
    parents: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (found := _stat(int(entry))) is not None:
            parents.setdefault(found[0], []).append(int(entry))
            starts[int(entry)] = found[1]
    out, todo = {}, [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in out and child != os.getpid():
                out[child] = starts[child]
                todo.append(child)
    return out


def end_all(noted: dict[int, int]) -> int:
    """SIGTERM the noted processes still running as themselves, SIGKILL the rest after a grace
    period; returns how many were still running."""
    alive = {pid for pid, start in noted.items() if _running(pid, start)}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in alive:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + (TERM_GRACE_S if sig == signal.SIGTERM else 0)
        while time.monotonic() < deadline and any(_running(pid, noted[pid]) for pid in alive):
            time.sleep(0.1)
    return len(alive)


def _running(pid: int, start: int) -> bool:
    found = _stat(pid)
    if found is None or found[1] != start:
        return False
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def main(driver: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the driver is not for us
    noted: dict[int, int] = {}
    while True:
        noted.update(descendants(driver))
        ready, _, _ = select.select([0], [], [], SNAPSHOT_EVERY_S)
        if ready and not os.read(0, 4096):  # end of file: the driver is gone
            break
    noted.update(descendants(driver))  # whatever is still below it (a normal exit: usually nothing)
    end_all(noted)


if __name__ == "__main__":
    main(int(sys.argv[1]))
