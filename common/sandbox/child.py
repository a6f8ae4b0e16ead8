"""Child side of the reward sandbox: ``python -m stabledrl.common.sandbox.child``.

This process (the sandbox), started by its supervisor (``supervisor``: a private tmpfs as its
directory, and every process left below it killed once it ends), reads its settings from stdin
(JSON: the task config, the sandbox limits, the reward file), confines itself (``confine``: memory
and file-size limits, Landlock or as root user nobody, no capabilities, the seccomp filter, child
subreaper), builds the task (importing a custom reward: its module-level code already runs
confined), replies ("ready", what is confined and whether the reward is batched) or ("error",
message), then answers each (completion, row) request, or (completions, rows) for a batched
reward, until stdin closes.

Each call runs in a fresh process forked from the sandbox: in its own session, in its own
temporary directory (also HOME and TMPDIR; removed afterwards), under a CPU-time limit and a
Landlock domain that lets it write only there. The sandbox waits ``timeout_s`` for its answer,
then ends the call: with Landlock's signal scope the call's warden kills every process of the
call at once (``_warden``); the sandbox then kills the call's process group and every process
left behind (re-parented to the sandbox, the subreaper), round after round. A call cannot break
the next one: state, memory and leftovers die with it.

The sandbox itself runs under the same confinement as the calls (Landlock, the memory and file
limits, the seccomp filter of ``confine.deny_syscalls``: no metadata changes, no sockets but
IPv4/IPv6 where the network is allowed), so a reward module's import is confined too; the import
must end within ``reward.import_timeout_s`` and must leave no thread behind (a thread would run
outside every per-call limit). A sandbox that still burns CPU of its own (a hook or handler the
module left) is stopped: each call answers with the sandbox's own CPU time checked.

Output: whatever reward code prints (at import, or in a call) goes to a file in its own
directory, never to the worker's log directly; the sandbox copies at most ``OUTPUT_SHOWN_BYTES``
of each call's output, and ``OUTPUT_BUDGET_BYTES`` in all, to the log (the first lines count), and
a failed call's message carries the end of its output. Replies are JSON over the reply pipe:
("ok", [total, parts]) or (failure kind, message); the worker never unpickles what comes from
here. The forked call closes every descriptor but its own answer pipe and its output file, so
it cannot speak to the worker directly.
"""
from __future__ import annotations

import gc
import hashlib
import json
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Optional

from stabledrl.common.config.base import MAX_SECONDS
from stabledrl.common.sandbox import confine
from stabledrl.common.sandbox.scorer import FAILURE_KINDS, outcome_of
from stabledrl.common.sandbox.supervisor import DISK_ENV, GUARDED_ENV
from stabledrl.common.config.task import parse_task_config
from stabledrl.common.tasks.build import build_task
from stabledrl.common.tasks.reward_functions import RewardFunctions

MAX_REPLY_BYTES = 1 << 20
OUTPUT_SHOWN_BYTES = 2048  # of one call's output, copied to the log
OUTPUT_BUDGET_BYTES = 64 << 10  # of all output, copied to the log over the sandbox's life
OUTPUT_FILE = ".output"
OWN_CPU_ALLOWANCE_S = 1.0  # the sandbox's own CPU time between two answers, beyond 5% of the wall clock
EXIT_GRACE_S = 1.0  # an answered call has this long to exit before it is killed
WARDEN_GRACE_S = 1.0  # a warden asked to end its call (a timeout) has this long
CALL_OUTCOMES = ("ok", *FAILURE_KINDS)


def _serve() -> None:
    requests = Connection(os.dup(0), writable=False)
    replies = Connection(os.dup(1), readable=False)
    log = _Log(os.dup(2))
    settings = json.loads(requests.recv_bytes())
    base = Path(settings["workdir"])
    _redirect_output(base / OUTPUT_FILE)  # prints at import go to a file, never unbounded to the log
    try:
        sandbox = _Sandbox(settings, base, log)
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises ConfigError
        tail = _tail(base / OUTPUT_FILE)
        replies.send_bytes(json.dumps(["error", f"{type(e).__name__}: {e}{tail}"]).encode())
        return
    finally:
        log.show("at import", base / OUTPUT_FILE)
        _redirect_output(Path(os.devnull))
    replies.send_bytes(json.dumps(["ready", sandbox.confined]).encode())
    try:
        while True:
            try:
                completion, row = requests.recv()
            except EOFError:
                return
            answer = sandbox.call(completion, row)
            stray = sandbox.own_cpu()
            if stray:
                replies.send_bytes(json.dumps(["crash", stray]).encode())
                return
            replies.send_bytes(json.dumps(answer).encode())
    finally:
        sandbox.reaper.reap()  # nothing of a reward outlives the sandbox either
        for entry in base.iterdir() if base.is_dir() else ():
            _remove(entry) if entry.is_dir() else entry.unlink(missing_ok=True)


class _Log:
    """The worker's log, as this sandbox may write it: bounded copies of reward output."""

    def __init__(self, fd: int) -> None:
        self.fd, self.left = fd, OUTPUT_BUDGET_BYTES

    def write(self, text: str) -> None:
        try:
            os.write(self.fd, text.encode(errors="replace"))
        except OSError:
            pass

    def show(self, what: str, path: Path) -> None:
        """Copy the start of the output file ``path`` (at most OUTPUT_SHOWN_BYTES, while the
        budget lasts) to the log, and remove the file."""
        try:
            size = path.stat().st_size
        except OSError:
            return
        if size and self.left > 0:
            with path.open("rb") as f:
                head = f.read(min(size, OUTPUT_SHOWN_BYTES, self.left))
            self.left -= len(head)
            more = f" ... ({size - len(head)} more bytes not shown)" if size > len(head) else ""
            self.write(f"reward output {what}:\n{head.decode(errors='replace').rstrip()}{more}\n")
            if self.left <= 0:
                self.write(f"reward sandbox: {OUTPUT_BUDGET_BYTES >> 10} KiB of reward output shown; further output "
                           "is not copied to this log\n")
        path.unlink(missing_ok=True)


def _redirect_output(path: Path) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _tail(path: Path, limit: int = 1000) -> str:
    """The end of an output file, for a failure message ('' when empty)."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - limit))
            text = f.read().decode(errors="replace").strip()
    except OSError:
        return ""
    return f"; its output ended with: {text[-limit:]}" if text else ""


class _Sandbox:
    def __init__(self, settings: dict[str, Any], base: Path, stderr: _Log) -> None:
        self.cfg = parse_task_config(settings["task"])
        self.base, self.timeout_s, self.calls, self.stderr = base, self.cfg.reward.timeout_s, 0, stderr
        self.reaper = confine.Reaper()
        # opened now: the Landlock domain entered below forbids /proc
        self._threads = os.open("/proc/self/task", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        notes = self._confine(settings)
        reward = ", ".join(settings.get("reward_files", [])) or ", ".join(self.cfg.reward.custom_specs) or \
            f"the {self.cfg.name} reward"
        limit = self.cfg.reward.import_timeout_s
        previous = signal.signal(signal.SIGALRM, lambda *_: _import_too_slow(reward, limit))
        signal.setitimer(signal.ITIMER_REAL, limit)
        try:
            self.task = build_task(self.cfg)  # a custom reward's module-level code runs confined
            if isinstance(self.task.correctness, RewardFunctions):
                self.task.correctness.load()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        threads = len(os.listdir(self._threads))
        if threads > 1:
            raise RuntimeError(f"custom reward {reward}: its module-level code left {threads - 1} thread(s) running; "
                               "a reward module must not start threads at import (they would run outside every "
                               "per-call limit): start them inside the function, or not at all")
        _forget_hooks()
        for i, file in enumerate(settings.get("reward_files", [])):
            digest = hashlib.sha256(Path(file).read_bytes()).hexdigest()[:16]
            notes.insert(i, f"reward {file} (sha256 {digest})")
        batched = bool(getattr(self.task.correctness, "batched", False))  # the parent then sends whole batches
        self.confined = {"landlock": self.landlock, "notes": notes,
                         "degraded": not (self.landlock and self.seccomp and self.private_disk), "batched": batched}
        self.share = 1  # completions in the call under way: its time and CPU limits are that many times the limits
        self._cpu, self._wall = _own_cpu(), time.monotonic()

    def own_cpu(self) -> str:
        """'' while the sandbox's own CPU time since the last check is what forking and reaping
        cost; else why it stops (code of the reward module runs in the sandbox itself)."""
        cpu, wall = _own_cpu(), time.monotonic()
        used, elapsed = cpu - self._cpu, wall - self._wall
        self._cpu, self._wall = cpu, wall
        if used <= OWN_CPU_ALLOWANCE_S + 0.05 * elapsed:
            return ""
        return (
            f"the reward sandbox itself used {used:.1f} s of CPU in {elapsed:.1f} s between calls: code of the reward "
            "module runs outside its calls (a hook or signal handler set at import); the sandbox is restarted"
        )

    def _confine(self, settings: dict[str, Any]) -> list[str]:
        """Limits, Landlock (else, as root, user nobody), no capabilities, the seccomp filter;
        returns what is in force."""
        box = self.cfg.reward.sandbox
        self.seccomp = True
        confine.set_limits(memory_mb=box.memory_mb, file_size_mb=box.file_size_mb)
        self.landlock, why = confine.landlock_abi() if box.landlock else (0, "task.reward.sandbox.landlock is false")
        disk = os.environ.get(DISK_ENV, "no supervisor")
        self.private_disk = disk == "tmpfs"
        notes = [
            f"memory {box.memory_mb} MiB",
            f"CPU {box.cpu_seconds:g} s per call",
            f"files <= {box.file_size_mb} MiB" + (f", {box.disk_mb} MiB in all (a private tmpfs)" if self.private_disk
                                                 else f"; their total not bounded: {disk}"),
            "own session and temporary directory per call",
            "leftover processes killed, and all of them when the sandbox ends (its supervisor)",
            f"import within {self.cfg.reward.import_timeout_s:g} s",
            "output to a file, bounded copies in the log",
        ]
        if self.landlock:
            confine.restrict_paths(_readable(settings, box.read_paths), [self.base, Path(os.devnull)],
                                   read_files=_readable_files(settings), allow_network=box.allow_network)
            network = "TCP allowed" if box.allow_network else "no TCP" if self.landlock >= 4 else "network not confined"
            notes.append(f"Landlock ABI {self.landlock}: reads confined, writes only in its directory, {network}")
        else:
            notes.append(f"no Landlock ({why}): files and network not confined")
        privileges = confine.drop_privileges(become_nobody=not self.landlock, chown=[self.base])
        notes += [privileges] if privileges else []
        try:
            guarded = [int(pid) for pid in os.environ.get(GUARDED_ENV, "").split()]  # the supervisor and the worker
            if confine.deny_syscalls(allow_network=box.allow_network, protect=guarded,
                                     protect_everyone=self.landlock < 6):  # ABI 6's scope confines kill(-1) itself
                sockets = "IPv4/IPv6 sockets only" if box.allow_network else "no sockets (TCP, UDP, Unix)"
                notes.append(f"seccomp: no file metadata changes (chmod, chown, utimes, xattrs), {sockets}, no "
                             "namespaces, no ptrace, no signals to its supervisor or the worker")
            else:
                notes.append(f"no seccomp filter for {os.uname().machine}: metadata and sockets not confined")
                self.seccomp = False
        except OSError as e:
            notes.append(f"no seccomp filter ({e}): metadata and sockets not confined")
            self.seccomp = False
        return notes

    def call(self, completion: str | list[str], row: Any) -> list:
        """One reward call in a forked, confined process; (outcome, payload) for the parent. A batch
        (lists of completions and rows, for a batched reward) is one call whose time and CPU limits
        are timeout_s and cpu_seconds times its completions; its payload holds each one's outcome."""
        self.calls += 1
        self.share = len(completion) if isinstance(completion, list) else 1
        workdir = Path(tempfile.mkdtemp(prefix=f"call{self.calls}-", dir=self.base))
        reader, writer = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(reader)
            _run_call(self, completion, row, workdir, writer)  # never returns
        os.close(writer)
        answer = Connection(reader, writable=False)
        outcome = ["crash", "the sandbox failed to wait for the call"]
        try:
            outcome = self._answer(answer, pid)
        finally:
            answer.close()
            leftovers = self.reaper.reap(group=pid)
            output = workdir / OUTPUT_FILE
            tail = _tail(output) if outcome[0] != "ok" else ""
            self.stderr.show(f"of call {self.calls}", output)
            _remove(workdir)
        if tail and isinstance(outcome[1], str):
            outcome = [outcome[0], outcome[1] + tail]
        if leftovers and outcome[0] == "ok":
            self.stderr.write(f"reward sandbox: call {self.calls} left {leftovers} process(es) behind; killed\n")
        return outcome

    def _answer(self, answer: Connection, pid: int) -> list:
        """The call's (outcome, payload); the call process is reaped (killed if need be) on return."""
        limit = min(self.timeout_s * self.share, MAX_SECONDS)  # a batch's: no timer holds more than that
        deadline = time.monotonic() + limit
        if not answer.poll(limit):
            _stop(pid)
            return ["timeout", f"no answer in {limit}s"]
        try:
            message = _parse(answer.recv_bytes(MAX_REPLY_BYTES))
        except EOFError:  # it died (or closed its pipe) without answering: its exit status says why
            status = _exit_status(pid, deadline - time.monotonic())
            if status is None:
                return ["timeout", f"no answer in {limit}s"]
            return _death(status, self.cfg.reward.sandbox)
        except (OSError, ValueError) as e:
            _kill(pid)
            os.waitpid(pid, 0)
            return ["crash", f"malformed or oversized answer ({type(e).__name__})"]
        _exit_status(pid, EXIT_GRACE_S)
        return message


def _import_too_slow(reward: str, limit: float) -> None:
    raise TimeoutError(f"importing custom reward {reward} took longer than task.reward.import_timeout_s = {limit:g} s "
                       "(module-level code must not hang; raise import_timeout_s if its set-up is slow)")


def _forget_hooks() -> None:
    """Drop what a reward module may have left to run in the sandbox itself, outside its calls."""
    sys.settrace(None)
    sys.setprofile(None)
    gc.callbacks.clear()
    for sig in (signal.SIGALRM, signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
                signal.SIGPIPE, signal.SIGVTALRM, signal.SIGPROF):
        signal.signal(sig, signal.SIG_IGN if sig == signal.SIGPIPE else signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process, not its children
    return usage.ru_utime + usage.ru_stime


def _stop(pid: int) -> None:
    """End a call past its time: SIGTERM lets its warden (if any) kill all the call's processes at
    once; SIGKILL (its whole group; the reaper gets the rest) after WARDEN_GRACE_S."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    if _exit_status(pid, WARDEN_GRACE_S) is None:
        return  # killed by _exit_status, and waited for


def _exit_status(pid: int, within_s: float) -> Optional[int]:
    """``pid``'s exit status if it ends within ``within_s``; else None, once it has been killed."""
    end = time.monotonic() + max(0.0, within_s)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() >= end:
            _kill(pid)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.001)


def _run_call(sandbox: _Sandbox, completion: str, row: Any, workdir: Path, writer: int) -> None:
    """The forked call: confine further, score, answer, exit. Never returns.

    With Landlock's signal scope (ABI >= 6) this process is the call's warden: in a domain of its
    own it forks the process that runs the reward, in a domain nested one level deeper (so that
    nothing of the reward can signal the warden), waits for it, then ``kill(-1, SIGKILL)``: every
    process left in the call's domains, however deep its chain of sessions, and nothing else
    (the scope keeps the signal inside). SIGTERM from the sandbox (a timeout) does the same."""
    code = 0
    try:
        os.setsid()
        confine.die_with_parent()
        _close_descriptors(keep=writer)
        output = os.open(workdir / OUTPUT_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(output)
        box = sandbox.cfg.reward.sandbox
        os.chdir(workdir)
        os.environ.update(HOME=str(workdir), TMPDIR=str(workdir))
        tempfile.tempdir = str(workdir)
        if sandbox.landlock:
            confine.restrict_paths([], [workdir, Path(os.devnull)], handle_reads=False, allow_network=box.allow_network)
        if sandbox.landlock >= 6 and _scoped():
            _warden(sandbox, completion, row, workdir, writer)  # never returns
        confine.set_limits(cpu_seconds=box.cpu_seconds * sandbox.share)
        _score(sandbox, completion, row, writer)
    except BaseException:  # noqa: BLE001
        code = 70
    _flush()
    os._exit(code)


def _score(sandbox: _Sandbox, completion: str, row: Any, writer: int) -> None:
    box = sandbox.cfg.reward.sandbox
    reply = Connection(writer, readable=False)
    try:
        if isinstance(completion, list):  # a batch: each completion's own outcome
            message = ["ok", [_outcome(r, box, 500) for r in sandbox.task.reward_batch(completion, row)]]
        else:
            message = _outcome(sandbox.task.reward(completion, row), box, 2000)
    except BaseException as e:  # noqa: BLE001 - sys.exit included: the call failed, the sandbox lives on
        message = _outcome(e, box, 2000)
    _flush()  # what it printed is in its output file before the answer (the call ends with os._exit)
    reply.send_bytes(json.dumps(message).encode())


def _outcome(result: Any, box: Any, chars: int) -> list:
    """["ok", [total, parts]] for a result, [failure kind, message] for an exception."""
    if isinstance(result, MemoryError):
        return ["limit", f"MemoryError{result.args and f': {result}' or ''} (task.reward.sandbox.memory_mb = "
                f"{box.memory_mb})"]
    if isinstance(result, BaseException):
        return [outcome_of(result), repr(result)[:chars]]
    return ["ok", [result.total, dict(result.parts)]]


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed or replaced by the reward
            pass


def _scoped() -> bool:
    """Whether this process's signals stay in its Landlock domain: its parent (the sandbox) and
    init must be out of reach. Checked before any ``kill(-1)``: without the scope that would
    signal every process of this user."""
    for pid in (os.getppid(), 1):
        try:
            os.kill(pid, 0)
            return False
        except PermissionError:
            continue
        except ProcessLookupError:
            return False
    return True


def _kill_domain() -> None:
    try:
        os.kill(-1, signal.SIGKILL)  # the scope keeps it to this call's domains
    except ProcessLookupError:  # nothing left to kill
        pass


def _warden(sandbox: _Sandbox, completion: str, row: Any, workdir: Path, writer: int) -> None:
    box = sandbox.cfg.reward.sandbox

    def end_all(*_: Any) -> None:
        _kill_domain()
        os._exit(75)

    signal.signal(signal.SIGTERM, end_all)
    scorer = os.fork()
    if scorer == 0:
        code = 0
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            confine.die_with_parent()
            confine.restrict_paths([], [workdir, Path(os.devnull)], handle_reads=False,
                                   allow_network=box.allow_network)  # nested: the warden is out of its reach
            confine.set_limits(cpu_seconds=box.cpu_seconds * sandbox.share)
            _score(sandbox, completion, row, writer)
        except BaseException:  # noqa: BLE001
            code = 70
        _flush()
        os._exit(code)
    os.close(writer)
    _, status = os.waitpid(scorer, 0)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
    _kill_domain()
    if os.WIFSIGNALED(status):  # the sandbox reads the scorer's end as the call's
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [os.WTERMSIG(status)])
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 70)


def _death(status: int, box: Any) -> list:
    """(outcome, message) of a call process that died without answering."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGXCPU:
            return ["limit", f"killed by SIGXCPU: past task.reward.sandbox.cpu_seconds = {box.cpu_seconds:g}"]
        if sig == signal.SIGKILL:
            return ["limit", f"killed by SIGKILL: past task.reward.sandbox.cpu_seconds = {box.cpu_seconds:g} "
                    "(its hard limit), or killed from outside"]
        return ["crash", f"killed by signal {signal.Signals(sig).name}"]
    return ["crash", f"exit code {os.WEXITSTATUS(status)}"]


def _parse(data: bytes) -> list:
    """A call's answer: [outcome, payload] with an outcome a call may give (the reward's own code
    can write to the call's pipe too, so nothing else passes)."""
    message = json.loads(data)
    if not (isinstance(message, list) and len(message) == 2 and message[0] in CALL_OUTCOMES):
        raise ValueError("malformed reply")
    return message


def _close_descriptors(keep: int) -> None:
    """stdin from /dev/null; only fds 1, 2 (the log) and ``keep`` stay open."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.closerange(3, keep)
    os.closerange(keep + 1, 1 << 16)


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _readable(settings: dict[str, Any], extra: list[str]) -> list[Path]:
    """Directories a reward may read: Python (prefixes, sys.path), shared libraries, the project,
    and task.reward.sandbox.read_paths."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path, "/usr", "/lib", "/lib64"}
    paths.update(settings.get("read_paths", []))
    paths.update(str(Path(p).expanduser().resolve()) for p in extra)
    return [Path(p) for p in sorted(paths) if p and Path(p).exists()]


def _readable_files(settings: dict[str, Any]) -> list[Path]:
    files = ["/dev/zero", "/dev/urandom", "/dev/random", "/etc/ld.so.cache", "/etc/localtime"]
    files += settings.get("reward_files", [])
    return [Path(f) for f in files if Path(f).exists()]


def _remove(path: Path) -> None:
    def writable_again(function, name, _excinfo):  # a reward may have made its files read-only
        try:
            os.chmod(os.path.dirname(name), 0o700)
            os.chmod(name, 0o700)
            function(name)
        except OSError:
            pass

    shutil.rmtree(path, onerror=writable_again)


if __name__ == "__main__":
    _serve()
