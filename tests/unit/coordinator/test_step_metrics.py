"""The learner ranks' results merge into one step record, each key by its declared reduction."""
from __future__ import annotations

from stabledrl.common.stats import Reduce, Stat
from stabledrl.coordinator.decisions.step_metrics import merge_ranks


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


def test_mfu_counts_the_tokens_each_estimate_feeds():
    """6·N per token the estimates' forwards take in: two ELBO draws feed the row twice; the staircase's
    one forward feeds prompt + noisy completion + clean completion; coupled feeds 1 + 2 per pair."""
    from stabledrl.common.config.estimator import CoupledConfig, ElboMCConfig, StaircaseConfig
    from stabledrl.coordinator.decisions.step_metrics import estimate_forward_tokens, perf_metrics

    assert estimate_forward_tokens(ElboMCConfig(num_draws=2), 100, 256) == 2 * 356
    assert estimate_forward_tokens(StaircaseConfig(), 100, 256) == 100 + 2 * 256
    assert estimate_forward_tokens(StaircaseConfig(num_draws=2), 100, 256) == 2 * 612
    assert estimate_forward_tokens(CoupledConfig(num_draws=1), 100, 256) == 3 * 356
    perf = perf_metrics(step_s=4.0, train_s=2.0, samples=8, tokens=2048, forward_tokens=8 * 612, inner_iterations=2,
                        parameters=10**9, learner_devices=2, peak_tflops=100.0)
    assert abs(perf["perf/mfu"] - 6 * 10**9 * 8 * 612 * 2 / (2.0 * 2 * 100e12)) < 1e-12
    assert perf["perf/samples_per_s"] == 2.0 and perf["perf/learner_tokens_per_s"] == 2048
