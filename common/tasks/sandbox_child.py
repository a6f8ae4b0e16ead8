"""Child side of the reward sandbox: ``python -m common.tasks.sandbox_child``.

This process (the sandbox) reads its settings from stdin (JSON: the task config, the sandbox
limits, the reward file), confines itself (``confine``: memory and file-size limits, Landlock or
as root user nobody, no capabilities, child subreaper), builds the task (importing a custom
reward: its module-level code already runs confined), replies ("ready", what is confined) or
("error", message), then answers each (completion, row) request until stdin closes.

Each call runs in a fresh process forked from the sandbox: in its own session, in its own
temporary directory (also HOME and TMPDIR; removed afterwards), under a CPU-time limit and a
Landlock domain that lets it write only there. The sandbox waits ``timeout_s`` for its answer,
then kills the call's process group and every process the call left behind (re-parented to the
sandbox, the subreaper). A call cannot break the next one: state, memory and leftovers die with it.

Replies are JSON over fd 1 (re-pointed at stderr first, so whatever reward code prints goes to
the log): ("ok", [total, parts]) or (failure kind, message); the worker never unpickles what comes
from here. The forked call closes every descriptor but its own answer pipe, so it cannot speak to
the worker directly.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Optional

from common.tasks import confine
from common.tasks.sandbox import FAILURE_KINDS, outcome_of

MAX_REPLY_BYTES = 1 << 20
EXIT_GRACE_S = 1.0  # an answered call has this long to exit before it is killed
CALL_OUTCOMES = ("ok", *FAILURE_KINDS)


def _serve() -> None:
    requests = Connection(os.dup(0), writable=False)
    replies = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)  # user prints must not corrupt the reply pipe
    sys.stdout = sys.stderr
    settings = json.loads(requests.recv_bytes())
    try:
        sandbox = _Sandbox(settings, Path(settings["workdir"]))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises ConfigError
        replies.send_bytes(json.dumps(["error", f"{type(e).__name__}: {e}"]).encode())
        return
    replies.send_bytes(json.dumps(["ready", sandbox.confined]).encode())
    try:
        while True:
            try:
                completion, row = requests.recv()
            except EOFError:
                return
            replies.send_bytes(json.dumps(sandbox.call(completion, row)).encode())
    finally:
        sandbox.reaper.reap()  # nothing of a reward outlives the sandbox either


class _Sandbox:
    def __init__(self, settings: dict[str, Any], base: Path) -> None:
        from common.config.task import parse_task_config
        from common.tasks.build import CustomReward, build_task

        self.cfg = parse_task_config(settings["task"])
        self.base, self.timeout_s, self.calls = base, self.cfg.reward.timeout_s, 0
        self.reaper = confine.Reaper()
        notes = self._confine(settings)
        self.task = build_task(self.cfg)  # a custom reward's module-level code runs confined
        if isinstance(self.task.correctness, CustomReward):
            self.task.correctness.load()
        if settings.get("reward_file"):
            digest = hashlib.sha256(Path(settings["reward_file"]).read_bytes()).hexdigest()[:16]
            notes.insert(0, f"reward {settings['reward_file']} (sha256 {digest})")
        self.confined = {"landlock": self.landlock, "notes": notes, "degraded": not self.landlock}

    def _confine(self, settings: dict[str, Any]) -> list[str]:
        """Limits, Landlock (else, as root, user nobody), no capabilities; returns what is in force."""
        box = self.cfg.reward.sandbox
        confine.set_limits(memory_mb=box.memory_mb, file_size_mb=box.file_size_mb)
        self.landlock, why = confine.landlock_abi() if box.landlock else (0, "task.reward.sandbox.landlock is false")
        notes = [f"memory {box.memory_mb} MiB", f"CPU {box.cpu_seconds:g} s per call", f"files <= {box.file_size_mb} MiB",
                 "own session and temporary directory per call", "leftover processes killed"]
        if self.landlock:
            confine.restrict_paths(_readable(settings, box.read_paths), [self.base, Path(os.devnull)],
                                   read_files=_readable_files(settings), allow_network=box.allow_network)
            network = "TCP allowed" if box.allow_network else "no TCP" if self.landlock >= 4 else "network not confined"
            notes.append(f"Landlock ABI {self.landlock}: reads confined, writes only in its directory, {network}")
        else:
            notes.append(f"no Landlock ({why}): files and network not confined")
        privileges = confine.drop_privileges(become_nobody=not self.landlock, chown=[self.base])
        return notes + ([privileges] if privileges else [])

    def call(self, completion: str, row: Any) -> list:
        """One reward call in a forked, confined process; (outcome, payload) for the parent."""
        self.calls += 1
        workdir = Path(tempfile.mkdtemp(prefix=f"call{self.calls}-", dir=self.base))
        reader, writer = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(reader)
            _run_call(self, completion, row, workdir, writer)  # never returns
        os.close(writer)
        answer = Connection(reader, writable=False)
        try:
            outcome = self._answer(answer, pid)
        finally:
            answer.close()
            leftovers = self.reaper.reap(group=pid)
            _remove(workdir)
        if leftovers and outcome[0] == "ok":
            print(f"reward sandbox: call {self.calls} left {leftovers} process(es) behind; killed", file=sys.stderr)
        return outcome

    def _answer(self, answer: Connection, pid: int) -> list:
        """The call's (outcome, payload); the call process is reaped (killed if need be) on return."""
        deadline = time.monotonic() + self.timeout_s
        if not answer.poll(self.timeout_s):
            _kill(pid)
            os.waitpid(pid, 0)
            return ["timeout", f"no answer in {self.timeout_s}s"]
        try:
            message = _parse(answer.recv_bytes(MAX_REPLY_BYTES))
        except EOFError:  # it died (or closed its pipe) without answering: its exit status says why
            status = _exit_status(pid, deadline - time.monotonic())
            if status is None:
                return ["timeout", f"no answer in {self.timeout_s}s"]
            return _death(status, self.cfg.reward.sandbox)
        except (OSError, ValueError) as e:
            _kill(pid)
            os.waitpid(pid, 0)
            return ["crash", f"malformed or oversized answer ({type(e).__name__})"]
        _exit_status(pid, EXIT_GRACE_S)
        return message


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
    """The forked call: confine further, score, answer, exit. Never returns."""
    code = 0
    try:
        os.setsid()
        confine.die_with_parent()
        _close_descriptors(keep=writer)
        box = sandbox.cfg.reward.sandbox
        confine.set_limits(cpu_seconds=box.cpu_seconds)
        os.chdir(workdir)
        os.environ.update(HOME=str(workdir), TMPDIR=str(workdir))
        tempfile.tempdir = str(workdir)
        if sandbox.landlock:
            confine.restrict_paths([], [workdir, Path(os.devnull)], handle_reads=False, allow_network=box.allow_network)
        reply = Connection(writer, readable=False)
        try:
            result = sandbox.task.reward(completion, row)
            message = ["ok", [result.total, dict(result.parts)]]
        except MemoryError as e:
            message = ["limit", f"MemoryError{e.args and f': {e}' or ''} (task.reward.sandbox.memory_mb = {box.memory_mb})"]
        except BaseException as e:  # noqa: BLE001 - sys.exit included: the call failed, the sandbox lives on
            message = [outcome_of(e), repr(e)[:2000]]
        reply.send_bytes(json.dumps(message).encode())
    except BaseException:  # noqa: BLE001
        code = 70
    os._exit(code)


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
    if settings.get("reward_file"):
        files.append(settings["reward_file"])
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
