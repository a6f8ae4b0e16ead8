"""A job whose rollout workers pull the weights from the learner ranks' memory (``weights.backend:
peer``, common/transport/peer.py; on CPU actors each rank's buffer is a set of shared-memory
blocks) trains exactly as the same job pushing by gloo broadcast: ZeRO-3 over 2 ranks, each
offering its own partitions, 2 workers each reading both ranks' buffers, η = 1 with in-order
batches (a run that is a function of config and seed, whatever the timing and the fleet: the
broadcast job and the jobs that fall back to it run 1 worker) and the push staged beside the
workers' requests. Same metrics at every step, same final weights, bit for bit."""
from __future__ import annotations

import dataclasses
import time

import pytest

ray = pytest.importorskip("ray")

import harness  # noqa: E402
from test_colocate import assert_trained_alike, config, run  # noqa: E402

pytestmark = pytest.mark.e2e


# η = 1: how many rollouts had been scored when a step was recorded depends on how far the workers ran ahead
SCORED = ("rollout/reward_calls/calls", "rollout/reward_calls/failed")
JOB = {"learner": {"num_ranks": 2, "dist_timeout_s": 120, "optimizer": {"lr": 1e-2}, "deepspeed": {"zero_stage": 3}},
       "rollout": {"num_workers": 2}, "algorithm": {"max_staleness": 1, "in_order": True}}
ONE_WORKER = {**JOB, "rollout": {"num_workers": 1}}


@pytest.fixture(scope="module")
def broadcast(cluster, tmp_path_factory):
    """The job pushing by gloo broadcast, to 1 rollout worker."""
    return run(config(tmp_path_factory.mktemp("gloo"), False, "gloo", **ONE_WORKER), harness.InspectedRollout)


class RefusingRollout(harness.InspectedRollout):
    """A worker whose pull is refused, as CUDA IPC can be between processes in containers apart or
    GPUs without peer access."""

    def setup_weight_push(self, cfg, **kwargs):
        super().setup_weight_push(cfg, **kwargs)
        if cfg.backend == "peer":
            def refused(*args, **kwargs):
                raise RuntimeError("weight push (peer): could not map its learner rank's GPU memory (CUDA IPC: "
                                   "refused); set weights.backend to nccl")
            self.push._pull_shards = refused


class RefusingLearner(harness.InspectedLearner):
    """A learner rank that cannot export its partitions for the pull (CUDA IPC refused on its side)."""

    def setup_weight_push(self, cfg, **kwargs):
        super().setup_weight_push(cfg, **kwargs)
        if cfg.backend == "peer" and self.rank == 1 and self.push is not None:
            def refused(*args, **kwargs):
                raise RuntimeError("CUDA IPC: cannot export this rank's partitions")
            self.push.buffer.send_shards = refused


def test_a_jobs_record_reports_every_part_of_its_pushes_once_per_actor_and_as_time_push(broadcast):
    """The push's clocks (common/transport/clocks.py): each learner rank's parts and the wait its
    transport measured, each worker's staging and its wait, per actor, and ``time/push/<part>`` the
    slowest actor's."""
    history = broadcast["driver"].history
    timed = [r for r in history if "time/push/total" in r]
    assert timed, history[-1].keys()
    for part in ("pending", "send", "wait", "release", "stage", "stage_wait"):
        assert any(f"time/push/{part}" in r for r in timed), part
    for record in timed:
        for part in ("send", "wait"):
            keys = [f"time/learner{k}/push_{part}" for k in range(2)]
            ends = [record[key] for key in keys if key in record]
            assert ends and record[f"time/push/{part}"] == max(ends), (part, record)


def test_workers_pulling_from_zero3_ranks_train_exactly_as_the_broadcast(broadcast, tmp_path):
    pulled = run(config(tmp_path / "peer", False, "peer", **JOB), harness.InspectedRollout)
    assert [p["push_sources"] for p in pulled["before"][0]] == [2, 2]  # both ranks offer their partitions
    # every actor froze its set-up's heap, so a collection during a push is short (common/gil.py)
    assert all(p["frozen_objects"] > 10_000 for p in pulled["before"][0] + pulled["before"][1]), pulled["before"]
    staged = [r for r in pulled["driver"].history if r.get("time/rollout0/push_stage", 0) > 0 or
              r.get("time/rollout1/push_stage", 0) > 0]
    assert staged, "the workers staged the pulls beside their requests"
    assert_trained_alike(pulled, broadcast, timed=SCORED)


@pytest.mark.parametrize("refusing", ["worker", "rank"])
def test_a_pull_that_auto_chose_and_that_fails_falls_back_to_the_broadcast(broadcast, tmp_path, monkeypatch,
                                                                           refusing, job_log):
    """``auto`` builds the group over peer (here: the job's broadcast offered peer for one host, as
    auto does on GPUs); the rollout worker's pull is refused, or a learner rank cannot export its
    partitions. Every end (2 learner ranks, 1 worker) fails at once (not at its timeout), the push is
    made again over the broadcast, and the job trains exactly as the broadcast job, every later group
    broadcast too."""
    from stabledrl.coordinator.runtime import weight_sync

    def offered(inputs, one_host=False, peer_failed=False):  # the plan auto makes on GPUs, over gloo
        plan = planned(inputs, one_host, peer_failed)
        pull = one_host and not peer_failed
        transport = plan.transport.model_copy(update={"backend": "peer"}) if pull else plan.transport
        return dataclasses.replace(plan, transport=transport, by_host=not peer_failed)

    planned = weight_sync.plan_push
    monkeypatch.setattr(weight_sync, "plan_push", offered)
    lines = job_log
    t0 = time.perf_counter()
    fell_back = run(config(tmp_path / "fallback", False, "gloo", **ONE_WORKER),
                    RefusingRollout if refusing == "worker" else harness.InspectedRollout,
                    learner_cls=RefusingLearner if refusing == "rank" else harness.InspectedLearner)
    assert time.perf_counter() - t0 < 150  # the senders did not wait out weights.timeout_s (300 s)
    chosen = [line for line in lines if line.startswith("weights: ")]
    assert chosen[0] == ("weights: the push group of rollout workers [0] is built over peer (auto: every learner "
                         "rank and rollout worker runs on one host)"), lines
    why = "could not map" if refusing == "worker" else "cannot export"
    assert chosen[1].startswith("weights: the push over peer failed (") and why in chosen[1], chosen
    assert chosen[1].endswith(" …); auto builds every push group over gloo from now on"), chosen[1]  # cut short
    assert len(chosen) == 2, chosen  # nothing after it: every later group is broadcast
    assert_trained_alike(fell_back, broadcast, timed=SCORED)
