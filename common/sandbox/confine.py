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
- ``deny_syscalls``: a seccomp filter (what Landlock does not cover): no change of any file's
  metadata (chmod, chown, utimes, extended attributes: seccomp cannot see paths, so they are
  denied everywhere; a reward has no business changing metadata), no socket of any family unless
  the network is allowed (then only IPv4/IPv6: never a Unix socket such as Ray's raylet or
  plasma store; UDP is a socket too), no io_uring (it would bypass the filter), no kernel keyrings,
  perf events, mounts, ptrace or userfaultfd, no namespaces (unshare, setns, and clone() with a
  CLONE_NEW* flag; clone3, whose flags the filter cannot read, answers ENOSYS and the C library
  falls back to clone), and no signal to the processes it is given to protect (the sandbox's
  supervisor and the worker). A denied call fails with EPERM (PermissionError).
- ``Reaper``: the process that forks reward calls becomes a child subreaper, so every process a call
  leaves behind (even one that called ``setsid`` and double-forked) becomes its child; ``reap``
  kills them all, round after round until none is left (a chain of any depth: each round kills
  the processes re-parented by the one before), bounded in time, not in rounds.
"""
from __future__ import annotations

import ctypes
import os
import resource
import signal
import threading
import time
from pathlib import Path
from typing import Iterable, Optional, Sequence

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
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
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


REAP_TIMEOUT_S = 30.0

# seccomp: <linux/filter.h>, <linux/seccomp.h>, <linux/audit.h>
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_JGE_K, _BPF_JSET_K, _BPF_RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_AF_INET, _AF_INET6 = 2, 10
# <linux/sched.h>: every CLONE_NEW* flag clone() takes (NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET)
CLONE_NEW_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
_METADATA = ("chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat", "utime",
             "utimes", "futimesat", "utimensat", "setxattr", "lsetxattr", "fsetxattr", "removexattr",
             "lremovexattr", "fremovexattr", "setxattrat", "removexattrat")
_OTHER = ("io_uring_setup", "io_uring_enter", "io_uring_register", "keyctl", "add_key", "request_key",
          "perf_event_open", "userfaultfd", "unshare", "setns", "mount", "umount2", "pivot_root", "ptrace",
          "process_vm_readv", "process_vm_writev", "pidfd_send_signal", "pidfd_getfd")
_SIGNALS = ("kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_open")  # the pid is args[0]
# (audit arch, first number of a foreign ABI or None, {name: number}); numbers from the kernel's tables
_SECCOMP_ARCH = {
    "x86_64": (0xC000003E, 0x40000000, {
        "socket": 41, "chmod": 90, "fchmod": 91, "chown": 92, "fchown": 93, "lchown": 94, "utime": 132,
        "utimes": 235, "setxattr": 188, "lsetxattr": 189, "fsetxattr": 190, "removexattr": 197,
        "lremovexattr": 198, "fremovexattr": 199, "fchownat": 260, "futimesat": 261, "fchmodat": 268,
        "utimensat": 280, "fchmodat2": 452, "setxattrat": 463, "removexattrat": 466, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "keyctl": 250, "add_key": 248, "request_key": 249,
        "perf_event_open": 298, "userfaultfd": 323, "unshare": 272, "setns": 308, "mount": 165, "umount2": 166,
        "pivot_root": 155, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
        "pidfd_send_signal": 424, "pidfd_getfd": 438, "kill": 62, "tkill": 200, "tgkill": 234,
        "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297, "pidfd_open": 434, "clone": 56, "clone3": 435}),
    "aarch64": (0xC00000B7, None, {
        "socket": 198, "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "removexattr": 14, "lremovexattr": 15,
        "fremovexattr": 16, "fchmod": 52, "fchmodat": 53, "fchownat": 54, "fchown": 55, "utimensat": 88,
        "fchmodat2": 452, "setxattrat": 463, "removexattrat": 466, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "keyctl": 219, "add_key": 217, "request_key": 218, "perf_event_open": 241,
        "userfaultfd": 282, "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41,
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "pidfd_send_signal": 424,
        "pidfd_getfd": 438, "kill": 129, "tkill": 130, "tgkill": 131, "rt_sigqueueinfo": 138,
        "rt_tgsigqueueinfo": 240, "pidfd_open": 434, "clone": 220, "clone3": 435}),
}


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def seccomp_program(machine: str, allow_network: bool, protect: Sequence[int] = (),
                    protect_everyone: bool = False) -> list[tuple[int, int, int, int]]:
    """The BPF program of ``deny_syscalls`` as (code, jt, jf, k) rows: another architecture's
    calls, the metadata calls and ``_OTHER`` fail with EPERM; socket() too, unless
    ``allow_network`` and its family is IPv4 or IPv6; clone() with any CLONE_NEW* flag (a
    namespace: a user namespace would hand the reward every capability inside it) too; clone3()
    with ENOSYS (its flags lie in memory, out of the filter's sight; the C library then falls back
    to clone()). A signal (``_SIGNALS``) aimed at a pid of ``protect``, at its process group
    (-pid) or, with ``protect_everyone``, at every process (-1) fails with EPERM."""
    import errno

    arch, foreign, numbers = _SECCOMP_ARCH[machine]
    denied = sorted({numbers[n] for n in (*_METADATA, *_OTHER) if n in numbers})
    # rows with symbolic jump targets ("deny", "socket", "clone", "signal", "enosys", "allow"), resolved below
    rows: list[tuple[int, object, object, int]] = [
        (_BPF_LD_W_ABS, 0, 0, 4), (_BPF_JEQ_K, 0, "deny", arch), (_BPF_LD_W_ABS, 0, 0, 0)]  # arch, then nr
    if foreign is not None:
        rows.append((_BPF_JGE_K, "deny", 0, foreign))  # x32 numbers on x86_64
    rows += [(_BPF_JEQ_K, "deny", 0, nr) for nr in denied]
    rows += [(_BPF_JEQ_K, "clone", 0, numbers["clone"]), (_BPF_JEQ_K, "enosys", 0, numbers["clone3"])]
    targets = sorted({v & 0xFFFFFFFF for pid in protect for v in (pid, -pid)} | ({0xFFFFFFFF} if protect_everyone
                                                                                 else set()))
    if targets:
        rows += [(_BPF_JEQ_K, "signal", 0, numbers[name]) for name in _SIGNALS]
    rows += [(_BPF_JEQ_K, "socket", 0, numbers["socket"]), (_BPF_RET_K, 0, 0, _RET_ALLOW)]
    labels = {"clone": len(rows)}
    rows += [(_BPF_LD_W_ABS, 0, 0, 16), (_BPF_JSET_K, "deny", "allow", CLONE_NEW_FLAGS)]  # args[0]: the flags
    if targets:
        labels["signal"] = len(rows)
        rows.append((_BPF_LD_W_ABS, 0, 0, 16))  # args[0] (its low half): the pid
        rows += [(_BPF_JEQ_K, "deny", 0, target) for target in targets]
        rows.append((_BPF_RET_K, 0, 0, _RET_ALLOW))
    labels["socket"] = len(rows)
    rows.append((_BPF_LD_W_ABS, 0, 0, 16))  # args[0] (its low half): the address family
    if allow_network:
        rows += [(_BPF_JEQ_K, "allow", 0, _AF_INET), (_BPF_JEQ_K, "allow", 0, _AF_INET6)]
    labels["deny"] = len(rows)
    rows.append((_BPF_RET_K, 0, 0, _RET_ERRNO | errno.EPERM))
    labels["allow"] = len(rows)
    rows.append((_BPF_RET_K, 0, 0, _RET_ALLOW))
    labels["enosys"] = len(rows)
    rows.append((_BPF_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS))

    def offset(i: int, target: object) -> int:
        return labels[target] - i - 1 if isinstance(target, str) else int(target)

    return [(code, offset(i, jt), offset(i, jf), k) for i, (code, jt, jf, k) in enumerate(rows)]


def deny_syscalls(allow_network: bool, protect: Sequence[int] = (), protect_everyone: bool = False) -> bool:
    """Install ``seccomp_program`` on this process (inherited by every child, never removable);
    False where this architecture has no table here. OSError where the kernel refuses it."""
    machine = os.uname().machine
    if machine not in _SECCOMP_ARCH:
        return False
    rows = seccomp_program(machine, allow_network, protect, protect_everyone)
    filters = (_SockFilter * len(rows))(*[_SockFilter(*row) for row in rows])
    prog = _SockFprog(len(rows), ctypes.cast(filters, ctypes.POINTER(_SockFilter)))
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    if _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp: {os.strerror(err)}")
    return True


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

    def reap(self, group: Optional[int] = None, within_s: float = REAP_TIMEOUT_S) -> int:
        """Kill process group ``group`` and every remaining child (orphans re-parented here, round
        after round, until none is left, for up to ``within_s`` seconds); returns how many
        processes were killed. Each round kills every child at once, so a chain of N processes
        (each in a session of its own) takes N rounds of about a millisecond."""
        if group is not None:
            try:
                os.killpg(group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        killed: set[int] = set()
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
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
