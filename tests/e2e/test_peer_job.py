"""A job whose rollout workers pull the weights from the learner ranks' memory (``weights.backend:
peer``, common/transport/peer.py; on CPU actors each rank's buffer is a set of shared-memory
blocks) trains exactly as the same job pushing by gloo broadcast: ZeRO-3 over 2 ranks, each
offering its own partitions, 2 workers each reading both ranks' buffers, η = 1 with in-order
batches (a run that is a function of config and seed, whatever the timing) and the push staged
beside the workers' requests. Same metrics at every step, same final weights, bit for bit."""
from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

import harness  # noqa: E402
from test_colocate import assert_trained_alike, config, run  # noqa: E402

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster():
    with harness.local_ray(__name__):
        yield


def test_workers_pulling_from_zero3_ranks_train_exactly_as_the_broadcast(cluster, tmp_path):
    job = {"learner": {"num_ranks": 2, "dist_timeout_s": 120, "optimizer": {"lr": 1e-2},
                       "deepspeed": {"zero_stage": 3}},
           "rollout": {"num_workers": 2}, "algorithm": {"max_staleness": 1, "in_order": True}}
    broadcast = run(config(tmp_path / "gloo", False, "gloo", **job), harness.InspectedRollout)
    pulled = run(config(tmp_path / "peer", False, "peer", **job), harness.InspectedRollout)
    assert [p["push_sources"] for p in pulled["before"][0]] == [2, 2]  # both ranks offer their partitions
    # every actor froze its set-up's heap, so a collection during a push is short (common/gil.py)
    assert all(p["frozen_objects"] > 10_000 for p in pulled["before"][0] + pulled["before"][1]), pulled["before"]
    staged = [r for r in pulled["driver"].history if r.get("time/rollout0/push_stage", 0) > 0 or
              r.get("time/rollout1/push_stage", 0) > 0]
    assert staged, "the workers staged the pulls beside their requests"
    assert_trained_alike(pulled, broadcast)
