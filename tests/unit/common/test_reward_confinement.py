"""The reward sandbox limits what a reward can take: each hostile reward below is contained, counted
under its kind, and the sandbox (the same process) goes on scoring the next call correctly.

Landlock-dependent cases are skipped where the kernel offers no Landlock; the fallback (as root:
user nobody) has its own test. A run whose reward fails too often stops with a named error."""
from __future__ import annotations

import os
import socket
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from stabledrl.common.config.base import ConfigError
from stabledrl.common.config.task import parse_task_config
from stabledrl.common.sandbox.scorer import RewardScorer
from stabledrl.common.tasks import RewardResult, Row, build_task
from stabledrl.common.tasks.build import check_custom_reward
from stabledrl.common.sandbox.confine import landlock_abi
from stabledrl.common.sandbox.scorer import RewardFailureRate, check_failure_rate

ROW = Row("p", "1+1=", "2")
OK = RewardResult(total=1.0, parts={"custom": 1.0})
HOSTILE = textwrap.dedent(
    """
    import os, resource, signal, socket, sys, time

    def score(completion, row):
        kind, _, arg = completion.partition(" ")
        if kind == "alloc":                      # 20 GB
            block = bytearray(20 * 2**30)
            return float(len(block))
        if kind == "spin":
            while True:
                pass
        if kind == "sleep":
            time.sleep(600)
        if kind == "exit":
            os._exit(3)
        if kind == "fork":                       # a sleeper in its own session, double-forked
            r, w = os.pipe()
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    os.write(w, str(os.getpid()).encode())
                    time.sleep(600)
                os._exit(0)
            return float(os.read(r, 32))
        if kind == "read":
            return float(len(open(arg).read()))
        if kind == "write":
            with open(arg, "w") as f:
                f.write("pwned")
            return 1.0
        if kind == "scratch":                    # its own directory is writable, and private
            with open("scratch.txt", "w") as f:
                f.write(os.getcwd())
            return float(open("scratch.txt").read() == os.getcwd() and not os.path.exists(arg))
        if kind == "connect":
            socket.create_connection(("127.0.0.1", int(arg)), timeout=5)
            return 1.0
        if kind == "kill":
            os.kill(int(arg), signal.SIGKILL)
            return 1.0
        if kind == "unlimit":
            resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            return 1.0
        if kind == "chmod":                      # metadata outside its directory
            os.chmod(arg, 0o777)
            return 1.0
        if kind == "setuid":
            os.chmod(arg, 0o4755)
            return 1.0
        if kind == "chown":
            os.chown(arg, 65534, 65534)
            return 1.0
        if kind == "utime":
            os.utime(arg, (0, 0))
            return 1.0
        if kind == "xattr":
            os.setxattr(arg, "user.pwned", b"1")
            return 1.0
        if kind == "link":                       # a hard link into its own directory, then written through
            os.link(arg, "linked")
            with open("linked", "a") as f:
                f.write("pwned")
            return 1.0
        if kind == "rename":
            os.rename(arg, "moved")
            return 1.0
        if kind == "mknod":                      # /dev/mem's numbers
            os.mknod("mem", 0o600 | 0o20000, os.makedev(1, 1))
            return 1.0
        if kind == "unix":                       # a Unix socket such as Ray's raylet
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).connect(arg)
            return 1.0
        if kind == "udp":
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", int(arg)))
            return 1.0
        if kind == "chain":                      # N processes, each in a session of its own, each alive
            import shutil, subprocess
            depth, marker, *hold = arg.split()
            os.symlink(shutil.which("sleep"), marker)  # exec'd through this name: the test finds them by it
            with open("chain.sh", "w") as f:
                f.write('printf x >&"$2"\\nif [ "$1" -gt 1 ]; then setsid sh ./chain.sh $(($1 - 1)) "$2" "$3" & fi\\n'
                        'exec "./$3" 600\\n')
            r, w = os.pipe()
            subprocess.Popen(["setsid", "sh", "./chain.sh", depth, str(w), marker], pass_fds=(w,))
            os.close(w)
            got = 0
            while got < int(depth):
                got += len(os.read(r, 4096))
            if hold:                             # then past its timeout
                time.sleep(600)
            return float(got)
        if kind == "print":
            sys.stdout.write("p" * int(arg))
            sys.stderr.write("e" * int(arg))
            return 1.0
        if kind == "huge":
            return float(arg)
        if kind == "env":
            return float("STABLEDRL_TEST_SECRET" in os.environ)
        if kind == "forge":                      # a forged answer on every descriptor it can reach
            import pickle, struct
            for payload in (b'["ready", {"notes": []}]', pickle.dumps(os.system)):
                for fd in range(3, 64):
                    try:
                        os.write(fd, struct.pack("!i", len(payload)) + payload)
                    except OSError:
                        pass
            time.sleep(600)
        return 1.0 if kind == row.answer else 0.0
    """
)
needs_landlock = pytest.mark.skipif(not landlock_abi()[0], reason="no Landlock here: " + landlock_abi()[1])


@pytest.fixture()
def reward_file(tmp_path):
    path = tmp_path / "hostile.py"
    path.write_text(HOSTILE)
    return path


def config(reward_file: Path, timeout_s: float = 4.0, **sandbox):
    return parse_task_config({"name": "arithmetic", "reward": {
        "custom": f"{reward_file}:score", "isolation": "process", "format_weight": 0.0, "timeout_s": timeout_s,
        "sandbox": {"cpu_seconds": 1, "memory_mb": 1024, **sandbox}}})


@pytest.fixture()
def scorer(reward_file):
    with RewardScorer(config(reward_file)) as s:
        yield s


def contained(scorer: RewardScorer, completion: str, kind: str, message: str = "") -> None:
    """The call fails as ``kind`` (message contains ``message``), scores 0, and the same sandbox
    process then scores a right answer right."""
    pid = scorer._child.proc.pid
    before = getattr(scorer.stats, kind)
    assert scorer.score(completion, ROW) == RewardResult(0.0, {})
    assert getattr(scorer.stats, kind) == before + 1, scorer.recent_failures
    assert message in scorer.recent_failures[-1][1]
    assert scorer.score("2", ROW) == OK and scorer._child.proc.pid == pid


def test_memory_time_and_exit_are_contained(scorer):
    contained(scorer, "forge", "crash", "malformed")  # what reaches the worker is checked, never unpickled
    contained(scorer, "alloc", "limit", "memory_mb = 1024")
    contained(scorer, "sleep", "timeout", "no answer in 4.0s")
    contained(scorer, "exit", "crash", "exit code 3")
    contained(scorer, "unlimit", "exception", "ValueError")  # a lowered hard limit cannot be raised again
    assert scorer.stats.calls == 10 and scorer.stats.ok == 5 and scorer.stats.failed == 5


def test_cpu_time_is_limited_before_the_wall_clock_timeout(reward_file):
    with RewardScorer(config(reward_file, timeout_s=120.0)) as scorer:  # a loaded machine may give it little CPU
        t0 = time.monotonic()
        contained(scorer, "spin", "limit", "cpu_seconds = 1")
        assert time.monotonic() - t0 < 120.0


def test_a_forked_child_does_not_outlive_the_call(scorer):
    result = scorer.score("fork", ROW)
    sleeper = int(result.total)  # the reward's grandchild, in a session of its own
    assert sleeper > 1
    deadline = time.monotonic() + 5
    while Path(f"/proc/{sleeper}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{sleeper}").exists(), "the reward's forked sleeper survived the call"
    assert scorer.score("2", ROW) == OK


def test_the_worker_environment_is_withheld(reward_file, monkeypatch):
    monkeypatch.setenv("STABLEDRL_TEST_SECRET", "token")
    with RewardScorer(config(reward_file)) as scorer:
        assert scorer.score("env", ROW).total == 0.0
    with RewardScorer(config(reward_file, pass_env=["STABLEDRL_TEST_SECRET"])) as scorer:
        assert scorer.score("env", ROW).total == 1.0


@needs_landlock
def test_files_outside_its_directory_cannot_be_read_or_written(scorer, tmp_path):
    contained(scorer, "read /etc/passwd", "exception", "PermissionError")
    outside = tmp_path / "written_by_reward"
    contained(scorer, f"write {outside}", "exception", "PermissionError")
    assert not outside.exists()
    project_file = Path(__file__).resolve().parents[3] / "PWNED_BY_REWARD"
    contained(scorer, f"write {project_file}", "exception", "PermissionError")
    assert not project_file.exists()
    victim = tmp_path / "victim.txt"
    victim.write_text("hello")
    contained(scorer, f"link {victim}", "exception", "OSError(18")  # Landlock: no link that would gain rights
    contained(scorer, f"rename {victim}", "exception", "Error(")  # Landlock, or its directory's own tmpfs (EXDEV)
    contained(scorer, "mknod", "exception", "PermissionError")  # no capabilities
    assert victim.read_text() == "hello"
    assert scorer.score(f"scratch {tmp_path / 'scratch.txt'}", ROW) == OK  # its own directory works
    assert "Landlock ABI" in scorer.confinement


@needs_landlock
def test_no_network_and_no_signals_outside_the_sandbox(scorer, reward_file):
    if landlock_abi()[0] < 6:
        pytest.skip("TCP and signal confinement need Landlock ABI >= 6")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        contained(scorer, f"connect {server.getsockname()[1]}", "exception", "PermissionError")
        with RewardScorer(config(reward_file, allow_network=True)) as open_scorer:
            assert open_scorer.score(f"connect {server.getsockname()[1]}", ROW) == OK
    contained(scorer, f"kill {os.getpid()}", "exception", "PermissionError")  # the worker
    contained(scorer, f"kill {scorer._child.proc.pid}", "exception", "PermissionError")  # the sandbox itself


@pytest.mark.skipif(os.geteuid() != 0, reason="the fallback without Landlock drops root to nobody")
def test_without_landlock_root_rewards_run_as_nobody(tmp_path):
    shared = Path(tempfile.mkdtemp(prefix="stabledrl-test-"))  # readable by nobody, unlike pytest's tmp_path
    try:
        shared.chmod(0o755)
        reward = shared / "hostile.py"
        reward.write_text(HOSTILE)
        secret = tmp_path / "root_only.txt"
        secret.write_text("secret")
        secret.chmod(0o600)
        with RewardScorer(config(reward, landlock=False)) as scorer:
            assert "running as nobody" in scorer.confinement and "no Landlock" in scorer.confinement
            contained(scorer, f"read {secret}", "exception", "PermissionError")
            contained(scorer, f"write {shared / 'x.txt'}", "exception", "PermissionError")
            contained(scorer, "alloc", "limit")
    finally:
        for p in shared.iterdir():
            p.unlink()
        shared.rmdir()


def refused(spec: str, match: str, **reward) -> None:
    """The spec is refused at config load (check_custom_reward) and where it is imported."""
    cfg = parse_task_config({"name": "arithmetic", "reward": {"custom": spec, "isolation": "inline", **reward}})
    with pytest.raises(ConfigError, match=match):
        check_custom_reward(cfg.reward)
    with pytest.raises(ConfigError, match=match):
        RewardScorer(cfg)


def test_reward_files_others_could_change_are_refused(reward_file, tmp_path, monkeypatch):
    """Findings: a file in sticky /tmp, a group-writable file, a symlink in a world-writable
    directory, a file under a 777 grandparent, os:system, a file outside allowed_roots."""
    reward_file.chmod(0o646)
    refused(f"{reward_file}:score", rf"task.reward.custom: {reward_file} is writable by every user")
    reward_file.chmod(0o664)
    refused(f"{reward_file}:score", "is writable by its group .* chmod go-w")
    reward_file.chmod(0o644)
    check_custom_reward(parse_task_config({"name": "arithmetic", "reward": {"custom": f"{reward_file}:score"}}).reward)
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)  # like /tmp
    (sticky / "r.py").write_text(HOSTILE)
    refused(f"{sticky / 'r.py'}:score", f"the directory {sticky} on its path is writable by others")
    shared = tmp_path / "shared"
    (shared / "mine").mkdir(parents=True)
    (shared / "mine" / "r.py").write_text(HOSTILE)
    (shared / "link.py").symlink_to(reward_file)
    shared.chmod(0o777)  # the grandparent of mine/r.py, the parent of link.py
    try:
        refused(f"{shared / 'mine' / 'r.py'}:score", f"the directory {shared} on its path is writable by others")
        refused(f"{shared / 'link.py'}:score", f"goes through the symlink {shared / 'link.py'}")
    finally:
        shared.chmod(0o755)
    refused(f"{reward_file}:score", "is not under task.reward.allowed_roots", allowed_roots=[str(shared)])
    with pytest.raises(ConfigError, match=r"task.reward.custom: 'os' is a module of Python's standard"):
        parse_task_config({"name": "arithmetic", "reward": {"custom": "os:system"}})
    with pytest.raises(ConfigError, match="not a reward"):
        parse_task_config({"name": "arithmetic", "reward": {"custom": "subprocess:run"}})


def test_a_reward_in_rays_unpacked_working_dir_is_accepted(reward_file, tmp_path):
    """`ray job submit --working-dir .` unpacks the job's files under RAY_TMPDIR/session_*/
    runtime_resources/working_dir_files, which Ray makes writable by every user: that one directory
    is accepted (with a warning), a 777 directory of any other name still is not, and the package
    directory below it and the file itself are still checked."""
    unpacked = tmp_path / "ray" / "session_x" / "runtime_resources" / "working_dir_files"
    package = unpacked / "_ray_pkg_0123" / "tests"
    package.mkdir(parents=True)
    (package / "r.py").write_text(reward_file.read_text())
    elsewhere = tmp_path / "ray" / "session_x" / "runtime_resources" / "other_files" / "p"
    elsewhere.mkdir(parents=True)
    (elsewhere / "r.py").write_text(reward_file.read_text())
    for directory in (unpacked, *unpacked.parents[:3], elsewhere.parent):  # Ray's own: 777
        directory.chmod(0o777)
    try:
        task = parse_task_config({"name": "arithmetic", "reward": {"custom": f"{package / 'r.py'}:score"}})
        check_custom_reward(task.reward)
        refused(f"{elsewhere / 'r.py'}:score", f"the directory {elsewhere.parent} on its path is writable by others")
        package.chmod(0o777)
        refused(f"{package / 'r.py'}:score", f"the directory {package} on its path is writable by others")
    finally:
        for directory in (package, unpacked, *unpacked.parents[:3], elsewhere.parent):
            directory.chmod(0o755)


def test_a_relative_reward_file_is_the_working_directory_s_and_checked_at_load(tmp_path, monkeypatch):
    """Finding: 'rp/ok.py:score' passed --dry-run, then the sandbox resolved it against its own
    temporary directory. It is made absolute at config load and checked there."""
    (tmp_path / "rp").mkdir()
    (tmp_path / "rp" / "ok.py").write_text("def score(completion, row):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)
    cfg = parse_task_config({"name": "arithmetic", "reward": {"custom": "rp/ok.py:score", "isolation": "process",
                                                               "format_weight": 0.0}})
    assert cfg.reward.custom == f"{tmp_path / 'rp' / 'ok.py'}:score"
    check_custom_reward(cfg.reward)
    with RewardScorer(cfg) as scorer:
        assert scorer.score("2", ROW).total == 1.0
    missing = parse_task_config({"name": "arithmetic", "reward": {"custom": "rp/missing.py:score"}})
    with pytest.raises(ConfigError, match=r"task.reward.custom: .*rp/missing.py does not exist .* working directory"):
        check_custom_reward(missing.reward)


def test_a_run_whose_reward_fails_too_often_stops_naming_it():
    cfg = parse_task_config(
        {
            "name": "arithmetic",
            "reward": {"custom": "/rewards/r.py:score", "max_failed_fraction": 0.5, "failure_check_after": 64},
        }
    )
    counts = {"reward_calls/calls": 63.0, "reward_calls/failed": 32.0, "reward_calls/exception": 32.0}
    check_failure_rate(counts, cfg)  # too few calls to judge (and 32 failures of 64 would not be too many)
    counts = {"reward_calls/calls": 100.0, "reward_calls/failed": 50.0, "reward_calls/timeout": 50.0}
    check_failure_rate(counts, cfg)  # exactly the fraction: still running
    counts = {"reward_calls/calls": 256.0, "reward_calls/failed": 256.0, "reward_calls/exception": 200.0,
              "reward_calls/limit": 56.0}
    with pytest.raises(
        RewardFailureRate,
        match=r"custom reward /rewards/r.py:score failed on 256 of 256 calls "
        r"\(200 exception, 56 limit\), more than task.reward.max_failed_fraction = 0.5",
    ):
        check_failure_rate(counts, cfg)
    never = cfg.model_copy(update={"reward": cfg.reward.model_copy(update={"max_failed_fraction": 1.0})})
    check_failure_rate(counts, never)


def test_held_out_evaluation_scores_through_the_same_sandbox(tmp_path):
    """stabledrl.rollout.evaluate with the worker's scorer: rewards that exit or allocate 20 GB count as wrong
    and as scoring failures; the evaluation finishes and the sandbox survives."""
    from stabledrl.rollout.evaluate import evaluate
    from tests.unit.rollout.test_evaluate import SAMPLER, TOK, OracleEngine, arithmetic

    reward = tmp_path / "eval_reward.py"
    reward.write_text(textwrap.dedent("""
        import os

        def score(completion, row):
            kind = int(row.answer) % 3
            if kind == 0:
                os._exit(3)
            if kind == 1:
                return float(len(bytearray(20 * 2**30)))
            return float(completion.strip() == row.answer)
        """))
    rows = arithmetic(12).train[:6]
    expected = [int(int(r.answer) % 3 == 2) * 2 for r in rows]
    cfg = config(reward)
    task = build_task(cfg)  # the worker's task: its checker is the custom reward
    with RewardScorer(cfg) as scorer:
        pid = scorer._child.proc.pid
        engine = OracleEngine(task, rows, lambda row, seed: row.answer)
        result = evaluate(engine, rows, task, TOK, SAMPLER, samples_per_prompt=2, seed=1, scorer=scorer)
        assert result.correct == expected
        assert result.scoring_failures == 2 * sum(1 for c in expected if c == 0) > 0
        assert scorer.stats.crash + scorer.stats.limit == result.scoring_failures and scorer._child.proc.pid == pid


def test_metadata_outside_its_directory_cannot_change(scorer, tmp_path):
    """Finding: chmod, the setuid bit, utime and setxattr succeeded on root-owned files (Landlock
    does not cover metadata): the seccomp filter denies them all."""
    victim = tmp_path / "binary"
    victim.write_text("#!/bin/sh\n")
    victim.chmod(0o755)
    before = victim.stat()
    for kind in ("chmod", "setuid", "chown", "utime", "xattr"):
        contained(scorer, f"{kind} {victim}", "exception", "PermissionError")
    contained(scorer, f"chmod {tmp_path}", "exception", "PermissionError")  # its parent directory too
    after = victim.stat()
    assert (after.st_mode, after.st_uid, after.st_mtime_ns) == (before.st_mode, before.st_uid, before.st_mtime_ns)
    assert os.listxattr(victim) == [] and stat_mode(tmp_path) == 0o700
    assert "seccomp: no file metadata changes" in scorer.confinement


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o7777


def test_no_unix_or_udp_sockets(scorer, reward_file, tmp_path):
    """Finding: Ray's Unix sockets (raylet, plasma_store) were reachable and UDP worked."""
    with socket.socket(socket.AF_UNIX) as raylet, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        raylet.bind(str(tmp_path / "raylet"))
        os.chmod(tmp_path / "raylet", 0o777)
        raylet.listen()
        raylet.setblocking(False)
        udp.bind(("127.0.0.1", 0))
        udp.setblocking(False)
        contained(scorer, f"unix {tmp_path / 'raylet'}", "exception", "PermissionError")
        contained(scorer, f"udp {udp.getsockname()[1]}", "exception", "PermissionError")
        with RewardScorer(config(reward_file, allow_network=True)) as open_scorer:  # IPv4 allowed, Unix still not
            assert open_scorer.score(f"udp {udp.getsockname()[1]}", ROW) == OK
            assert open_scorer.score(f"unix {tmp_path / 'raylet'}", ROW) == RewardResult(0.0, {})
        with pytest.raises(BlockingIOError):
            raylet.accept()
        assert udp.recv(16) == b"x"  # the allowed one only
        with pytest.raises(BlockingIOError):
            udp.recv(16)


def chain(marker: str) -> list[str]:
    """The pids of processes named ``marker``."""
    found = []
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() == marker:
                found.append(comm.parent.name)
        except OSError:
            pass
    return found


def test_a_deep_chain_of_sessions_is_reaped(reward_file):
    """Finding: 250 processes, each level in its own session, escaped a reaper that gave up after
    100 rounds. With Landlock's signal scope the call's warden kills them all at once (kill(-1)
    inside the call's domain), after an answer and after a timeout; else the reaper goes on round
    after round until none is left. A process outside the sandbox is untouched."""
    import subprocess

    marker = f"rwchain{os.getpid() % 100000}"
    outside = subprocess.Popen(["sleep", "60"])
    try:
        with RewardScorer(config(reward_file, timeout_s=30.0)) as scorer:
            t0 = time.monotonic()
            assert scorer.score(f"chain 250 {marker}", ROW) == RewardResult(250.0, {"custom": 250.0})
            assert time.monotonic() - t0 < 30
            assert chain(marker) == [], "processes of the chain outlived the call"
            assert scorer.score("2", ROW) == OK
        with RewardScorer(config(reward_file, timeout_s=3.0)) as scorer:
            contained(scorer, f"chain 20 {marker} hold", "timeout", "no answer in 3.0s")
            assert chain(marker) == [], "processes of the chain outlived the call's timeout"
        assert outside.poll() is None
    finally:
        outside.kill()
        outside.wait()


def test_reward_output_is_bounded_in_the_log(reward_file, capfd):
    """Finding: a reward printing 2 MB per call filled the inherited worker log until every write
    failed (OSError 27). Output goes to a file per call; the log gets bounded copies."""
    with RewardScorer(config(reward_file)) as scorer:
        for _ in range(3):
            assert scorer.score("print 2000000", ROW) == RewardResult(1.0, {"custom": 1.0})
        err = capfd.readouterr().err
    assert "reward output of call 1:" in err and "more bytes not shown" in err
    assert len(err) < 16_000, len(err)


def imported(tmp_path: Path, source: str, **reward) -> RewardScorer:
    path = tmp_path / "module_level.py"
    path.write_text(textwrap.dedent(source))
    return RewardScorer(parse_task_config({"name": "arithmetic", "reward": {
        "custom": f"{path}:score", "isolation": "process", **reward}}))


def test_a_thread_started_at_import_is_refused_naming_the_file(tmp_path):
    """Finding: a thread started at import spun the sandbox at 50% CPU for the whole job."""
    with pytest.raises(ConfigError, match=rf"custom reward {tmp_path}/module_level.py: its module-level code left 1 "
                                          "thread"):
        imported(tmp_path, """
            import threading
            threading.Thread(target=lambda: [None for _ in iter(int, 1)], daemon=True).start()
            def score(completion, row):
                return 1.0
            """)


def test_a_hang_at_import_fails_fast_naming_the_file(tmp_path):
    """Finding: a hang at import failed the job after 174 s as 'rollout worker 1 (model load)'."""
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=rf"importing custom reward {tmp_path}/module_level.py took longer than "
                                          r"task.reward.import_timeout_s = 1 s"):
        imported(tmp_path, """
            while True:
                pass
            """, import_timeout_s=1)
    assert time.monotonic() - t0 < 10


def test_huge_finite_rewards_are_failures(tmp_path, reward_file):
    """Finding: rewards of 1e300 and 3e38 passed silently and made the loss NaN."""
    cfg = config(reward_file)
    with RewardScorer(cfg) as scorer:
        for value in ("1e300", "3e38", "-2e6"):
            contained(scorer, f"huge {value}", "out_of_range", "beyond ±task.reward.max_abs = 1e+06")
        assert scorer.score("huge 999999", ROW).total == 999999.0
    inline = parse_task_config(
        {"name": "arithmetic", "reward": {"custom": f"{reward_file}:score", "isolation": "inline", "max_abs": 10}}
    )
    with RewardScorer(inline) as scorer:
        assert scorer.score("huge 11", ROW) == RewardResult(0.0, {}) and scorer.stats.out_of_range == 1
        assert scorer.stats.failed == 1
    counts = {"reward_calls/calls": 64.0, "reward_calls/failed": 64.0, "reward_calls/out_of_range": 64.0}
    with pytest.raises(RewardFailureRate, match=r"\(64 out_of_range\)"):
        check_failure_rate(counts, cfg)


def test_timeouts_stop_the_job_as_soon_as_the_verdict_is_certain(reward_file):
    """Finding: a reward taking its whole timeout on every call never tripped the stop: timeouts
    are failures, and the stop comes once failures alone exceed the fraction of
    failure_check_after (33 calls of 5 s, not 64)."""
    cfg = parse_task_config({"name": "arithmetic", "reward": {"custom": f"{reward_file}:score", "timeout_s": 5}})
    check_failure_rate({"reward_calls/calls": 32.0, "reward_calls/failed": 32.0, "reward_calls/timeout": 32.0}, cfg)
    with pytest.raises(RewardFailureRate, match=r"failed on 33 of 33 calls \(33 timeout\)"):
        check_failure_rate({"reward_calls/calls": 33.0, "reward_calls/failed": 33.0, "reward_calls/timeout": 33.0}, cfg)


def test_directories_of_killed_jobs_are_removed_at_the_next_start(tmp_path):
    """Finding: SIGKILL of the job left /tmp/stabledrl-reward-* behind."""
    import subprocess

    from stabledrl.common.sandbox.scorer import WORKDIR_PREFIX, remove_stale_workdirs

    dead = subprocess.Popen(["true"])
    dead.wait()
    stale, live, other = (tmp_path / f"{WORKDIR_PREFIX}{dead.pid}-x1", tmp_path / f"{WORKDIR_PREFIX}{os.getpid()}-x2",
                          tmp_path / "unrelated-1-x")
    for d in (stale, live, other):
        (d / "call1-a").mkdir(parents=True)
    handed = tmp_path / f"{WORKDIR_PREFIX}{dead.pid}-x3"  # as root without Landlock: handed to nobody
    if os.geteuid() == 0:
        (handed / "call1-a").mkdir(parents=True)
        os.chown(handed, 65534, 65534)
    removed = remove_stale_workdirs(tmp_path)
    assert sorted(removed) == sorted([stale, handed] if os.geteuid() == 0 else [stale])
    assert not stale.exists() and not handed.exists() and live.exists() and other.exists()


def test_code_left_running_in_the_sandbox_itself_is_stopped(tmp_path):
    """Probing around the import finding: a module can leave code that runs in the sandbox itself
    outside any call (an audit hook cannot be removed). The sandbox's own CPU time is checked at
    every answer: past its allowance the call fails as a crash naming the cause, and the sandbox
    ends (the next call starts a fresh one)."""
    with imported(tmp_path, """
            import os, sys, time
            SANDBOX = os.getpid()

            def burn(event, args):
                if event == "os.fork" and os.getpid() == SANDBOX:  # the sandbox forks every call
                    end = time.process_time() + 3
                    while time.process_time() < end:
                        pass

            sys.addaudithook(burn)

            def score(completion, row):
                return 1.0
            """, format_weight=0.0, timeout_s=60) as scorer:
        first = scorer._child
        assert scorer.score("2", ROW) == RewardResult(0.0, {})
        assert scorer.stats.crash == 1 and "the reward sandbox itself used" in scorer.recent_failures[-1][1]
        first.proc.wait(timeout=10)
