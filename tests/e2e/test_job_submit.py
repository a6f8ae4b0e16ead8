"""`ray job submit` of a short run to a Ray head this test starts (`ray start --head --block` on
loopback, free ports for everything, its own temp dir); the job must succeed and leave its metrics. The head is
stopped by signalling the process group the test started (never `ray stop`, which would stop
every Ray instance on the machine)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from stabledrl.common.config.model import ModelConfig
from stabledrl.common.models import load_policy

pytestmark = pytest.mark.e2e


def free_port() -> int:
    """A port free now, for `ray start` to bind (Ray binds its own ports: none can be handed to it
    bound, as the project's stores are; another binder may take it in between)."""
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def wait_for_job_server(url: str, head: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if head.poll() is not None:
            raise RuntimeError(f"ray start exited with {head.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/api/version", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"the job server at {url} did not answer within {timeout_s} s")


def session_members(sid: int) -> list[int]:
    """Processes of the session ``sid`` (the head and every process it started, whatever their group)."""
    out = subprocess.run(["ps", "-eo", "pid=,sid="], capture_output=True, text=True, check=True).stdout
    return [int(pid) for pid, s in (line.split() for line in out.splitlines()) if int(s) == sid]


def stop_head(proc: subprocess.Popen) -> None:
    """SIGTERM to the head's process group (a graceful `ray start --block` shutdown), then SIGKILL to
    whatever of its session is left after 5 s: only processes this test started, by their ids."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    for pid in session_members(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


@pytest.fixture
def head():
    temp_dir = tempfile.mkdtemp(prefix="sdray", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    # every port Ray would otherwise take at a fixed default is chosen free: another Ray instance on
    # the machine (another test, another user) must not collide with this head or its agents
    ports = {name: free_port() for name in ("port", "dashboard-port", "ray-client-server-port",
                                            "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                            "runtime-env-agent-port", "metrics-export-port")}
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "RAY_AUTH_MODE": "disabled"}
    log = open(Path(temp_dir) / "head.log", "w")
    proc = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1",
         "--include-dashboard=true", "--num-cpus=4", "--disable-usage-stats", f"--temp-dir={temp_dir}"]
        + [f"--{name}={port}" for name, port in ports.items()],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,  # its own session: pid = sid
    )
    url = f"http://127.0.0.1:{ports['dashboard-port']}"
    try:
        wait_for_job_server(url, proc, timeout_s=120)
        yield url, env
    finally:
        stop_head(proc)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_ray_job_submit_runs_a_short_job_to_success(head, tmp_path):
    url, env = head
    out_dir = tmp_path / "run"
    for _ in range(12):  # the job server answers before its agent registers (slow on a busy machine)
        result = subprocess.run(
            # one learner rank and one rollout worker: this test is about the submission path (the
            # multi-actor system is tested in test_system.py), and each actor costs seconds of start-up
            [str(ROOT / "deploy" / "submit.sh"), "tests/e2e/tiny_job.yaml", f"run.output_dir={out_dir}",
             "learner.num_ranks=1", "rollout.num_workers=1"],
            env={**env, "RAY_ADDRESS": url, "RAY": str(BIN / "ray")}, capture_output=True, text=True, timeout=300,
        )
        if "No available agent" not in result.stderr:
            break
        time.sleep(5)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "succeeded" in output
    assert "held-out accuracy:" in output
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "train/loss" in r] == [1, 2]
    assert (out_dir / "checkpoints" / "latest").read_text().strip() == "step2"
    policy, _ = load_policy(ModelConfig(path=out_dir / "final_model"))  # the exported policy loads back
    assert policy.spec.name == "llada"
