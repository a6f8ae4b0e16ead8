"""The learner ranks' results merge into one step record, each key by its declared reduction."""
from __future__ import annotations

from coordinator.step_metrics import merge_ranks, rank_reduction
from learner.losses.metrics import Reduce


def rank(r: int, **values: float) -> dict[str, float]:
    return {"train/loss": 0.5, "learner/staleness_max": float(r), "learner/samples": 4.0, "learner/tokens": 10.0 + r,
            "time/train_rank": 1.0 + r, "learner/parameters": 100.0, **values}


def test_rank_local_values_combine_by_their_reduction_and_global_ones_come_from_rank_0():
    results = [rank(0, **{"learner/peak_rss_gb/rank0": 2.0, "learner/peak_rss_gb/rank1": 3.0}),
               rank(1, **{"learner/peak_rss_gb/rank0": 2.5, "learner/peak_rss_gb/rank1": 3.0})]
    merged = merge_ranks(results)
    assert merged["learner/staleness_max"] == 1.0 and merged["time/train_rank"] == 2.0
    assert merged["learner/samples"] == 8.0 and merged["learner/tokens"] == 21.0
    assert merged["train/loss"] == 0.5 and merged["learner/parameters"] == 100.0
    assert merged["learner/peak_rss_gb/rank0"] == 2.5  # the peak is a max, whichever rank reported it
    assert rank_reduction("learner/peak_gpu_reserved_gb/rank3") is Reduce.MAX
    assert rank_reduction("train/loss") is Reduce.LAST
