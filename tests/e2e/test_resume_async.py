"""η = 1 with in-order batches (algorithm.in_order): the asynchronous run is a function of
(config, seed). Batch b is exactly prompts 4b .. 4b+3 and each is sampled with the weights of
version max(0, b - 1), whatever the timing; so

- the run scales its rollout workers while it trains (`stabledrl scale` through the job's control
  actor: 2 -> 3 workers, the new one joining the weight broadcast group (gloo: NCCL's code path)
  and contributing, then -> 1, the group rebuilt each time),
- and a second run resumed from its step-4 checkpoint, with 2 workers throughout, repeats steps
  5-8 exactly: the same samples, losses, weights, and the same staleness (1 at every step, the
  buffered groups of the checkpoint trained at the age they had).

`stabledrl scale` itself runs as a subprocess against a control actor: it asks, prints the job's
status, and refuses a size outside rollout.min_workers .. max_workers or a job that is not there.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from stabledrl.cli.scale import scale  # noqa: E402
from stabledrl.coordinator.runtime.control import start_control  # noqa: E402
from stabledrl.coordinator.driver import Driver  # noqa: E402
from harness import DETERMINISTIC, job_config, recording_learner, recording_rollout, run_driver, wait_until  # noqa: E402

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
NAME = "async-elastic"


def config(out):
    """Weights by gloo broadcast, the code path of NCCL: a worker that joins or leaves rebuilds the group."""
    return job_config(out, task={"source": {"kind": "generated", "n": 64}},
                      algorithm={"max_staleness": 1, "in_order": True}, learner={"num_ranks": 1},
                      rollout={"num_workers": 2, "max_workers": 3}, weights={"backend": "gloo", "timeout_s": 120},
                      run={"steps": 8, "checkpoint_every": 4, "name": NAME})


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
    out, records = tmp_path_factory.mktemp("async"), tmp_path_factory.mktemp("async_records")
    learner = recording_learner(records, gates={1: records / "requested", 3: records / "worker2_up"})
    driver = Driver(config(out), rollout_cls=recording_rollout(records), learner_cls=learner,
                    record_batches=True)
    events: dict = {}
    driver.setup()
    thread = threading.Thread(target=operator, args=(driver, records, events), daemon=True)
    thread.start()
    try:
        driver.train()
        driver.drain()
        weights = ray.get([a.weights.remote() for a in driver.actors.learners], timeout=120)[0]
    finally:
        driver.close()
    thread.join(timeout=10)
    return driver, weights, events, out, learner


def test_workers_scale_out_and_in_while_the_job_runs(elastic_run):
    driver, _, events, _, _ = elastic_run
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


def test_a_resumed_async_run_repeats_the_uninterrupted_one(elastic_run, tmp_path):
    straight, straight_weights, _, out, learner = elastic_run
    cfg = config(tmp_path)
    cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"resume_from": out / "checkpoints"})})
    resumed, weights, _ = run_driver(cfg, recording_rollout(tmp_path), recording_learner(tmp_path))
    assert [r["version"] for r in resumed.history] == [5.0, 6.0, 7.0, 8.0]
    ids = lambda batch: [x.sample_id for e in batch for x in e.group.samples]  # noqa: E731
    for got, want in zip(resumed.batches, straight.batches[4:]):
        assert ids(got) == ids(want)
    # how many rollouts were back when a step's record was written depends on timing at η = 1 (the
    # admitted next batch may still be sampling); the totals after the final drain do not
    timed = ("rollout/reward_calls/calls", "rollout/reward_calls/failed")
    for got, want in zip(resumed.history, straight.history[4:]):
        for key in DETERMINISTIC:
            if key not in timed:
                assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-9), (got["version"], key)
    assert resumed.snapshot().reward_calls == straight.snapshot().reward_calls
    assert resumed.history[0]["staleness/mean"] == 1.0  # the checkpoint's buffered groups kept their age
    for name, value in straight_weights.items():
        torch.testing.assert_close(weights[name], value, rtol=1e-6, atol=1e-7)


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
