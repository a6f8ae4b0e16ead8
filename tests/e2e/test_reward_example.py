"""docs/rewards.md's runnable example, as its page says to run it: `stabledrl train --config
docs/examples/rewards/job.yaml` from the repository root, on CPU with the tiny model. Its three
functions (TRL's batched form, one returning None where it does not apply, the per-completion form)
score every completion in the sandbox, each logged as rollout/reward/<name>, and the held-out
evaluation runs before and after training."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import warm_workers  # tests/helpers, on the path: tests/conftest.py

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def test_the_reward_example_trains_through_stabledrl_train(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "stabledrl", "train", "--config", "docs/examples/rewards/job.yaml",
           f"run.output_dir={out}", "run.save_final_checkpoint=false", "run.export_final=false"]
    env = {**warm_workers.job_env(), "OMP_NUM_THREADS": "1"}  # its workers forked warm
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    assert "reward sandbox: reward" in log and "examples/rewards/rewards.py (sha256" in log
    assert "step 2/2:" in log and "held-out accuracy:" in log  # the progress line of a log file, the result
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "rollout/reward_mean" in r]
    assert len(steps) == 2
    for record in steps:
        assert {"rollout/reward/exact", "rollout/reward/brevity", "rollout/reward/custom"} <= set(record)
        assert record["rollout/reward_calls/failed"] == 0 and record["rollout/reward_calls/calls"] > 0
        assert record["rollout/reward_mean"] <= 1.5 + 1e-9  # exact + 0.5 x hard_words, brevity <= 0
    assert sum("eval/pass@1" in r for r in records) == 2  # before and after training, judged by the reward
