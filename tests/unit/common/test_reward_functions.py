"""User reward functions in TRL's batched form beside the per-completion one: the form read from the
signature, one call per batch, keyword lists of prompts, completions and columns, None as "not
applicable", several functions weighted and summed as TRL sums them (its own
GRPOTrainer._calculate_rewards gave the expected figures below on the same inputs), each logged
as a part, and every failure counted through the scorer."""
from __future__ import annotations

import textwrap

import pytest

from stabledrl.common.config.base import ConfigError
from stabledrl.common.config.task import parse_task_config
from stabledrl.common.sandbox.scorer import RewardScorer
from stabledrl.common.tasks import RewardResult, Row
from stabledrl.common.tasks.reward_functions import (
    BATCH_SIGNATURE, SAMPLE_SIGNATURE, RewardSignatureError, reward_form,
)
from stabledrl.coordinator.decisions.step_metrics import rollout_metrics

REWARDS = textwrap.dedent(
    """
    def accuracy(prompts, completions, answer, **kwargs):
        return [float(c.strip() == a) if a is not None else None for c, a in zip(completions, answer)]

    def brevity(completions, **kwargs):
        return [1.0 / (1 + len(c)) for c in completions]

    def topic_only(completions, topic, **kwargs):
        return [0.5 if t == "math" else None for t in topic]

    def seen(prompts, completions, **kwargs):
        return [float(len(p) if isinstance(p, str) else 100 + len(p)) + (0.25 if isinstance(c, list) else 0.0)
                for p, c in zip(prompts, completions)]

    def batch_size(completions, **kwargs):
        return [float(len(completions))] * len(completions)

    def needs_solution(completions, solution, **kwargs):
        return [1.0] * len(completions)

    def too_few(completions, **kwargs):
        return [1.0]

    def never(completions, **kwargs):
        return [None] * len(completions)

    def only_named(completions, topic):
        return [float(t == "math") for t in topic]

    def per_completion(completion, row):
        if completion == "boom":
            raise RuntimeError("boom")
        return 0.5

    def no_row(completion):
        return 1.0

    def slow(completions, **kwargs):
        import time
        time.sleep(2.0)
        return [1.0] * len(completions)
    """
)
ROWS = [
    Row("a", "2+2=", "4", record={"prompt": "2+2=", "answer": "4", "topic": "math"}),
    Row("a", "2+2=", "4", record={"prompt": "2+2=", "answer": "4", "topic": "math"}),
    Row("b", "Name a colour.", "", record={"prompt": "Name a colour.", "answer": None, "topic": "chat"}),
    Row("b", "Name a colour.", "", record={"prompt": "Name a colour.", "answer": None, "topic": "chat"}),
]
COMPLETIONS = ["4", "five", "red", "a long answer"]
# TRL 1.16's GRPOTrainer._calculate_rewards on these inputs, then its weighted nansum (weights 1, 0.5, 2, 0.01)
TRL_PER_FUNCTION = [[1.0, 0.5, 0.5, 4.0], [0.0, 0.2, 0.5, 4.0], [None, 0.25, None, 14.0],
                    [None, 1 / 14, None, 14.0]]
TRL_TOTAL = [2.29, 1.14, 0.265, 0.175714]


@pytest.fixture
def rewards(tmp_path):
    path = tmp_path / "rewards.py"
    path.write_text(REWARDS)
    return path


def scorer(rewards, names, weights=None, **reward):
    custom = [f"{rewards}:{n}" for n in names] if isinstance(names, list) else f"{rewards}:{names}"
    cfg = parse_task_config({"name": "arithmetic", "reward": {"custom": custom, "custom_weights": weights,
                                                              "format_weight": 0.0, "isolation": "inline", **reward}})
    return RewardScorer(cfg)


def test_several_batched_functions_combine_as_trl_combines_them(rewards):
    s = scorer(rewards, ["accuracy", "brevity", "topic_only", "seen"], [1.0, 0.5, 2.0, 0.01])
    got = s.score_batch(COMPLETIONS, ROWS)
    assert [r.total for r in got] == pytest.approx(TRL_TOTAL, abs=1e-6)
    for result, expected in zip(got, TRL_PER_FUNCTION):
        parts = {k: v for k, v in zip(("accuracy", "brevity", "topic_only", "seen"), expected) if v is not None}
        assert result.parts == pytest.approx({**parts, "custom": result.total})  # None: no part at all
    assert (s.stats.calls, s.stats.ok, s.stats.failed) == (4, 4, 0)


def test_chat_prompts_reach_a_batched_function_as_messages_and_completions_as_assistant_turns(rewards):
    row = Row("c", "hi", "x", messages=({"role": "user", "content": "hi"},),
              record={"prompt": [{"role": "user", "content": "hi"}], "answer": "x"})
    assert scorer(rewards, "seen").score("x", row).total == 101.25  # TRL's figure for the same conversation


def test_a_batched_function_is_called_once_per_batch(rewards):
    got = scorer(rewards, "batch_size").score_batch(COMPLETIONS, ROWS)
    assert [r.total for r in got] == [4.0] * 4


def test_a_function_without_kwargs_gets_only_the_columns_it_names(rewards):
    assert [r.total for r in scorer(rewards, "only_named").score_batch(COMPLETIONS, ROWS)] == [1, 1, 0, 0]


def test_the_per_completion_form_is_kept_and_its_failures_stay_its_own(rewards):
    s = scorer(rewards, ["per_completion", "brevity"])
    got = s.score_batch(["4", "boom", "red"], ROWS[:3])
    assert got[1] == RewardResult(0.0, {}) and got[0].parts["per_completion"] == 0.5
    assert got[0].total == pytest.approx(0.5 + 0.5) and got[2].total == pytest.approx(0.5 + 0.25)
    assert (s.stats.exception, s.stats.ok) == (1, 2)
    one = scorer(rewards, "per_completion")  # one function: its value is the part "custom", as before
    assert not one.batched and one.score("4", ROWS[0]) == RewardResult(0.5, {"custom": 0.5})


@pytest.mark.parametrize("name, kind, message", [
    ("needs_solution", "exception", "needs 'solution', which the data does not have (its columns: answer, topic"),
    ("too_few", "non_number", "returned 1 values for 4 completions"),
    ("never", "non_number", "returned None for this completion"),
])
def test_a_failing_batched_call_fails_every_completion_and_is_counted(rewards, name, kind, message):
    s = scorer(rewards, name)
    assert s.score_batch(COMPLETIONS, ROWS) == [RewardResult(0.0, {})] * 4
    assert getattr(s.stats, kind) == 4 and s.stats.zeroed == 4
    assert message in s.recent_failures[0][1]
    dropped = scorer(rewards, name, on_failure="drop")
    assert dropped.score_batch(COMPLETIONS, ROWS) == [None] * 4 and dropped.stats.dropped == 4


def test_the_form_comes_from_the_signature():
    def sample(completion, row): ...
    def sample_other_names(text, r, scale=1.0): ...
    def sample_varargs(*args): ...
    def trl(completions, **kwargs): ...
    def trl_full(prompts, completions, answer, **kwargs): ...
    def trl_keyword_only(*, completions, **kwargs): ...

    class Scorer:
        def __call__(self, completion, row): ...

    assert [reward_form(f, "r.py:f") for f in (sample, sample_other_names, sample_varargs, Scorer())] == ["sample"] * 4
    assert [reward_form(f, "r.py:f") for f in (trl, trl_full, trl_keyword_only)] == ["batch"] * 3


@pytest.mark.parametrize("signature", ["(completion)", "(a, b, c)", "(**kwargs)", "(completion, *, row)"])
def test_a_function_of_neither_form_is_refused_in_one_line_naming_both(signature):
    namespace: dict = {}
    exec(f"def odd{signature}: ...", namespace)  # noqa: S102 - a signature under test
    with pytest.raises(RewardSignatureError) as info:
        reward_form(namespace["odd"], "rewards.py:odd")
    message = str(info.value)
    assert "\n" not in message and "rewards.py:odd" in message and signature in message
    assert SAMPLE_SIGNATURE in message and BATCH_SIGNATURE in message


def test_a_function_of_neither_form_stops_the_scorer_before_any_call(rewards):
    with pytest.raises(ConfigError, match=r"rewards.py:no_row has the signature \(completion\), which fits neither"):
        scorer(rewards, "no_row")


def test_weights_must_match_the_functions(rewards):
    with pytest.raises(ConfigError, match=r"task.reward.custom_weights: 1 weights for 2 custom functions"):
        scorer(rewards, ["accuracy", "brevity"], [1.0])


def test_part_names_are_unique_and_never_a_part_of_the_rewards_own():
    cfg = parse_task_config({"name": "arithmetic", "reward": {"custom": ["a.py:format", "b.py:score", "c.py:score"]}})
    assert cfg.reward.custom_names == ["format_1", "score", "score_3"]


def test_a_part_is_averaged_over_the_samples_it_applies_to():
    from stabledrl.common.types import Episode, Group, Sample
    import torch

    def sample(i, parts):
        return Sample(sample_id=f"p/{i}", prompt_id="p", index=i, prompt_ids=torch.tensor([1]),
                      completion_ids=torch.tensor([2]), completion_length=1, reward=sum(parts.values()),
                      reward_parts=parts, policy_version=0, estimator="elbo_mc", mask_seed=0, behaviour_logp=0.0)

    group = Group("p", [sample(0, {"accuracy": 1.0, "topic": 0.5}), sample(1, {"accuracy": 0.0})])
    metrics = rollout_metrics([Episode(uid=0, prompt_id="p", group=group, worker=0, stats={})])
    assert metrics["rollout/reward/accuracy"] == 0.5 and metrics["rollout/reward/topic"] == 0.5


def test_functions_from_two_files_run_in_the_sandbox(rewards, tmp_path):
    other = tmp_path / "more"
    other.mkdir()
    (other / "length.py").write_text("def length(completion, row):\n    return float(len(completion))\n")
    cfg = parse_task_config({"name": "arithmetic", "reward": {
        "custom": [f"{rewards}:brevity", f"{other / 'length.py'}:length"], "format_weight": 0.0,
        "isolation": "process"}})
    with RewardScorer(cfg) as s:
        assert s.score("abc", ROWS[0]) == RewardResult(3.25, {"brevity": 0.25, "length": 3.0, "custom": 3.25})
        assert "more/length.py (sha256" in s.confinement and "rewards.py (sha256" in s.confinement


def test_a_batch_is_one_sandbox_call_with_its_completions_own_outcomes(rewards):
    cfg = parse_task_config({"name": "arithmetic", "reward": {
        "custom": [f"{rewards}:batch_size", f"{rewards}:per_completion"], "format_weight": 0.0,
        "isolation": "process"}})
    with RewardScorer(cfg) as s:
        assert s.batched
        got = s.score_batch(["4", "boom", "red"], ROWS[:3])
    assert got[0] == RewardResult(3.5, {"batch_size": 3.0, "per_completion": 0.5, "custom": 3.5})
    assert got[1] == RewardResult(0.0, {}) and got[2].total == 3.5  # one completion's failure is its own
    assert (s.stats.calls, s.stats.ok, s.stats.exception) == (3, 2, 1)


def test_a_batch_gets_timeout_s_per_completion(rewards):
    """timeout_s 1: a 2-second batch of 8 completions is in time (8 s); a batch of one is not, and
    every completion of a call that timed out is counted."""
    cfg = parse_task_config({"name": "arithmetic", "reward": {
        "custom": f"{rewards}:slow", "format_weight": 0.0, "isolation": "process", "timeout_s": 1.0}})
    with RewardScorer(cfg) as s:
        assert [r.total for r in s.score_batch(COMPLETIONS * 2, ROWS * 2)] == [1.0] * 8
        assert s.score_batch(["4"], ROWS[:1]) == [RewardResult(0.0, {})]
    assert (s.stats.calls, s.stats.ok, s.stats.timeout) == (9, 8, 1)
