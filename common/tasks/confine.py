"""What a reward process may do: resource limits, Linux Landlock, no privileges, no leftovers.

The reward sandbox (``sandbox_child``) calls these in its own processes, never in the worker:

- ``set_limits``: RLIMIT_AS (memory), RLIMIT_CPU (CPU seconds; SIGXCPU, then SIGKILL one second
  later), RLIMIT_FSIZE (largest file it may write), no core dumps.
- ``restrict_paths``: a Landlock domain (Linux >= 5.13, unprivileged): files may be read only under
  the given directories (Python, the project, the reward file), written only under the given ones
  (the call's own temporary directory); with Landlock ABI >= 4 no TCP connect or bind unless
  allowed, with ABI >= 6 no signals to processes outside the domain (the worker). Domains nest: each
  call narrows its process's writes further. Where the kernel, a container's seccomp filter or a
  disabled LSM refuses it, ``landlock_abi`` says why and the caller degrades.
- ``drop_privileges``: as root, every capability goes (so no limit can be raised again, no file
  permission bypassed), and the bounding set with it (an ``execve`` cannot get them back); without
  Landlock, root also becomes ``nobody``.
- ``Reaper``: the process that forks reward calls becomes a child subreaper, so every process a call
  leaves behind (even one that called ``setsid`` and double-forked) becomes its child; ``reap``
  kills them all.
"""
from __future__ import annotations

import ctypes
import os
import resource
import signal
import threading
from pathlib import Path
from typing import Iterable, Optional

# <linux/landlock.h>
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_V1 = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
_FS_REFER, _FS_TRUNCATE, _FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1
_RULE_PATH_BENEATH = 1
_CREATE_RULESET_VERSION = 1
_SYSCALLS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}  # create_ruleset, add_rule, restrict_self
# <linux/prctl.h>, <linux/capability.h>
_PR_SET_PDEATHSIG, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_SET_CHILD_SUBREAPER = 1, 24, 38, 36
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_CAP_VERSION_3 = 0x20080522
NOBODY = 65534
READ = _FS_READ_FILE | _FS_READ_DIR | _FS_EXECUTE
READ_FILE_ONLY = _FS_READ_FILE | _FS_EXECUTE

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _cap_last() -> int:
    try:  # read at import: a Landlock domain entered later forbids /proc
        return int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        return 63


_CAP_LAST = _cap_last()


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _syscall(number: int, *args) -> int:
    result = _libc.syscall(number, *args)
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def _prctl(option: int, arg: int = 0) -> None:
    if _libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def landlock_abi() -> tuple[int, str]:
    """(Landlock ABI version, or 0, and why it is unavailable)."""
    numbers = _SYSCALLS.get(os.uname().machine)
    if numbers is None:
        return 0, f"no Landlock syscall numbers for {os.uname().machine}"
    try:
        return _syscall(numbers[0], None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION)), ""
    except OSError as e:
        return 0, f"landlock_create_ruleset: {e.strerror} (kernel without Landlock, LSM disabled, or a seccomp filter)"


def _fs_rights(abi: int) -> int:
    rights = _FS_V1
    if abi >= 2:
        rights |= _FS_REFER
    if abi >= 3:
        rights |= _FS_TRUNCATE
    if abi >= 5:
        rights |= _FS_IOCTL_DEV
    return rights


def restrict_paths(read: Iterable[Path], write: Iterable[Path], *, read_files: Iterable[Path] = (),
                   handle_reads: bool = True, allow_network: bool = True) -> int:
    """Enter a Landlock domain in which this process (and every child) may read only beneath
    ``read`` (and the single files ``read_files``) and write only beneath ``write``; returns the ABI.
    ``handle_reads=False`` restricts writes only (a nested domain: reads stay as the outer one set
    them). OSError where Landlock is unavailable; paths that do not exist are skipped."""
    abi, why = landlock_abi()
    if not abi:
        raise OSError(why)
    create, add_rule, restrict_self = _SYSCALLS[os.uname().machine]
    everything = _fs_rights(abi)
    attr = _RulesetAttr(handled_access_fs=everything if handle_reads else everything & ~READ)
    size = 8
    if abi >= 4 and not allow_network:
        attr.handled_access_net, size = _NET_BIND_TCP | _NET_CONNECT_TCP, 16
    if abi >= 6:
        attr.scoped, size = _SCOPE_SIGNAL | _SCOPE_ABSTRACT_UNIX_SOCKET, 24
    ruleset = _syscall(create, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    try:
        file_rights = _FS_READ_FILE | _FS_WRITE_FILE | _FS_EXECUTE | (_FS_TRUNCATE if abi >= 3 else 0)
        rules = [(p, READ) for p in read] + [(p, READ_FILE_ONLY) for p in read_files] + [(p, everything) for p in write]
        for path, rights in rules:
            rights &= attr.handled_access_fs
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if not os.path.isdir(path):
                    rights &= file_rights
                rule = _PathBeneathAttr(allowed_access=rights, parent_fd=fd)
                if rights:
                    _syscall(add_rule, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule),
                             ctypes.c_uint32(0))
            finally:
                os.close(fd)
        _prctl(_PR_SET_NO_NEW_PRIVS, 1)
        _syscall(restrict_self, ctypes.c_int(ruleset), ctypes.c_uint32(0))
    finally:
        os.close(ruleset)
    return abi


def set_limits(memory_mb: Optional[int] = None, cpu_seconds: Optional[float] = None,
               file_size_mb: Optional[int] = None) -> None:
    """Soft = hard limits (hard lowered: without CAP_SYS_RESOURCE they cannot be raised again)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if memory_mb is not None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    if cpu_seconds is not None:
        soft = max(1, int(round(cpu_seconds)))
        resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 1))  # SIGXCPU at soft, SIGKILL at hard
    if file_size_mb is not None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_mb << 20, file_size_mb << 20))


def drop_privileges(become_nobody: bool, chown: Iterable[Path] = ()) -> str:
    """As root: drop every capability (and, with ``become_nobody``, switch to uid/gid nobody after
    handing ``chown`` to it). Returns what was done, for the log; '' when not root."""
    if os.geteuid() != 0:
        return ""
    if become_nobody:
        for path in chown:
            os.chown(path, NOBODY, NOBODY)
        os.setgroups([])
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)  # the kernel clears every capability with it
        return "running as nobody"
    for cap in range(_CAP_LAST + 1):
        try:
            _prctl(_PR_CAPBSET_DROP, cap)
        except OSError:
            pass
    try:
        _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)
    except OSError:
        pass
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    if _libc.capset(header, data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capset: {os.strerror(err)}")
    return "capabilities dropped"


def die_with_parent() -> None:
    """SIGKILL this process when its parent (thread) ends: a reward call outlives no sandbox."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Reaper:
    """Makes this (single-threaded) process a child subreaper; ``reap`` kills every descendant."""

    def __init__(self) -> None:
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        path = f"/proc/self/task/{threading.get_native_id()}/children"
        # opened now: a Landlock domain entered later would forbid opening it
        self._children = os.open(path, os.O_RDONLY | os.O_CLOEXEC) if os.path.exists(path) else None

    def children(self) -> list[int]:
        if self._children is None:
            return []
        return [int(p) for p in os.pread(self._children, 1 << 16, 0).split()]

    def reap(self, group: Optional[int] = None, rounds: int = 100) -> int:
        """Kill process group ``group`` and every remaining child (orphans re-parented here, round
        after round, until none is left); returns how many processes were killed."""
        if group is not None:
            try:
                os.killpg(group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        killed: set[int] = set()
        for _ in range(rounds):
            children = self.children()
            if not children:
                break
            for pid in children:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                killed.add(pid)
            for pid in children:
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass
        return len(killed)
