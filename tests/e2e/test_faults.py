"""Faults on real Ray actors and DeepSpeed (CPU): nothing lost, nothing counted twice, nothing
changed by a fault, and a resume that continues exactly.

One uninterrupted run is the reference (η = 0, 4 steps of 4 groups over 8 prompts: step 2 ends an
epoch; a checkpoint after step 2; the samples of prompt uid 9 carry a NaN behaviour estimate; the
data file has 3 bad rows, skipped and counted, and the reward function raises or returns a
non-number on some completions, isolated and counted).
A second run with the same config suffers two faults:

1. rollout worker 1 SIGKILLs its own process in the middle of its third request: its two requests
   are re-queued, a replacement starts (and, worker 0 holding back, takes work of its own);
2. learner rank 1 SIGKILLs itself as step 4 starts: the job fails fast, naming that rank.

``stabledrl train --resume RUN_DIR`` then continues from the step-2 checkpoint (an epoch
boundary). Steps 1-3 of the faulty run and steps 3-4 of the resumed one equal the reference, to
the sample ids each learner rank trained on (and so do steps 3-4 resumed from the reference's own
checkpoint at another shape: 1 learner rank at ZeRO-3, 1 rollout worker, to fp32 rounding); step 3
(the NaN) is skipped, counted, and leaves the weights bit-identical. A worker that keeps dying fails
the job after rollout.max_restarts, named (model-free stub actors: only the coordinator's logic and
real process deaths are under test); a learner rank that stalls in a collective makes the others
time out, and the stalled one is named.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from collections import Counter

import pytest
import torch

ray = pytest.importorskip("ray")

import stabledrl.cli.main as cli  # noqa: E402
from stabledrl.common.config.job import load_job_config  # noqa: E402
from stabledrl.common.metrics import read_metrics  # noqa: E402
from stabledrl.coordinator.runtime.actors import ActorFailure  # noqa: E402
from stabledrl.coordinator.driver import Driver  # noqa: E402
import harness  # noqa: E402
from harness import DETERMINISTIC, job_config, read_records, recording_learner, recording_rollout, run_driver  # noqa: E402

pytestmark = pytest.mark.e2e
NAN_UID = 9  # the second prompt of batch 3 (uids 8..11): step 3 sees a NaN ratio


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return harness.bad_rows_task(tmp_path_factory.mktemp("data"))


def config(out, task):
    return job_config(out, task=task, run={"steps": 4, "checkpoint_every": 2})


@pytest.fixture(scope="module")
def reference(cluster, task, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    records = tmp_path_factory.mktemp("reference_records")
    driver, weights, _ = run_driver(config(out, task), recording_rollout(records, nan_uids=frozenset({NAN_UID})),
                                 recording_learner(records), export=True)
    return driver, weights, records, out


@pytest.fixture(scope="module")
def faulty(cluster, task, tmp_path_factory):
    """The faulty run, then its resume through `stabledrl train --resume`'s config resolution."""
    out = tmp_path_factory.mktemp("faulty")
    records = tmp_path_factory.mktemp("faulty_records")
    rollout = recording_rollout(records, nan_uids=frozenset({NAN_UID}), die_on_call=3, die_index=1, hold_index=0)
    driver = Driver(
        config(out, task),
        rollout_cls=rollout,
        learner_cls=recording_learner(records, die_rank=1, die_version=3),
        record_batches=True,
    )
    driver.setup()
    try:
        with pytest.raises(ActorFailure) as failure:
            driver.train()
        failed_at = time.time()
    finally:
        driver.close()
    args = argparse.Namespace(resume=str(out), config=str(cli.QUICKSTART), overrides=[])
    resumed_cfg = load_job_config(*cli.resume_source(args))
    (records / "resumed").mkdir()
    resumed, weights, _ = run_driver(resumed_cfg, recording_rollout(records / "resumed", nan_uids=frozenset({NAN_UID})),
                                  recording_learner(records / "resumed"))
    return driver, failure.value, failed_at, resumed, weights, records, out


def by_version(records, rank=None):
    out = {}
    for r in records:
        if rank is None or r["rank"] == rank:
            out.setdefault(r["version"], []).append(r)
    return out


def test_a_killed_rollout_worker_is_replaced_and_its_prompts_requeued(faulty):
    driver, _, _, _, _, records, _ = faulty
    calls = read_records(records, "rollout_")
    pids = {c["pid"] for c in calls if c["worker"] == 1}
    assert len(pids) == 2, "worker 1's first process died and a second one took its index"
    first, second = sorted(pids, key=lambda p: min(i for i, c in enumerate(calls) if c["pid"] == p))
    assert sum(c["pid"] == second for c in calls) >= 1, "the replacement contributed"
    last = driver.history[-1]
    assert last["faults/rollout_worker_deaths"] == 1 and last["faults/rollout_workers_replaced"] == 1
    # the two requests the dead process held were sampled again, by someone, and trained once
    lost = [c["uids"][0] for c in calls if c["pid"] == first][2:]  # its third request died with it
    trained = Counter((e.uid, x.index) for batch in driver.batches for e in batch for x in e.group.samples)
    assert len(trained) == 3 * 16 and set(trained.values()) == {1}
    uids = sorted(e.uid for batch in driver.batches for e in batch)
    assert uids == list(range(12)), "steps 1-3 trained on every admitted prompt exactly once"
    assert all(u in uids for u in lost)


def test_a_dead_learner_rank_fails_fast_naming_it(faulty):
    _, failure, failed_at, _, _, records, _ = faulty
    message = str(failure)
    assert "learner rank 1 (step 4) died" in message, message
    assert "stabledrl train --resume" in message
    assert failed_at - (records / "learner_died").stat().st_mtime < 60  # dist_timeout_s is 120


def test_faults_change_nothing_and_resume_continues_exactly(reference, faulty):
    ref_driver, ref_weights, ref_records, _ = reference
    driver, _, _, resumed, weights, records, out = faulty
    assert [r["version"] for r in driver.history] == [1.0, 2.0, 3.0]
    assert [r["version"] for r in resumed.history] == [3.0, 4.0]
    for got, want in zip(driver.history + resumed.history, ref_driver.history[:3] + ref_driver.history[2:]):
        for key in DETERMINISTIC:
            a, b = got[key], want[key]
            assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-6, abs=1e-9), (got["version"], key)
    for name, value in ref_weights.items():
        torch.testing.assert_close(weights[name], value, rtol=1e-6, atol=1e-7)
    # what each learner rank trained on, step by step: the same samples, each once
    ref = by_version(read_records(ref_records, "learner_"))
    before = by_version(read_records(records, "learner_"))  # the faulty run: steps 1-3 (versions 0-2)
    after = by_version(read_records(records / "resumed", "learner_"))  # the resumed run: steps 3-4
    assert sorted(before) == [0, 1, 2] and sorted(after) == [2, 3]
    for version, run in [*before.items(), *after.items()]:
        want = sorted(s for r in ref[version] for s in r["sample_ids"])
        assert sorted(s for r in run for s in r["sample_ids"]) == want, version
        assert len(want) == len(set(want)) == 16  # 4 groups of 4, each sample once over both ranks
    # the resume started at an epoch boundary: step 3 draws epoch 1's first prompts
    assert resumed.history[0]["version"] == 3.0 and ref_driver.snapshot().cursor.epoch == 1
    # metrics.jsonl of the run directory: every step once, the resumed steps replacing the lost ones
    steps = [r["step"] for r in read_metrics(out / "metrics.jsonl") if "train/loss" in r]
    assert steps == [1, 2, 3, 4]


def test_the_export_carries_the_jobs_sealed_config(reference):
    """`stabledrl eval --model RUN/final_model` needs no --config: the export holds the job's
    config, sealed like RUN/config.yaml."""
    from stabledrl.common.trust.seal import EXPORT_CONFIG, text_is_sealed

    out = reference[3]
    carried = (out / "final_model" / EXPORT_CONFIG).read_text()
    assert text_is_sealed(carried) and carried == (out / "config.yaml").read_text()


def test_a_resume_on_another_learner_shape_and_fleet_continues_the_run(reference, tmp_path, job_log):
    """`stabledrl train --resume RUN learner.num_ranks=1 learner.deepspeed.zero_stage=3
    rollout.num_workers=1` from the reference's step-2 checkpoint (written by 2 ranks, ZeRO-2, 2
    workers): steps 3-4 train the same samples at the same versions, with the same data cursor;
    metrics and final weights equal the reference's to fp32 rounding (1 rank sums the gradients
    in another order than 2: the only difference; learner/reshard.py moves the state bit for bit)."""
    ref_driver, ref_weights, ref_records, out = reference
    run = tmp_path / "run"
    shutil.copytree(out, run)
    for tag in (run / "checkpoints").glob("step*"):
        if tag.name != "step2":
            shutil.rmtree(tag)
    (run / "checkpoints" / "latest").write_text("step2")
    args = argparse.Namespace(resume=str(run), config=str(cli.QUICKSTART), overrides=[
        "learner.num_ranks=1", "learner.deepspeed.zero_stage=3", "rollout.num_workers=1"])
    cfg = load_job_config(*cli.resume_source(args))
    lines = job_log
    driver = Driver(cfg, rollout_cls=recording_rollout(tmp_path, nan_uids=frozenset({NAN_UID})),
                    learner_cls=recording_learner(tmp_path), record_batches=True)
    driver.setup()
    try:
        assert len(driver.actors.learners) == 1 and len(driver.active_rollouts()) == 1
        driver.train()
        driver.drain()
        weights = ray.get(driver.actors.learners[0].weights.remote(), timeout=120)
    finally:
        driver.close()
    assert any("re-sharded: written by 2 learner ranks (ZeRO-2), loaded into 1 (ZeRO-3)" in line for line in lines), (
        lines
    )
    assert [r["version"] for r in driver.history] == [3.0, 4.0]
    for got, want in zip(driver.history, ref_driver.history[2:]):
        for key in DETERMINISTIC:
            a, b = got[key], want[key]
            assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-5, abs=1e-8), (got["version"], key)
    for name, value in ref_weights.items():
        torch.testing.assert_close(weights[name], value, rtol=1e-5, atol=1e-6)
    ref, after = by_version(read_records(ref_records, "learner_")), by_version(read_records(tmp_path, "learner_"))
    assert sorted(after) == [2, 3]
    for version, records in after.items():
        assert sorted(s for r in records for s in r["sample_ids"]) == sorted(
            s for r in ref[version] for s in r["sample_ids"]
        )
    assert driver.snapshot().cursor == ref_driver.snapshot().cursor


def test_a_nan_step_is_skipped_counted_and_leaves_the_weights_untouched(reference):
    driver, _, records, _ = reference
    step3 = driver.history[2]
    assert step3["train/skipped"] == 1.0 and math.isnan(step3["train/loss"])
    assert [r["train/skipped_total"] for r in driver.history] == [0.0, 0.0, 1.0, 1.0]
    learner = by_version(read_records(records, "learner_"), rank=0)
    assert learner[2][0]["checksum"] == learner[1][0]["checksum"]  # bit-identical after the skipped step
    assert learner[3][0]["checksum"] != learner[2][0]["checksum"]  # and training goes on


def test_bad_rows_and_failing_rewards_are_counted_in_the_metrics(reference):
    driver, _, _, out = reference
    data = read_metrics(out / "metrics.jsonl")[0]
    assert data["step"] == 0 and data["data/rows_read"] == 11 and data["data/rows_kept"] == 8
    assert sum(v for k, v in data.items() if k.startswith("data/skipped/")) == 3
    assert data["data/skipped/too_long"] == 1
    last = driver.history[-1]
    assert last["rollout/reward_calls/calls"] == 4 * 16  # every sample trained on was scored once
    assert last["rollout/reward_calls/exception"] > 0 and last["rollout/reward_calls/non_number"] > 0
    assert (
        last["rollout/reward_calls/failed"]
        == last["rollout/reward_calls/exception"] + last["rollout/reward_calls/non_number"]
    )


def test_the_export_is_the_familys_released_layout_and_gives_the_learners_logits(reference):
    """(that LLaDA's own code loads this layout: tests/unit/common/test_family_exports.py)"""
    from stabledrl.common.config.model import ModelConfig
    from stabledrl.common.models import load_policy

    driver, weights, _, out = reference
    assert json.loads((out / "final_model" / "config.json").read_text())["model_type"] == "llada"
    exported, _ = load_policy(ModelConfig(path=out / "final_model"))
    policy, _ = load_policy(driver.cfg.model)
    policy.load_state_dict(weights, strict=False)
    ids = torch.randint(3, policy.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    everything = torch.ones(2, 1, 9, 9, dtype=torch.bool)  # bidirectional: a diffusion LM attends both ways
    with torch.no_grad():
        want = policy(ids, attention_mask=everything).logits
        got = exported(ids, attention_mask=everything).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (out / "final_model" / "model.safetensors").is_file()


class StubLearner:
    """A learner rank that only starts: the job below fails before its first step."""

    def __init__(self, rank, world_size, *args, **kwargs):
        self.rank = rank

    def rendezvous_address(self):
        return "127.0.0.1", 0

    def start(self, addr, port):
        return {"rank": self.rank, "device": "cpu", "dtype": "torch.float32", "start_s": 0.0}

    def setup_weight_push(self, cfg, **kwargs):
        return None


class DyingRollout:
    """A rollout worker (no model: it starts in a moment) whose process dies on every request."""

    def __init__(self, index, *args, **kwargs):
        self.index = index

    def ready(self):
        import os

        return {"worker": self.index, "device": "cpu", "pid": os.getpid(), "load_s": 0.0, "parameters": 1,
                "node_id": ray.get_runtime_context().get_node_id(), "version": 0}

    def setup_weight_push(self, cfg, **kwargs):
        return None

    def close(self):
        return None

    def generate(self, requests):
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def test_a_worker_that_keeps_dying_fails_the_job_naming_it(cluster, tmp_path, job_log):
    cfg = job_config(tmp_path / "run", learner={"num_ranks": 1}, rollout={"num_workers": 2, "max_restarts": 2},
                     run={"steps": 2})
    lines = job_log
    driver = Driver(cfg, rollout_cls=DyingRollout, learner_cls=StubLearner)
    driver.setup()
    try:
        with pytest.raises(ActorFailure, match=r"rollout worker \d died 3 times, the last time: .*; giving up "
                                               r"\(rollout.max_restarts = 2\)"):
            driver.train()
    finally:
        driver.close()
    replaced = [line for line in lines if "re-queued; replacement" in line]
    snap = driver.snapshot()
    assert len(replaced) >= 2 and snap.counts["faults/rollout_workers_replaced"] == len(replaced)
    # none delivered, none lost: every admitted prompt is still owed
    assert snap.outstanding == tuple(range(snap.next_uid)) and not snap.delivered


def test_a_stalled_learner_rank_makes_its_peers_time_out_naming_it(cluster, tmp_path):
    from stabledrl.common.types import Group, Sample
    from stabledrl.coordinator.runtime.actors import wait
    from stabledrl.learner.worker import LearnerWorker

    class StallingLearner(LearnerWorker):
        def train(self, groups, version, group_offset):
            if self.rank == 1:
                time.sleep(60)  # alive, but never joins the step's collectives in time
            return super().train(groups, version, group_offset)

    cfg = job_config(tmp_path, learner={"num_ranks": 2, "dist_timeout_s": 3})
    a = cfg.algorithm
    ranks = [ray.remote(num_cpus=0.5)(StallingLearner).remote(
        r, 2, cfg.model, cfg.learner, cfg.estimator, cfg.loss, inner_iterations=1, advantage_scale=a.advantage_scale,
        micro_batch_size=a.micro_batch_size) for r in range(2)]
    try:
        addr, port = ray.get(ranks[0].rendezvous_address.remote(), timeout=120)
        ray.get([r.start.remote(addr, port) for r in ranks], timeout=240)
        group = lambda k: Group(f"p{k}", [Sample(  # noqa: E731
            sample_id=f"p{k}/{i}", prompt_id=f"p{k}", index=i, prompt_ids=torch.tensor([5, 6, 7]),
            completion_ids=torch.tensor([8, 9, 10, 11]), completion_length=4, reward=float(i), behaviour_logp=-3.0,
            estimator="block_random", mask_seed=100 * k + i) for i in range(4)])
        refs = [ranks[r].train.remote([group(r)], 0, r) for r in range(2)]
        t0 = time.perf_counter()
        with pytest.raises(ActorFailure) as info:
            wait(refs, 120, ["learner rank 0 (step 1)", "learner rank 1 (step 1)"])
        assert time.perf_counter() - t0 < 60  # the collective's own timeout (3 s), not the caller's (120 s)
        message = str(info.value)
        assert message.startswith("learner rank 0 (step 1) failed")
        assert "learner rank 0 of 2" in message and "learner.dist_timeout_s = 3 s" in message
        assert message.endswith("(still running: learner rank 1 (step 1))")  # the stalled peer, named
    finally:
        for r in ranks:
            ray.kill(r)


def test_records_are_read_in_the_order_they_were_written(tmp_path):
    """A replacement process's pid can sort before the one it replaced as a string (10023 < 9923)."""
    harness.append(tmp_path / "rollout_9923.jsonl", {"pid": 9923, "t": 1.0})
    harness.append(tmp_path / "rollout_10023.jsonl", {"pid": 10023, "t": 2.0})
    assert [r["pid"] for r in read_records(tmp_path, "rollout_")] == [9923, 10023]
