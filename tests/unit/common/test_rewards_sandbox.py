"""Reward isolation: raising, non-number, NaN/inf, slow and crashing rewards are contained and counted."""
import dataclasses
import textwrap

import pytest

from stabledrl.common.config.base import ConfigError
from stabledrl.common.config.task import parse_task_config
from stabledrl.common.sandbox.scorer import RewardScorer, RewardStats
from stabledrl.common.tasks import RewardResult, Row, build_task

ROW = Row("p", "1+1=", "2")
USER_REWARD = textwrap.dedent(
    """
    import math, os, sys, time

    def score(completion, row):
        kind = completion.strip()
        if kind == "raise":
            raise RuntimeError("user bug")
        if kind == "text":
            return "1.0"
        if kind == "none":
            return None
        if kind == "nan":
            return math.nan
        if kind == "inf":
            return -math.inf
        if kind == "slow":
            time.sleep(60)
        if kind == "exit":
            os._exit(3)
        if kind == "print":
            print("noise on stdout")
        return 1.0 if kind == row.answer else 0.25
    """
)


@pytest.fixture()
def reward_file(tmp_path):
    path = tmp_path / "user_reward.py"
    path.write_text(USER_REWARD)
    return path


def config(reward_file, **reward):
    return parse_task_config({"name": "arithmetic", "reward": {"custom": f"{reward_file}:score", **reward}})


def test_inline_failures_are_zeroed_and_counted(reward_file):
    scorer = RewardScorer(config(reward_file, isolation="inline"))
    got = [scorer.score(c, ROW) for c in ["2", "raise", "text", "none", "nan", "inf", "3"]]
    assert got[0] == RewardResult(total=1.1, parts={"custom": 1.0, "format": 1.0})
    assert got[-1] == RewardResult(total=pytest.approx(0.35), parts={"custom": 0.25, "format": 1.0})
    assert all(r == RewardResult(0.0, {}) for r in got[1:-1])
    s = scorer.stats
    assert (s.calls, s.ok, s.exception, s.non_number, s.non_finite, s.zeroed, s.dropped) == (7, 2, 1, 2, 2, 5, 0)
    assert s.failed == 5


def test_drop_policy_returns_none(reward_file):
    scorer = RewardScorer(config(reward_file, isolation="inline", on_failure="drop"))
    assert scorer.score("raise", ROW) is None and scorer.score("2", ROW) is not None
    assert (scorer.stats.dropped, scorer.stats.zeroed, scorer.stats.exception) == (1, 0, 1)


def test_process_sandbox_survives_timeouts_crashes_and_bad_values(reward_file):
    with RewardScorer(config(reward_file, timeout_s=1.0)) as scorer:  # isolation auto -> process
        assert scorer.isolation == "process"
        kinds = ["2", "slow", "2", "exit", "print", "raise", "nan", "text", "2"]
        got = [scorer.score(k, ROW) for k in kinds]
    totals = [r.total for r in got]
    assert totals == pytest.approx(
        [1.1, 0.0, 1.1, 0.0, 0.25, 0.0, 0.0, 0.0, 1.1]
    )  # "print" is not an integer: format 0
    s = scorer.stats
    assert (s.timeout, s.crash, s.exception, s.non_finite, s.non_number, s.ok) == (1, 1, 1, 1, 1, 4)
    assert s.calls == len(kinds) and s.zeroed == s.failed == 5


def test_builtin_rewards_get_the_same_isolation():
    cfg = parse_task_config({"name": "arithmetic"})
    task = build_task(cfg)
    broken = {
        "exception": dataclasses.replace(task, correctness=lambda c, r: 1 / 0),
        "non_number": dataclasses.replace(task, format_score=lambda c, r: "yes"),
        "non_finite": dataclasses.replace(task, correctness=lambda c, r: float("nan")),
    }
    for kind, bad_task in broken.items():
        scorer = RewardScorer(cfg, task=bad_task)
        assert scorer.score("2", ROW) == RewardResult(0.0, {})
        assert getattr(scorer.stats, kind) == 1 and scorer.stats.failed == 1


@pytest.mark.parametrize("spec,isolation", [
    ("missing_file.py:score", "inline"),
    ("{file}:no_such_function", "inline"),
    ("{file}:no_such_function", "process"),
    ("no_such_package_xyz.module:score", "inline"),
])
def test_bad_custom_spec_fails_at_start(reward_file, spec, isolation):
    cfg = parse_task_config(
        {"name": "arithmetic", "reward": {"custom": spec.format(file=reward_file), "isolation": isolation}}
    )
    with pytest.raises(ConfigError):
        RewardScorer(cfg)


def test_custom_module_path_spec_and_lazy_import():
    cfg = parse_task_config(
        {"name": "arithmetic",
         "reward": {"custom": "stabledrl.common.tasks.arithmetic:format_score", "isolation": "inline"}}
    )
    task = build_task(cfg)  # building the task imports nothing yet
    assert task.correctness._functions is None
    assert RewardScorer(cfg).score("not a number", ROW) == RewardResult(0.0, {"custom": 0.0, "format": 0.0})


def test_stats_merge_and_metrics():
    a, b = RewardStats(calls=3, ok=2, timeout=1, zeroed=1), RewardStats(calls=2, ok=1, exception=1, dropped=1)
    m = a.merge(b).as_metrics()
    assert m["reward/calls"] == 5 and m["reward/ok"] == 3 and m["reward/failed"] == 2 and m["reward/dropped"] == 1


def test_inline_sys_exit_is_contained_and_failures_are_kept_for_logs(tmp_path):
    path = tmp_path / "exits.py"
    path.write_text("import sys\ndef score(completion, row):\n    sys.exit(2)\n")
    scorer = RewardScorer(
        parse_task_config({"name": "arithmetic", "reward": {"custom": f"{path}:score", "isolation": "inline"}})
    )
    assert scorer.score("2", ROW) == RewardResult(0.0, {})
    assert scorer.stats.exception == 1 and scorer.recent_failures[0][0] == "exception"


def test_builtin_reward_in_the_process_sandbox_matches_inline():
    cfg = parse_task_config({"name": "countdown", "reward": {"isolation": "process"}})
    row = build_task(cfg).generate(11)
    texts = [
        build_task(cfg).reference_completion(row),
        "<answer>1+1</answer>",
        "",
        "<answer>" + "9" * 999 + "</answer>",
    ]
    inline = RewardScorer(parse_task_config({"name": "countdown"}))
    with RewardScorer(cfg) as sandboxed:
        assert [sandboxed.score(t, row) for t in texts] == [inline.score(t, row) for t in texts]
        assert sandboxed.stats.ok == 4
