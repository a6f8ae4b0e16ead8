"""The reward sandbox's supervisor: the process between the worker and the sandbox, in which no
reward code ever runs.

    python -I .../supervisor.py WORKDIR DISK_MB -- PYTHON -m stabledrl.common.sandbox.child

Why a process of its own: the sandbox imports the reward module, so whatever the sandbox does for
itself at its end, the module can undo from inside its interpreter (replace the reaper, register
an ``atexit`` hook that forks after the last reap). Clean-up that must hold is therefore done from
outside. This process is a child subreaper (``PR_SET_CHILD_SUBREAPER``): every process below it
whose parent ends is re-parented here, not to PID 1, and no process can leave the subtree of its
ancestors (``setsid`` and double forks change its session, not its ancestry). When the sandbox
ends (the worker closed its stdin, or it crashed), when the worker itself ends, or on SIGTERM, the
supervisor kills the sandbox, then every process left below it, round after round until none is
left, and only then exits: once the worker has waited for this process, nothing the reward
started lives on.

It is out of the reward's reach: it runs ``python -I`` (no PYTHONPATH, nothing from the working
directory: a reward package's directory cannot shadow a module it imports) and imports only the
standard library; it is not dumpable (no process of its user may ptrace it or write its memory);
and no reward process may signal it: Landlock's signal scope (ABI >= 6) keeps signals inside the
sandbox's domain, as root without Landlock the reward runs as nobody, and in every case the
sandbox's seccomp filter denies signals aimed at this process (``confine.deny_syscalls``).

A private directory (``private_directory``): before the sandbox starts, its directory becomes a
tmpfs of DISK_MB MiB in a mount namespace of the sandbox's own (as root; otherwise inside a user
namespace of its own, where the kernel lets unprivileged users create one), so what reward code
writes, in all its files together and including files it deleted but holds open, is bounded in
bytes, and nothing of it reaches the shared temporary filesystem. The outcome reaches the sandbox
in ``STABLEDRL_SANDBOX_DISK`` (``tmpfs``, or why not), which reports it with the rest of its
confinement.
"""
from __future__ import annotations

import ctypes
import os
import select
import signal
import sys

DISK_ENV = "STABLEDRL_SANDBOX_DISK"
GUARDED_ENV = "STABLEDRL_SANDBOX_GUARDED"  # pids the sandbox's seccomp filter keeps signals from: this one, the worker
PARENT_CHECK_S = 0.5  # how often the worker's end is checked for when no pidfd reports it
_PR_SET_DUMPABLE, _PR_SET_CHILD_SUBREAPER = 4, 36
_CLONE_NEWNS, _CLONE_NEWUSER = 0x00020000, 0x10000000
_MS_NOSUID, _MS_NODEV, _MS_REC, _MS_PRIVATE = 2, 4, 1 << 14, 1 << 18
_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def private_directory(directory: str, disk_mb: int) -> str:
    """Make ``directory`` a tmpfs of ``disk_mb`` MiB seen only by this process and its children;
    returns 'tmpfs', or why it could not (the caller then runs without the bound)."""
    uid, gid = os.geteuid(), os.getegid()
    try:
        if uid == 0:
            _check(_libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        else:  # a user namespace where this user is itself (not root), owning the new mount namespace
            _check(_libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS), "unshare(CLONE_NEWUSER | CLONE_NEWNS)")
            for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
        _check(_libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "mount --make-rprivate /")
        options = f"size={disk_mb}m,nr_inodes={max(1024, disk_mb * 256)},mode=0700".encode()
        _check(_libc.mount(b"tmpfs", directory.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, options), "mount tmpfs")
    except OSError as e:
        return f"no private filesystem ({e.strerror or e})"
    return "tmpfs"


def _group(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:  # the worker is gone already
        return pid


def _children() -> list[int]:
    """This process's children (those re-parented here included)."""
    try:
        with open(f"/proc/self/task/{os.getpid()}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:  # a kernel without the children file: every process whose parent is this one
        mine = []
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    data = f.read()
            except OSError:
                continue
            if entry.isdigit() and int(data[data.rindex(b")") + 2 :].split()[1]) == os.getpid():
                mine.append(int(entry))
        return mine


def reap_all() -> int:
    """Kill every process below this one, round after round (each round re-parents here the
    children of the processes it killed) until none is left; returns how many were killed."""
    killed: set[int] = set()
    while True:
        children = _children()
        if not children:
            break
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        for pid in children:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
    _collect()
    return len(killed)


def _collect() -> None:
    """Wait for every child that has ended already (orphans re-parented here end as zombies)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _wait(sandbox: int, worker: int, wake: int, stopping: list[int]) -> int | None:
    """The sandbox's wait status once it ends; None when the worker ended first or a signal asked
    the supervisor to stop (``stopping``; ``wake`` becomes readable then). Orphans that end
    meanwhile are collected."""
    try:
        fd = os.pidfd_open(sandbox)
    except (AttributeError, OSError):  # before Linux 5.3: the wait below times out instead
        fd = None
    try:
        while True:
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    return 0
                if pid == sandbox:
                    return status
                if pid == 0:
                    break
            if stopping or os.getppid() != worker:
                return None
            select.select([wake] + ([fd] if fd is not None else []), [], [], PARENT_CHECK_S)
    finally:
        if fd is not None:
            os.close(fd)


def main(argv: list[str]) -> int:
    directory, disk_mb, sep, *command = argv
    if sep != "--" or not command:
        print("usage: supervisor.py WORKDIR DISK_MB -- COMMAND ...", file=sys.stderr)
        return 2
    worker = os.getppid()
    _check(_libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(PR_SET_CHILD_SUBREAPER)")
    _check(_libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")
    stopping: list[int] = []
    wake, wake_w = os.pipe()  # a signal's byte wakes the wait below (signal.set_wakeup_fd)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: stopping.append(signum))
    sandbox = os.fork()
    if sandbox == 0:
        try:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            os.setsid()  # no process group shared with the supervisor
            os.environ[GUARDED_ENV] = " ".join(map(str, sorted({os.getppid(), worker, _group(worker)})))
            os.environ[DISK_ENV] = private_directory(directory, int(disk_mb))
            os.chdir(directory)  # the tmpfs, not the directory beneath it
            os.execv(command[0], command)
        finally:
            os._exit(127)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)  # the worker sees end-of-file on the sandbox's pipes once the sandbox's side is gone
    os.dup2(null, 1)
    os.close(null)
    status = _wait(sandbox, worker, wake, stopping)
    if status is None:
        try:
            os.kill(sandbox, signal.SIGKILL)
        except ProcessLookupError:
            pass
    reap_all()
    if status is None or os.WIFSIGNALED(status):
        return 128 + (os.WTERMSIG(status) if status is not None else signal.SIGKILL)
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
