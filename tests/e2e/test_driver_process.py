"""``stabledrl train`` as an operator runs it, as a subprocess on the tiny job: killed with SIGKILL,
interrupted with Ctrl-C, or given a reward that always fails. Nothing of the job outlives its
driver, a Ctrl-C leaves one line and the resume command, a failing reward stops the job naming
it; while it runs, no listener the project opens is on every interface. ``train --resume`` refuses
a checkpoint whose pickle would run a command, before any actor starts."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import warm_workers  # tests/helpers, on the path: tests/conftest.py

from stabledrl.coordinator.runtime.watchdog import descendants

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
STABLEDRL = [sys.executable, "-m", "stabledrl"]
WILDCARD = re.compile(r"^(0\.0\.0\.0|\*|\[::\]|::):\d+$")


# what the signal and reward tests need of the job: one learner rank and one rollout worker (the
# SIGKILL test keeps the tiny job's two of each: every process of a larger job must go)
ONE_EACH = ("learner.num_ranks=1", "rollout.num_workers=1")


def start(tmp_path: Path, *overrides: str, warm: bool = False) -> tuple[subprocess.Popen, Path]:
    """The job as an operator starts it; ``warm``: its Ray workers forked from the tests' warm process
    (warm_workers.py). A warm worker is not the driver's descendant, but the client the raylet started
    for it is, and a client ends only once its worker has ended: a worker that outlives the job shows
    as its client outliving it. The SIGKILL test starts cold, to name the learner's own process."""
    log = tmp_path / "job.log"
    cmd = [*STABLEDRL, "train", "--config", "tests/e2e/tiny_job.yaml", f"run.output_dir={tmp_path / 'run'}",
           "run.steps=200", "run.progress=false", *overrides]
    env = {**(warm_workers.job_env() if warm else os.environ), "OMP_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return proc, log


def wait_for(log: Path, pattern: str, proc: subprocess.Popen, timeout_s: float = 400) -> None:
    deadline = time.monotonic() + timeout_s
    while not re.search(pattern, log.read_text()):
        assert proc.poll() is None, f"the job ended early:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {pattern!r} in {timeout_s} s:\n{log.read_text()[-3000:]}"
        time.sleep(0.5)


def alive(processes: dict[int, int]) -> list[str]:
    """The noted processes (pid: start time) still running as themselves, with their command."""
    out = []
    for pid, start in processes.items():
        try:
            stat = Path(f"/proc/{pid}/stat").read_bytes()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        if int(fields[19]) == start and fields[0] != b"Z":
            out.append(f"{pid} {cmd}")
    return out


def left_after(processes: dict[int, int], seconds: float) -> list[str]:
    """The noted processes still running ``seconds`` from now (polled: an empty answer as soon as
    every one has ended)."""
    deadline = time.monotonic() + seconds
    while (left := alive(processes)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def listeners(pid: int) -> list[str]:
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    return [line.split()[3] for line in out.splitlines() if f"pid={pid}," in line]


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_sigkill_of_the_driver_leaves_no_process_of_the_job_and_no_listener_on_every_interface(tmp_path):
    proc, log = start(tmp_path, "run.checkpoint_every=1")
    try:
        wait_for(log, r"checkpoint: .*step1\b", proc)
        job = descendants(proc.pid)
        names = " ".join(command(p) for p in job)
        assert "raylet" in names and "LearnerWorker" in names and "DashboardAgent" in names, names
        learners = [p for p in job if "ray::LearnerWorker" in command(p)]
        found = {p: listeners(p) for p in learners}
        # each learner process: Ray's own core-worker server (Ray 2.60 binds it to every interface,
        # deploy/README.md) and nothing else there; rank 0's two stores and gloo on the node's address
        assert all(sum(bool(WILDCARD.match(a)) for a in addresses) <= 1 for addresses in found.values()), found
        assert max(sum(not WILDCARD.match(a) for a in addresses) for addresses in found.values()) >= 2, found
    finally:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert left_after(job, 10) == [], "processes of the job outlived its driver by 10 s"


def test_ctrl_c_ends_with_one_line_and_the_resume_command(tmp_path):
    proc, log = start(tmp_path, "run.checkpoint_every=1", *ONE_EACH, warm=True)
    try:
        wait_for(log, r"checkpoint: .*step2\b", proc)
        job = descendants(proc.pid)
        before = len(log.read_text())
        proc.send_signal(signal.SIGINT)
        assert proc.wait(120) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    after = log.read_text()[before:]
    lines = [line for line in after.splitlines() if line.startswith("stabledrl:")]
    assert "Traceback" not in after and len(lines) == 1, after
    run = tmp_path / "run"
    assert re.fullmatch(rf"stabledrl: interrupted at step (\d+) of 200; continue with: stabledrl train --resume {run} "
                        r"\(from step(\d+)\)", lines[0]), lines[0]
    assert left_after(job, 10) == []


def test_sigterm_ends_with_one_line_and_the_resume_command(tmp_path):
    """Finding: SIGTERM (a scheduler's, `kill`'s) printed Ray's stack dump, or nothing, instead of the
    resume hint Ctrl-C gives."""
    proc, log = start(tmp_path, "run.checkpoint_every=1", *ONE_EACH, warm=True)
    try:
        wait_for(log, r"checkpoint: .*step2\b", proc)  # step1's is complete by then (latest)
        job = descendants(proc.pid)
        before = len(log.read_text())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    after = log.read_text()[before:]
    lines = [line for line in after.splitlines() if line.startswith("stabledrl:")]
    assert "Traceback" not in after and len(lines) == 1, after
    assert re.fullmatch(rf"stabledrl: stopped by SIGTERM at step (\d+) of 200; continue with: stabledrl train "
                        rf"--resume {tmp_path / 'run'} \(from step(\d+)\)", lines[0]), lines[0]
    assert left_after(job, 10) == []


def test_a_reward_that_times_out_in_the_first_evaluation_stops_the_job(tmp_path):
    """Finding: a reward timing out on every call held the job in its step-0 held-out evaluation
    (which runs with eval.every=0 too), silent: the failure-rate stop covered training only."""
    reward = tmp_path / "slow_reward.py"
    reward.write_text("import time\n\ndef score(completion, row):\n    time.sleep(60)\n    return 1.0\n")
    # the tiny job's 8 held-out prompts: more than half of failure_check_after = 8 fail, the verdict is certain
    proc, log = start(tmp_path, f"task.reward.custom={reward}:score", "task.reward.isolation=process",
                      "task.reward.timeout_s=0.2", "task.reward.failure_check_after=8", "eval.every=0", *ONE_EACH,
                      warm=True)
    try:
        assert proc.wait(600) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert re.search(
        rf"stabledrl: job failed: held-out evaluation at step 0: custom reward {reward}:score failed on (\d+) of "
        r"\1 calls \(\1 timeout\), more than task.reward.max_failed_fraction = 0.5", text), text[-3000:]
    assert "train/loss" not in (tmp_path / "run" / "metrics.jsonl").read_text()  # it never trained


def test_a_reward_that_always_fails_stops_the_job_naming_it(tmp_path):
    reward = tmp_path / "broken_reward.py"
    reward.write_text("def score(completion, row):\n    raise RuntimeError('broken reward')\n")
    proc, log = start(tmp_path, f"task.reward.custom={reward}:score", "task.reward.isolation=process",
                      "task.reward.failure_check_after=16", *ONE_EACH, warm=True)
    try:
        assert proc.wait(600) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert re.search(
        rf"stabledrl: job failed: custom reward {reward}:score failed on (\d+) of \1 calls \(\1 exception\), "
        r"more than task.reward.max_failed_fraction = 0.5: the job stops instead of training on zeros",
        text,
    ), text[-3000:]
    assert "reward sandbox: " in text  # how rewards are confined, said once


def test_train_resume_refuses_a_malicious_checkpoint_before_any_actor_starts(tmp_path):
    """``stabledrl train --resume`` on a run whose shard would run a command when unpickled."""
    import yaml

    sys.path.insert(0, str(ROOT / "tests" / "helpers"))
    # the unit test's tag with a manifest, importable here when its folder was not collected in this run
    sys.path.append(str(ROOT / "tests" / "unit" / "common"))
    from malicious_pickles import armed, write
    from test_checkpoint_loading import SHARD, job_tag

    from stabledrl.common.trust.checkpoint_files import STATE_FILE
    from stabledrl.common.trust.seal import sealed_text
    from stabledrl.coordinator.runtime.checkpoint import write_state

    run, marker = tmp_path / "run", tmp_path / "PWNED"
    config = yaml.safe_load((ROOT / "tests/e2e/tiny_job.yaml").read_text())
    config["run"]["output_dir"] = str(run)
    tag = job_tag(run)  # run/checkpoints/step1 with its manifest
    (run / "config.yaml").write_text(sealed_text(yaml.safe_dump(config)))  # as the job writes it (common/trust/seal.py)
    assert armed(write(tag / SHARD, "zip_os_system", marker), marker)
    write_state(tag, json.loads((tag / STATE_FILE).read_text()))  # the sizes match again
    proc = subprocess.run([*STABLEDRL, "train", "--resume", str(run)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"{tag / SHARD} would unpickle posix.system" in proc.stderr and "refused" in proc.stderr
    assert "actors:" not in proc.stdout and not marker.exists()
