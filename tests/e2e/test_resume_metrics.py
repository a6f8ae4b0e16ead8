"""A resumed run's metrics.jsonl reads as the uninterrupted run's: one record of the data at step 0,
the held-out evaluations at the steps an uninterrupted run evaluates (each once), every step once.

The run (4 steps, a checkpoint after every step, held-out evaluations before training, after step 2
and after training) is stopped twice, as a Ctrl-C stops it: once the checkpoint of step 1 is written,
and, resumed, once the checkpoint of step 2 is written (before that step's evaluation, which the
second resume must therefore run). Finding: each resume appended another step-0 data record and an
evaluation at its checkpoint's step (steps 0,0,1,0,1,0,1,2,3,4,4,4 against 0,0,1,2,3,4,4,4)."""
from __future__ import annotations

import argparse

import pytest

ray = pytest.importorskip("ray")

import stabledrl.cli.main as cli  # noqa: E402
from stabledrl.common.config.job import load_job_config  # noqa: E402
from stabledrl.common.metrics import read_metrics  # noqa: E402
from stabledrl.coordinator.driver import Driver  # noqa: E402
import harness  # noqa: E402
from job_lines import stop_at  # noqa: E402

pytestmark = pytest.mark.e2e


def config(out):
    return harness.job_config(
        out, task={"held_out": 4, "source": {"kind": "generated", "n": 24}},
        eval={"every": 2, "num_prompts": 4}, rollout={"num_workers": 1}, learner={"num_ranks": 1},
        run={"steps": 4, "checkpoint_every": 1, "async_checkpoint": False})


def kinds(path) -> list[tuple[int, str]]:
    """(step, what) of every record of a metrics.jsonl."""
    def what(r: dict) -> str:
        if "train/loss" in r:
            return "step"
        if "eval/pass@1" in r:
            return f"eval {r['eval/pass@1']:.4f}"
        if any(k.startswith("data/") for k in r):
            return "data"
        return "totals" if "rollout/reward_calls/calls" in r else ",".join(sorted(r))
    return [(int(r["step"]), what(r)) for r in read_metrics(path)]


def test_a_resumed_runs_metrics_read_as_the_uninterrupted_runs(cluster, tmp_path):
    reference = tmp_path / "reference"
    Driver(config(reference)).run()
    want = kinds(reference / "metrics.jsonl")
    assert [s for s, _ in want] == [0, 0, 1, 2, 2, 3, 4, 4, 4], want

    run = tmp_path / "run"
    with stop_at(r"checkpoint: .*step1\b"), pytest.raises(KeyboardInterrupt):
        Driver(config(run)).run()
    for stop in (r"checkpoint: .*step2\b", None):
        args = argparse.Namespace(resume=str(run), config=str(cli.QUICKSTART), overrides=[])
        driver = Driver(load_job_config(*cli.resume_source(args)))
        if stop:
            with stop_at(stop), pytest.raises(KeyboardInterrupt):
                driver.run()
        else:
            result = driver.run()
    assert kinds(run / "metrics.jsonl") == want
    assert result.before is not None and result.before.pass_at_1 == float(want[1][1].split()[1])
