"""η = 1 with in-order batches (algorithm.in_order): the asynchronous run is a function of
(config, seed). Batch b is exactly prompts 4b .. 4b+3 and each is sampled with the weights of
version max(0, b - 1), whatever the timing. One uninterrupted run (8 steps, a checkpoint after
every step, held-out evaluations before training, after every second step and after training)
scales its rollout workers while it trains (`stabledrl scale` through the job's control actor:
2 -> 3 workers, the new one joining the weight broadcast group (gloo: NCCL's code path) and
contributing, then -> 1, the group rebuilt each time). The same job with 1 worker is then stopped
twice, as a Ctrl-C stops it: once the checkpoint of step 1 is written, and, resumed, once the
checkpoint of step 2 is written (before that step's evaluation, which the second resume must
therefore run); resumed again, it runs to the end. So

- the twice-resumed run's metrics.jsonl reads as the uninterrupted run's: one record of the data
  at step 0, the held-out evaluations at the steps an uninterrupted run evaluates (each once),
  every step once. Finding: each resume appended another step-0 data record and an evaluation at
  its checkpoint's step;
- the last resume, from the step-2 checkpoint, repeats steps 3-8 exactly: the same samples,
  losses, weights, and the same staleness (1 at every step, the buffered groups of the checkpoint
  trained at the age they had).

`stabledrl scale` itself runs as a subprocess against a control actor: it asks, prints the job's
status, and refuses a size outside rollout.min_workers .. max_workers or a job that is not there.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

import stabledrl.cli.main as cli  # noqa: E402
from stabledrl.cli.scale import scale  # noqa: E402
from stabledrl.common.config.job import load_job_config  # noqa: E402
from stabledrl.common.metrics import read_metrics  # noqa: E402
from stabledrl.coordinator.runtime.control import start_control  # noqa: E402
from stabledrl.coordinator.driver import Driver  # noqa: E402
from harness import DETERMINISTIC, InspectedLearner, job_config, recording_learner, recording_rollout, wait_until  # noqa: E402
from job_lines import stop_at  # noqa: E402

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
NAME = "async-elastic"


def config(out, workers: int = 2):
    """Weights by gloo broadcast, the code path of NCCL: a worker that joins or leaves rebuilds the group.
    Checkpoints are written before the step goes on (not in the background), so that a stop at a
    checkpoint's line finds it complete."""
    return job_config(out, task={"held_out": 4, "source": {"kind": "generated", "n": 64}},
                      eval={"every": 2, "num_prompts": 4}, algorithm={"max_staleness": 1, "in_order": True},
                      learner={"num_ranks": 1}, rollout={"num_workers": workers, "max_workers": 3},
                      weights={"backend": "gloo", "timeout_s": 120},
                      run={"steps": 8, "checkpoint_every": 1, "async_checkpoint": False, "name": NAME})


class KeepingDriver(Driver):
    """``Driver.run`` as a job runs it, keeping rank 0's weights at the end, before the actors go
    (its learner class has ``weights``: harness.InspectedLearner)."""

    weights: dict = {}

    def finish_checkpoint(self, timeout_s: float) -> None:
        super().finish_checkpoint(timeout_s)
        self.weights = ray.get([a.weights.remote() for a in self.actors.learners], timeout=120)[0]


def operator(driver: Driver, records: Path, events: dict) -> None:
    """The user at the terminal: scale to 3 after step 1, wait until the new worker has trained
    samples in a batch, scale to 1. Gates hold the learner so each act lands mid-run."""
    if not wait_until(lambda: len(driver.history) >= 1, "step 1", events):
        return
    events["up"] = scale(NAME, 3)[0]
    (records / "requested").touch()  # step 2 may train now: its end applies the request
    fleet = driver.scheduler.fleet
    # up: with a broadcast push it then joins the group at the next push ("syncing" until then)
    if not wait_until(lambda: getattr(fleet.get(2), "state", None) in ("syncing", "active"), "worker 2 up", events):
        return
    (records / "worker2_up").touch()
    if not wait_until(
        lambda: any(e.worker == 2 for b in driver.batches for e in b), "a batch with worker 2's groups", events
    ):
        return
    events["down"] = scale(NAME, 1)[0]
    events["down_at_step"] = len(driver.history)


@pytest.fixture(scope="module")
def elastic_run(cluster, tmp_path_factory):
    """The uninterrupted run, scaled 2 -> 3 -> 1 workers while it trains."""
    out, records = tmp_path_factory.mktemp("async"), tmp_path_factory.mktemp("async_records")
    learner = recording_learner(records, gates={1: records / "requested", 3: records / "worker2_up"})
    driver = KeepingDriver(config(out), rollout_cls=recording_rollout(records), learner_cls=learner,
                           record_batches=True)
    events: dict = {}
    thread = threading.Thread(target=operator, args=(driver, records, events), daemon=True)
    thread.start()
    result = driver.run()
    thread.join(timeout=10)
    return driver, result, events, out


@pytest.fixture(scope="module")
def resumed_run(cluster, tmp_path_factory):
    """The same job with 1 worker, stopped at the checkpoints of steps 1 and 2 and resumed each
    time from its run directory as `stabledrl train --resume RUN_DIR` resumes it."""
    run = tmp_path_factory.mktemp("resumed")
    with stop_at(r"checkpoint: .*step1\b"), pytest.raises(KeyboardInterrupt):
        Driver(config(run, workers=1)).run()
    args = argparse.Namespace(resume=str(run), config=str(cli.QUICKSTART), overrides=[])
    with stop_at(r"checkpoint: .*step2\b"), pytest.raises(KeyboardInterrupt):
        Driver(load_job_config(*cli.resume_source(args))).run()
    driver = KeepingDriver(load_job_config(*cli.resume_source(args)), learner_cls=InspectedLearner,
                           record_batches=True)
    result = driver.run()
    return driver, result, run


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


def test_workers_scale_out_and_in_while_the_job_runs(elastic_run):
    driver, _, events, _ = elastic_run
    assert "error" not in events, events.get("error")
    assert "3 rollout workers requested" in events["up"] and "1 rollout workers requested" in events["down"]
    workers = [r["rollout/workers"] for r in driver.history]
    assert workers[0] == 2 and 3 in workers and workers[-1] == 1, workers
    last = driver.history[-1]
    assert last["elastic/workers_added"] == 1 and last["elastic/workers_retired"] == 2
    # the added worker loaded the current weights before its first request: its groups carry the
    # version the in-order schedule assigns, max(0, b - η), like everyone else's
    for b, batch in enumerate(driver.batches):
        assert {x.policy_version for e in batch for x in e.group.samples} == {max(0, b - 1)}
        assert [e.uid for e in batch] == list(range(4 * b, 4 * b + 4))
    assert [r["staleness/mean"] for r in driver.history] == [0.0] + [1.0] * 7


def test_a_resumed_runs_metrics_read_as_the_uninterrupted_runs(elastic_run, resumed_run):
    _, _, _, out = elastic_run
    _, result, run = resumed_run
    want = kinds(out / "metrics.jsonl")
    assert [s for s, _ in want] == [0, 0, 1, 2, 2, 3, 4, 4, 5, 6, 6, 7, 8, 8, 8], want
    assert kinds(run / "metrics.jsonl") == want
    assert result.before is not None and result.before.pass_at_1 == float(want[1][1].split()[1])


def test_a_resumed_async_run_repeats_the_uninterrupted_one(elastic_run, resumed_run):
    straight, _, _, _ = elastic_run
    resumed, _, _ = resumed_run
    assert [r["version"] for r in resumed.history] == [3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    ids = lambda batch: [x.sample_id for e in batch for x in e.group.samples]  # noqa: E731
    assert len(resumed.batches) == 6
    for got, want in zip(resumed.batches, straight.batches[2:]):
        assert ids(got) == ids(want)
    # how many rollouts were back when a step's record was written depends on timing at η = 1 (the
    # admitted next batch may still be sampling); the totals after the final drain do not
    timed = ("rollout/reward_calls/calls", "rollout/reward_calls/failed")
    for got, want in zip(resumed.history, straight.history[2:]):
        for key in DETERMINISTIC:
            if key not in timed:
                assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-9), (got["version"], key)
    assert resumed.snapshot().reward_calls == straight.snapshot().reward_calls
    assert resumed.history[0]["staleness/mean"] == 1.0  # the checkpoint's buffered groups kept their age
    assert straight.weights and resumed.weights.keys() == straight.weights.keys()
    for name, value in straight.weights.items():
        torch.testing.assert_close(resumed.weights[name], value, rtol=1e-6, atol=1e-7)


def test_stabledrl_scale_asks_a_running_job_and_refuses_what_it_cannot_do(cluster):
    control = start_control("cli-test", 1, 3)
    ray.get(control.poll.remote({"step": 5, "workers": 2}), timeout=60)
    gcs = ray.get_runtime_context().gcs_address

    def stabledrl_scale(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "stabledrl", "scale", "--address", gcs, *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=180, env=dict(os.environ))

    ok = stabledrl_scale("--job", "cli-test", "--workers", "3")
    assert ok.returncode == 0, ok.stderr
    assert "3 rollout workers requested (now 2)" in ok.stdout and "step 5" in ok.stdout
    assert ray.get(control.poll.remote({}), timeout=60) == 3  # the driver's next poll takes it
    bad = stabledrl_scale("--job", "cli-test", "--workers", "9")
    assert bad.returncode == 2 and "outside rollout.min_workers .. rollout.max_workers = 1 .. 3" in bad.stderr
    missing = stabledrl_scale("--job", "nope")
    assert missing.returncode == 2 and "no running stabledrl job named 'nope'" in missing.stderr
    assert "cli-test" in missing.stderr
    ray.kill(control)
