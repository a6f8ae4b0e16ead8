"""The learner ranks' results merge into one step record, each key by its declared reduction."""
from __future__ import annotations

from common.stats import Reduce, Stat
from coordinator.step_metrics import merge_ranks


def rank(r: int, **values: float) -> dict[str, Stat]:
    return {"train/loss": Stat(0.5 + r, replicated=True), "learner/staleness_max": Stat(r, Reduce.MAX),
            "learner/samples": Stat(4.0, Reduce.COUNT), "learner/tokens": Stat(10.0 + r, Reduce.COUNT),
            "time/train_rank": Stat(1.0 + r, Reduce.MAX), "learner/parameters": Stat(100.0, replicated=True),
            **{k: Stat(v, Reduce.MAX) for k, v in values.items()}}


def test_rank_local_values_combine_by_their_reduction_and_global_ones_come_from_rank_0():
    results = [rank(0, **{"learner/peak_rss_gb/rank0": 2.0, "learner/peak_rss_gb/rank1": 3.0}),
               rank(1, **{"learner/peak_rss_gb/rank0": 2.5, "learner/peak_rss_gb/rank1": 3.0})]
    merged = merge_ranks(results)
    assert merged["learner/staleness_max"] == 1.0 and merged["time/train_rank"] == 2.0
    assert merged["learner/samples"] == 8.0 and merged["learner/tokens"] == 21.0
    assert merged["train/loss"] == 0.5 and merged["learner/parameters"] == 100.0
    assert merged["learner/peak_rss_gb/rank0"] == 2.5  # the peak is a max, whichever rank reported it
    assert merged["train/loss"] == 0.5  # replicated: rank 0's value, whatever the others say
