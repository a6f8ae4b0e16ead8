"""What reward code starts and writes stays inside its sandbox.

- Nothing a reward starts outlives its sandbox: processes started at import, in a call or by an
  atexit hook, double-forked into sessions of their own, by a reward that also turned the
  sandbox's own reaper off, are all gone once the sandbox is closed (and once `train --dry-run`,
  which imports the reward in a sandbox, has exited). The reaping is done by the sandbox's
  supervisor, a process no reward code runs in (common/sandbox/supervisor.py), which the
  reward cannot signal.
- No namespace: clone() with CLONE_NEWUSER, clone3(), unshare(1) all fail.
- A call's files are bounded in bytes in all (task.reward.sandbox.disk_mb), not only file by file.
- What a reward prints reaches the log, flushed or not."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from stabledrl.common.config.task import parse_task_config
from stabledrl.common.sandbox import confine
from stabledrl.common.sandbox.scorer import RewardScorer
from stabledrl.common.tasks import RewardResult, Row

ROW = Row("p", "1+1=", "2")
ROOT = Path(__file__).resolve().parents[3]
DAEMONS = textwrap.dedent(
    """
    import atexit, os, shutil, sys

    MARK = {mark!r}

    def daemon():
        # a sleeper named MARK, double-forked into a session of its own (its parent exits at once)
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                name = os.path.join(os.getcwd(), MARK)
                if not os.path.exists(name):
                    os.symlink(shutil.which("sleep"), name)
                os.execv(name, [MARK, "600"])
            os._exit(0)
        os.wait()

    # the sandbox's own clean-up, turned off from its own interpreter
    from stabledrl.common.sandbox import confine
    confine.Reaper.reap = lambda self, group=None, within_s=0.0: 0
    main = sys.modules.get("__main__")
    if hasattr(main, "_kill_domain"):
        main._kill_domain = lambda: None
    daemon()                      # at import
    atexit.register(daemon)       # at the sandbox's exit, after its last reap

    def score(completion, row):
        if completion == "daemon":
            daemon()              # in a call
        return 1.0
    """
)


def marked(mark: str) -> list[int]:
    """The pids of live processes named ``mark``."""
    found = []
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() == mark and "State:\tZ" not in (comm.parent / "status").read_text():
                found.append(int(comm.parent.name))
        except OSError:
            pass
    return found


def reward_file(tmp_path: Path, mark: str) -> Path:
    path = tmp_path / "daemons.py"
    path.write_text(DAEMONS.format(mark=mark))
    return path


def task(path: Path) -> dict:
    return {"name": "arithmetic", "reward": {"custom": f"{path}:score", "isolation": "process", "format_weight": 0.0}}


def test_daemons_of_a_reward_that_turns_the_reaper_off_end_with_the_sandbox(tmp_path):
    mark = f"rwd{os.getpid() % 100000}"
    scorer = RewardScorer(parse_task_config(task(reward_file(tmp_path, mark))))
    try:
        assert scorer.score("daemon", ROW) == RewardResult(1.0, {"custom": 1.0})
        assert scorer.score("daemon", ROW) == RewardResult(1.0, {"custom": 1.0})
        deadline = time.monotonic() + 5
        while len(marked(mark)) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marked(mark), "the import-time daemon should be running while the sandbox lives"
    finally:
        scorer.close()
    assert marked(mark) == [], "processes the reward started outlived its sandbox"


STUCK = """
import multiprocessing.connection, time
multiprocessing.connection.Connection.recv = lambda self: time.sleep(600)  # deaf to its worker's end
"""


@pytest.mark.parametrize("deaf", [False, True])
def test_daemons_end_when_the_worker_is_killed(tmp_path, deaf):
    """A worker killed with SIGKILL (Ray ends its actors so) closes nothing: the sandbox sees its
    stdin end, or, where the module made it deaf to that, the supervisor sees its parent gone; it
    ends the sandbox and everything the reward started."""
    import signal

    mark = f"rw{'d' if deaf else 'k'}{os.getpid() % 100000}"
    path = reward_file(tmp_path, mark)
    if deaf:
        path.write_text(path.read_text() + STUCK)
    worker = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from stabledrl.common.config.task import parse_task_config
        from stabledrl.common.sandbox.scorer import RewardScorer
        from stabledrl.common.tasks import Row
        scorer = RewardScorer(parse_task_config({task(path)!r}))
        {'' if deaf else 'scorer.score("daemon", Row("p", "1+1=", "2"))'}
        print("ready", flush=True)
        time.sleep(600)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10  # the sandbox starts the import-time daemon on its own clock
        while not marked(mark) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marked(mark), "the import-time daemon should be running while the worker lives"
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    deadline = time.monotonic() + 10
    while marked(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marked(mark) == [], "processes the reward started outlived the worker that was killed"


def test_daemons_started_by_the_dry_import_end_with_train_dry_run(tmp_path):
    mark = f"rwe{os.getpid() % 100000}"
    path = reward_file(tmp_path, mark)
    done = subprocess.run(
        [sys.executable, "-m", "stabledrl", "train", "--config", str(ROOT / "deploy/configs/quickstart.yaml"),
         "--dry-run", f"task.reward.custom={path}:score", "task.reward.isolation=process",
         f"run.output_dir={tmp_path / 'run'}"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert marked(mark) == [], "processes the reward started at its dry import outlived `train --dry-run`"


ESCAPES = textwrap.dedent(
    """
    import ctypes, errno, os, signal, subprocess, sys

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000

    def fork_with(flags):
        pid = libc.syscall(56, flags | signal.SIGCHLD, 0, 0, 0, 0)  # x86_64 clone: as fork, in a new namespace
        if pid == 0:
            os._exit(0)
        if pid < 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        os.waitpid(pid, 0)
        return 1.0                       # it got a namespace of its own

    def score(completion, row):
        kind, _, arg = completion.partition(" ")
        if kind == "clone":
            return fork_with(CLONE_NEWUSER)
        if kind == "clone_net":
            return fork_with(CLONE_NEWNET)
        if kind == "clone3":
            args = (ctypes.c_uint64 * 11)(CLONE_NEWUSER, 0, 0, 0, signal.SIGCHLD)  # struct clone_args
            pid = libc.syscall(435, ctypes.byref(args), ctypes.sizeof(args))
            if pid == 0:
                os._exit(0)
            if pid < 0:
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
            os.waitpid(pid, 0)
            return 1.0
        if kind == "unshare":            # the util-linux command (it calls unshare(2))
            return float(subprocess.run(["unshare", "--user", "true"]).returncode == 0)
        if kind == "spawn":              # what a reward may do: run a program (posix_spawn, clone3 refused)
            return float(subprocess.run(["true"]).returncode == 0)
        if kind == "fill":               # 1 MiB at a time into files of at most 2 MiB, until a write fails
            total, n = 0, 0
            chunk = b"x" * (1 << 20)
            try:
                while total < (1 << 30):
                    with open(f"fill{n}", "wb") as f:
                        for _ in range(2):
                            f.write(chunk)
                            f.flush()
                            total += len(chunk)
                    n += 1
            except OSError as e:
                return total / (1 << 20) if e.errno == errno.ENOSPC else -float(e.errno)
            return -1.0
        if kind == "hidden":             # deleted files held open still take space
            held, total = [], 0
            try:
                while total < (1 << 30):
                    f = open(f"h{len(held)}", "wb")
                    os.unlink(f.name)
                    held.append(f)
                    f.write(b"y" * (2 << 20))
                    f.flush()
                    total += 2 << 20
            except OSError as e:
                return total / (1 << 20) if e.errno == errno.ENOSPC else -float(e.errno)
            return -1.0
        if kind == "kill":
            os.kill(int(arg), signal.SIGKILL)
            return 1.0
        if kind == "print":
            print("printed by the reward", end="")  # no newline, no flush
            sys.stderr.write("and to stderr")
            return 1.0
        return 0.0
    """
)


def escapes(tmp_path: Path, **sandbox) -> RewardScorer:
    path = tmp_path / "escapes.py"
    path.write_text(ESCAPES)
    return RewardScorer(parse_task_config({"name": "arithmetic", "reward": {
        "custom": f"{path}:score", "isolation": "process", "format_weight": 0.0, "timeout_s": 30.0,
        "sandbox": {"cpu_seconds": 20, **sandbox}}}))


def failed(scorer: RewardScorer, completion: str, message: str) -> None:
    assert scorer.score(completion, ROW) == RewardResult(0.0, {}), f"{completion} succeeded"
    assert message in scorer.recent_failures[-1][1], scorer.recent_failures[-1]


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the reward calls clone by its x86_64 number")
def test_no_namespace_of_any_kind(tmp_path):
    """Finding: a reward created a user namespace (clone(CLONE_NEWUSER)), although namespaces
    were said to be denied: unshare and setns were, clone's flags were not."""
    with escapes(tmp_path) as scorer:
        failed(scorer, "clone", "PermissionError")
        failed(scorer, "clone_net", "PermissionError")
        failed(scorer, "clone3", "OSError(38")  # ENOSYS: the C library falls back to clone, which checks the flags
        assert scorer.score("unshare", ROW) == RewardResult(0.0, {"custom": 0.0})
        assert scorer.score("spawn", ROW) == RewardResult(1.0, {"custom": 1.0})  # running programs still works
        assert "no namespaces" in scorer.confinement


def test_a_call_s_files_are_bounded_in_all(tmp_path):
    """Finding: file_size_mb bounded each file, not their total: one call wrote 360 MB in 1.7 s
    into the shared temporary filesystem. The sandbox's directory is a tmpfs of disk_mb."""
    why = private_mount_refused(tmp_path)
    if why:
        pytest.skip(f"this kernel or container allows no mount namespace here ({why}); the log says so")
    with escapes(tmp_path, disk_mb=8, file_size_mb=2) as scorer:
        assert "8 MiB in all (a private tmpfs)" in scorer.confinement, scorer.confinement
        for kind in ("fill", "hidden", "fill"):  # the next call starts with its budget again
            written = scorer.score(kind, ROW).total
            assert 4 <= written <= 8, (kind, written)  # the output file and the call's directory share the 8 MiB


def private_mount_refused(tmp_path: Path) -> str:
    """'' where this user may mount a private tmpfs (what the supervisor does), else why not."""
    from stabledrl.common.sandbox.supervisor import private_directory

    probe = tmp_path / "probe"
    probe.mkdir()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(write, private_directory(str(probe), 1).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as f:
        outcome = f.read()
    return "" if outcome == "tmpfs" else outcome


def test_the_supervisor_and_the_worker_are_out_of_a_reward_s_reach(tmp_path):
    """The reward cannot kill its supervisor (which would stop the final reaping) nor the worker:
    Landlock's scope where the kernel has it, and the seccomp filter in any case."""
    with escapes(tmp_path) as scorer:
        failed(scorer, f"kill {scorer._child.proc.pid}", "PermissionError")
        failed(scorer, f"kill {os.getpid()}", "PermissionError")
        assert scorer._child.proc.poll() is None


def test_the_seccomp_filter_keeps_signals_from_the_pids_it_guards():
    """Without Landlock's signal scope (kernels before 6.12) the filter is what keeps a reward of
    the job's own user from the supervisor: kill, tgkill, pidfd_open aimed at a guarded pid, at its
    group or at every process (-1) fail with EPERM; other pids are not affected."""
    import ctypes
    import json
    import signal

    guarded, other = subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sleep", "60"])
    libc = ctypes.CDLL(None, use_errno=True)
    attempts = {
        "kill": lambda: os.kill(guarded.pid, signal.SIGKILL),
        "kill its group": lambda: os.kill(-guarded.pid, 0),
        "kill every process": lambda: os.kill(-1, 0),  # signal 0: harmless were it let through
        "pidfd_open": lambda: os.pidfd_open(guarded.pid),
        "tgkill": lambda: libc.syscall(234, guarded.pid, guarded.pid, signal.SIGKILL) == -1 and (
            _ for _ in ()).throw(PermissionError()),
        "another pid": lambda: os.kill(other.pid, signal.SIGKILL),
    }
    read, write = os.pipe()
    try:
        pid = os.fork()
        if pid == 0:
            outcome = {}
            try:
                confine.deny_syscalls(allow_network=False, protect=[guarded.pid], protect_everyone=True)
                for name, attempt in attempts.items():
                    try:
                        attempt()
                        outcome[name] = "allowed"
                    except PermissionError:
                        outcome[name] = "denied"
            finally:
                os.write(write, json.dumps(outcome).encode())
                os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        outcome = json.loads(os.read(read, 4096))
        assert outcome == {"kill": "denied", "kill its group": "denied", "kill every process": "denied",
                           "pidfd_open": "denied", "tgkill": "denied", "another pid": "allowed"}, outcome
        assert guarded.poll() is None
        assert other.wait(timeout=10) == -signal.SIGKILL
    finally:
        os.close(read)
        for proc in (guarded, other):
            proc.kill()
            proc.wait()


def test_what_a_reward_prints_reaches_the_log_unflushed(tmp_path, capfd):
    """Finding: a reward's print() was lost: a call ends with os._exit, which does not flush."""
    with escapes(tmp_path) as scorer:
        assert scorer.score("print", ROW) == RewardResult(1.0, {"custom": 1.0})
    err = capfd.readouterr().err
    assert "printed by the reward" in err and "and to stderr" in err, err[-2000:]


def test_a_batch_at_the_longest_timeout_overflows_no_timer(tmp_path):
    """Probing around the timeout bound: a batched call's limit is timeout_s times its completions,
    and 4 x 1e6 s overflowed poll() (OverflowError in the worker). The wait is capped at the bound."""
    path = tmp_path / "batched.py"
    path.write_text("def score(prompts, completions, **columns):\n    return [1.0] * len(completions)\n")
    cfg = parse_task_config({"name": "arithmetic", "reward": {"custom": f"{path}:score", "isolation": "process",
                                                               "format_weight": 0.0, "timeout_s": 1e6}})
    with RewardScorer(cfg) as scorer:
        assert scorer.batched
        assert scorer.score_batch(["2"] * 4, [ROW] * 4) == [RewardResult(1.0, {"custom": 1.0})] * 4
