"""The study's numbers: the collapse rule, gradient spikes, per-run and per-method summaries."""
from __future__ import annotations

import math

import pytest

from stabledrl.recipes.study.analysis import (
    find_collapse,
    grad_spike,
    method_table,
    run_table,
    summarize_methods,
    summarize_run,
)
from stabledrl.recipes.study.config import CollapseRule

RULE = CollapseRule(ema=0.9, fraction=0.5, min_peak=0.1, hold=10)


def test_a_step_down_collapses_where_the_ema_crosses_half_its_peak():
    # EMA after k zeros following ones is 0.9^k: below 0.5 first at k = 7, i.e. index 20 + 6
    rewards = [1.0] * 20 + [0.0] * 30
    assert find_collapse(rewards, RULE) == 26
    assert 0.9**7 < 0.5 <= 0.9**6


def test_a_dip_that_recovers_is_not_a_collapse():
    rewards = [0.6] * 20 + [0.0] * 15 + [0.6] * 20
    assert find_collapse(rewards, RULE) is None


def test_a_run_that_never_learned_does_not_collapse():
    assert find_collapse([0.05] * 10 + [0.0] * 40, RULE) is None  # peak below min_peak
    assert find_collapse([0.0] * 50, RULE) is None
    assert find_collapse([], RULE) is None


def test_a_fall_shorter_than_hold_is_not_yet_a_collapse():
    rewards = [0.8] * 30 + [0.0] * 12  # EMA below half the peak only for the last 6 steps
    assert find_collapse(rewards, RULE) is None
    assert find_collapse(rewards, RULE.model_copy(update={"hold": 5})) == 36


def test_the_threshold_is_relative_to_the_peak():
    # a rise to 0.8 then a slow fall to 0.5: 62% of the peak, no collapse at fraction 0.5
    rewards = [0.8] * 20 + [0.5] * 40
    assert find_collapse(rewards, RULE) is None
    # at 0.7: e = 0.5 + 0.3 * 0.9^k < 0.56 first at k = 16 (0.9^16 = 0.185), index 20 + 15
    assert find_collapse(rewards, RULE.model_copy(update={"fraction": 0.7})) == 35


def test_grad_spike_is_max_over_median_and_ignores_skipped_steps():
    top, ratio = grad_spike([1.0, 2.0, 3.0, 30.0, float("inf")])
    assert top == 30.0 and ratio == 30.0 / 2.5
    assert all(math.isnan(x) for x in grad_spike([]))


def test_grad_spike_median_leaves_out_steps_without_a_gradient():
    # a collapsed run: most steps' groups all score 0, so their advantages and gradients are 0
    top, ratio = grad_spike([2.0, 4.0, 40.0] + [0.0] * 10)
    assert top == 40.0 and ratio == 40.0 / 4.0
    top, ratio = grad_spike([0.0, 0.0])
    assert top == 0.0 and math.isnan(ratio)


def records(rewards, evals, grad=1.0):
    out = [{"step": 0, "eval/pass@1": evals[0]}]
    for i, r in enumerate(rewards, start=1):
        out.append({"step": i, "rollout/reward_mean": r, "train/grad_norm_max": grad * (10 if i == 3 else 1),
                    "train/ratio/max": 1.0 + i, "train/skipped_total": 0.0, "time/step": 0.5})
    for step, value in evals[1:]:
        out.append({"step": step, "eval/pass@1": value})
    return out


def test_summarize_run_reads_accuracy_collapse_and_spikes():
    rewards = [0.5] * 10 + [0.0] * 20
    r = summarize_run("grpo", 1, records(rewards, [0.3, (10, 0.45), (20, 0.1), (30, 0.05)]), RULE)
    assert (r.start_accuracy, r.final_accuracy, r.best_accuracy) == (0.3, 0.05, 0.45)
    assert r.collapsed and r.collapse_step == 10 + 7  # steps count from 1: index 16 is step 17
    assert r.grad_norm_max == 10.0 and r.grad_spike == 10.0
    assert r.ratio_max == 31.0 and r.steps == 30 and r.time_s == pytest.approx(15.0)


def test_best_accuracy_leaves_out_the_start():
    r = summarize_run("drpo", 0, records([0.4] * 5, [0.6, (5, 0.5)]), RULE)
    assert r.best_accuracy == 0.5 and r.start_accuracy == 0.6 and not r.collapsed


def test_method_table_counts_collapses_and_averages_seeds():
    stable = [summarize_run("stabledrl", s, records([0.5] * 30, [0.3, (30, acc)]), RULE)
              for s, acc in enumerate((0.4, 0.6))]
    grpo = [summarize_run("grpo", s, records(rw, [0.3, (30, 0.1)]), RULE)
            for s, rw in enumerate(([0.5] * 10 + [0.0] * 20, [0.5] * 30))]
    methods = summarize_methods(stable + grpo, ["grpo", "stabledrl", "drpo"])
    assert [m.method for m in methods] == ["grpo", "stabledrl"]  # drpo has no run
    assert methods[0].collapses == 1 and methods[1].collapses == 0
    assert methods[1].stat("final_accuracy") == pytest.approx((0.5, 0.1))
    table = method_table(methods)
    assert "| grpo | 2 |" in table and "| 1/2 |" in table and "| 0/2 |" in table
    assert "50.0 ± 10.0" in table  # stabledrl's final accuracy in %
    assert run_table(grpo).count("\n") == 2 + 2 and "| 17 |" in run_table(grpo)


def test_unfinished_runs_are_marked():
    r = summarize_run("grpo", 0, records([0.5] * 3, [0.3]), RULE, status="stopped")
    table = method_table(summarize_methods([r], ["grpo"]))
    assert "1 (1 unfinished)" in table and math.isnan(r.final_accuracy) and "n/a" in table
