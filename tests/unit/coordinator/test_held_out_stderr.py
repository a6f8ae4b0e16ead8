"""What the job's final line gives besides BEFORE -> AFTER: AFTER's standard error over the prompts,
sqrt(p (1 - p) / N), which for greedy decoding (one sample per prompt, right or wrong) is the exact
standard error of a mean of N Bernoulli outcomes; and, with eval.final_window > 1, the mean of the
last evaluations after BEFORE."""
from __future__ import annotations

import math
import random

from stabledrl.coordinator.decisions.held_out import HeldOutResult


def result(p: float, n: int) -> HeldOutResult:
    return HeldOutResult(num_prompts=n, samples_per_prompt=1, pass_at={1: p}, mean_correctness=p, version=0, time_s=0.0)


def test_stderr_of_pass_at_1_is_the_binomial_one():
    assert math.isclose(result(0.8, 200).stderr, math.sqrt(0.8 * 0.2 / 200))
    assert result(1.0, 200).stderr == 0.0 and result(0.0, 50).stderr == 0.0
    assert math.isclose(result(0.5, 400).stderr, 0.025)


def test_stderr_matches_the_spread_of_pass_at_1_over_resampled_prompt_sets():
    rng = random.Random(0)
    n, p = 200, 0.7
    values = [sum(rng.random() < p for _ in range(n)) / n for _ in range(2000)]
    spread = math.sqrt(sum((v - p) ** 2 for v in values) / len(values))
    assert abs(spread - result(p, n).stderr) < 0.05 * result(p, n).stderr


def test_the_final_line_gives_the_mean_of_the_last_evaluations_after_before():
    from stabledrl.common.config.job import load_job_config
    from stabledrl.coordinator.driver import Driver

    cfg = load_job_config("deploy/configs/quickstart.yaml", ["eval.final_window=3"])
    driver = Driver(cfg)
    driver.evaluations = [result(0.10, 200)]  # BEFORE alone: nothing to average
    assert driver.final_window_text() == ""
    driver.evaluations += [result(p, 200) for p in (0.50, 0.70, 0.80, 0.90)]  # BEFORE never enters the mean
    assert driver.final_window_text() == "; mean of the last 3 evaluations: 80.0%"
    driver.evaluations = driver.evaluations[:3]
    assert driver.final_window_text() == "; mean of the last 2 evaluations: 60.0%"
    one = Driver(load_job_config("deploy/configs/quickstart.yaml", ["eval.final_window=1"]))
    one.evaluations = driver.evaluations
    assert one.final_window_text() == ""
