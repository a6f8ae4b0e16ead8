"""The system benchmark's tiny mode: the shipped LLaDA-8B config through ``stabledrl train`` with the
tiny LLaDA in the released sharded layout, 2 gloo learner ranks and 1 rollout worker on the CPU,
3 steps with a checkpoint after step 2 and held-out evaluations, then ``train --resume`` to step 3
(the code path of the GPU run, tests/benchmarks/run_system.py). The report must have every field,
each actor's busy seconds plus idle must equal its wall time, and the resume must continue from
the checkpoint."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.e2e


def test_tiny_system_benchmark_reports_every_actor_and_resumes(tmp_path):
    run = lambda *args: subprocess.run([sys.executable, *map(str, args)], cwd=HERE.parents[1], timeout=600,  # noqa: E731
                                       capture_output=True, text=True)
    matmul = run(HERE / "bench_matmul.py", "--tiny", "--reps", "3", "--out", tmp_path / "matmul.json")
    assert matmul.returncode == 0, matmul.stdout[-2000:]
    out = tmp_path / "system.json"
    done = run(HERE / "bench_system.py", "--tiny", "--config", "deploy/configs/llada8b_1node.yaml", "--ranks", "2",
               "--workers", "1", "--steps", "3", "--skip", "1", "--checkpoint-at", "2", "--eval-prompts", "2",
               "--resume-check", "--profile-step", "2", "--peak-from", tmp_path / "matmul.json",
               "--work", tmp_path / "work", "--out", out)
    data = json.loads(out.read_text())
    assert done.returncode == 0 and not data["errors"], done.stdout[-3000:]
    job = data["parts"]["job"]
    assert job["rc"] == 0 and job["problems"] == [], job["log_tail"]
    f = job["figures"]
    assert f["steps"] == 3 and f["timed_steps"] == [2, 3]
    assert set(f["actors"]) == {"learner0", "learner1", "rollout0"}
    for name, actor in f["actors"].items():
        activities = {"train", "push"} if name.startswith("learner") else {"generate", "score", "reward"}
        assert activities <= set(actor["seconds"]) and 0 < actor["busy_fraction"] <= 1
    assert f["actors"]["learner0"]["seconds"]["checkpoint"] > 0  # the save after step 2, timed in step 3
    assert 0 < f["learner_mfu"] < 1 and f["learner_mfu_against_tflops"] > 0
    assert f["rollout_tokens_per_s_generating"] > 0 and f["samples_per_s"] > 0 and f["first_step_s"] > 0
    assert f["step_after_checkpoint_ratio"] > 0
    assert [s["step"] for s in f["per_step"]] == [1, 2, 3]
    profile = job["learner_profile"][0]  # learner rank 0's 2nd step under torch.profiler
    assert profile["step"] == 2 and profile["wall_s"] > 0 and profile["top_host_ops"]
    assert profile["forwards_profiled"] == 1 <= profile["forwards_in_step"]  # a window, not the whole step
    resume = data["parts"]["resume_check"]
    assert resume == {"resumed_at_step": 2, "expected": 2, "last_step": 3, "continued": True}
    assert data["parts"]["resume"]["problems"] == []
    assert not (tmp_path / "work" / "run" / "checkpoints").exists()  # removed after the check (large at 8B)
