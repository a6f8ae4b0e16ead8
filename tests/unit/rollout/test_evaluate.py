"""Held-out evaluation (rollout/evaluate.py): pass@k against enumeration, oracle engines that are
always / never right, per-sample seeds, decoding to the first EOS, and row-order invariance on a
real tiny policy."""
from __future__ import annotations

import itertools
import math
from typing import Callable, Sequence

import pytest
import torch

from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.config.task import parse_task_config
from stabledrl.common.models import build_tiny_policy
from stabledrl.common.seeding import derive_seed
from stabledrl.common.tasks import Row, load_task_data
from stabledrl.common.tokenizer import build_char_tokenizer
from stabledrl.rollout.engine import RolloutEngine, TorchRolloutEngine
from stabledrl.rollout.evaluate import decode_completion, encode_prompt, evaluate, pass_at_k
from stabledrl.rollout.sampling import GenerationOutput

torch.set_num_threads(1)
TOK = build_char_tokenizer()
EOS = TOK.eos_token_id
SAMPLER = SamplerConfig(gen_length=4, block_length=4, steps=4, temperature=1.0)


def arithmetic(n: int = 40):
    cfg = parse_task_config({"name": "arithmetic", "digits": 2, "held_out": 0, "source": {"kind": "generated", "n": n}})
    return load_task_data(cfg)


class OracleEngine:
    """Answers every prompt with ``answer_of(row, seed)`` (+ EOS, EOS-filled), as a real engine would
    return it: the prompt is read back from its token ids, nothing else is known."""

    policy_version = 0
    eos_token_id = pad_token_id = EOS
    vocab_size = len(TOK)

    def __init__(
        self, task, rows: Sequence[Row], answer_of: Callable[[Row, int], str], junk_after_eos: bool = False
    ) -> None:
        self.by_prompt = {task.render_prompt(r): r for r in rows}
        self.answer_of = answer_of
        self.junk_after_eos = junk_after_eos
        self.seeds: list[int] = []

    def generate(self, prompts, seeds, cfg: SamplerConfig) -> GenerationOutput:
        c = cfg.gen_length
        ids = torch.full((len(prompts), c), EOS, dtype=torch.long)
        lengths = torch.full((len(prompts),), c, dtype=torch.long)
        for b, (prompt, seed) in enumerate(zip(prompts, seeds.tolist())):
            row = self.by_prompt[TOK.decode(prompt.tolist())]
            answer = TOK.encode(self.answer_of(row, seed), add_special_tokens=False)[: c - 1]
            ids[b, : len(answer)] = torch.tensor(answer, dtype=torch.long)
            if self.junk_after_eos:  # a canvas that breaks the EOS-fill contract: the length must win
                ids[b, len(answer) + 1 :] = TOK.convert_tokens_to_ids("7")
            lengths[b] = len(answer) + 1
            self.seeds.append(seed)
        return GenerationOutput(ids, lengths, torch.zeros_like(ids), 1, int(lengths.sum()), 0.0)

    def score(self, batch, seeds, estimator):
        raise NotImplementedError  # evaluation never scores

    def update_weights(self, push, handle, partial=False) -> int:
        raise NotImplementedError

    def stage_weights(self, push, handle, partial=False, *, keep_order, timeout_s) -> int:
        raise NotImplementedError

    def discard_staged(self) -> None:
        raise NotImplementedError


def test_pass_at_k_equals_the_fraction_of_k_subsets_holding_a_correct_sample():
    for n in range(1, 7):
        for c in range(n + 1):
            samples = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(samples, k))
                expected = sum(any(s) for s in subsets) / len(subsets)
                assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
    assert pass_at_k(200, 13, 1) == pytest.approx(13 / 200)
    assert pass_at_k(10, 3, 4) == pytest.approx(1 - math.comb(7, 4) / math.comb(10, 4))
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 2, 5)


def test_an_engine_that_is_always_right_scores_100_and_one_that_never_is_scores_0():
    data = arithmetic()
    rows, task = data.train, data.task
    right = OracleEngine(task, rows, lambda row, seed: row.answer)
    wrong = OracleEngine(task, rows, lambda row, seed: str(int(row.answer) + 1))
    assert isinstance(right, RolloutEngine)
    good = evaluate(right, rows, task, TOK, SAMPLER, samples_per_prompt=3, seed=5)
    bad = evaluate(wrong, rows, task, TOK, SAMPLER, samples_per_prompt=3, seed=5)
    assert good.pass_at == {1: 1.0, 3: 1.0} and good.mean_correctness == 1.0 and good.correct == [3] * len(rows)
    assert bad.pass_at == {1: 0.0, 3: 0.0} and bad.mean_correctness == 0.0 and bad.correct == [0] * len(rows)
    assert good.completions[0] == [rows[0].answer] * 3
    assert good.metrics()["eval/pass@1"] == 1.0 and bad.metrics()["eval/pass@3"] == 0.0
    # a well-formed but wrong answer earns format credit in the reward, never in the accuracy
    assert task.format_score(bad.completions[0][0], rows[0]) == 1.0


def test_each_sample_has_its_own_seed_and_the_counts_follow_them():
    """An engine right exactly when its seed is even: the counts, pass@1 and pass@k must be what the
    seeds derive_seed(seed, "eval", prompt_id, j) imply."""
    data = arithmetic()
    rows, task, n = data.train, data.task, 4
    engine = OracleEngine(task, rows, lambda row, seed: row.answer if seed % 2 == 0 else "x")
    result = evaluate(engine, rows, task, TOK, SAMPLER, samples_per_prompt=n, seed=9, ks=[1, 2, 4])
    seeds = [[derive_seed(9, "eval", r.prompt_id, j) for j in range(n)] for r in rows]
    assert engine.seeds == [s for row_seeds in seeds for s in row_seeds]
    assert len(set(engine.seeds)) == len(rows) * n
    counts = [sum(s % 2 == 0 for s in row_seeds) for row_seeds in seeds]
    assert result.correct == counts
    assert 0 < sum(counts) < len(rows) * n  # both outcomes occur, so the check has teeth
    for k in (1, 2, 4):
        assert result.pass_at[k] == pytest.approx(sum(pass_at_k(n, c, k) for c in counts) / len(rows))
    assert result.pass_at_1 == pytest.approx(sum(counts) / (len(rows) * n))
    assert result.pass_at[1] <= result.pass_at[2] <= result.pass_at[4]


def test_completions_are_read_up_to_the_first_eos_without_special_tokens():
    data = arithmetic()
    rows, task = data.train, data.task
    engine = OracleEngine(task, rows, lambda row, seed: row.answer, junk_after_eos=True)
    result = evaluate(
        engine, rows, task, TOK, SAMPLER.model_copy(update={"gen_length": 8, "block_length": 8, "steps": 8})
    )
    assert result.pass_at_1 == 1.0
    ids = torch.tensor(TOK.encode("4", add_special_tokens=False) + [TOK.mask_token_id, TOK.pad_token_id]
                       + TOK.encode("2", add_special_tokens=False) + [EOS, EOS])  # fmt: skip
    assert decode_completion(TOK, ids, length=5, eos_token_id=EOS) == "42"
    assert decode_completion(TOK, ids, length=6, eos_token_id=EOS) == "42"  # no EOS: the whole canvas
    assert encode_prompt(TOK, task, rows[0]).tolist() == TOK.encode(
        task.render_prompt(rows[0]), add_special_tokens=False
    )


def test_a_real_policy_gives_the_same_result_for_any_row_order_and_batch_size():
    data = arithmetic(24)
    rows, task = data.train, data.task
    engine = TorchRolloutEngine(build_tiny_policy("llada", vocab_size=len(TOK)))
    first = evaluate(engine, rows, task, TOK, SAMPLER, samples_per_prompt=2, seed=3)
    again = evaluate(
        engine, rows[::-1], task, TOK, SAMPLER.model_copy(update={"max_batch_size": 5}), samples_per_prompt=2, seed=3
    )
    assert first.completions == again.completions[::-1]
    assert first.correct == again.correct[::-1] and first.pass_at == again.pass_at
    other = evaluate(engine, rows, task, TOK, SAMPLER, samples_per_prompt=2, seed=4)
    assert other.completions != first.completions  # the seed matters at temperature 1
    assert 0.0 <= first.pass_at[1] <= first.pass_at[2] <= 1.0


def test_an_evaluation_temperature_of_0_is_greedy_and_independent_of_the_seed():
    from stabledrl.common.config.warmstart import EvalConfig

    data = arithmetic(12)
    engine = TorchRolloutEngine(build_tiny_policy("llada", vocab_size=len(TOK)))
    assert (
        EvalConfig().sampler_for(SAMPLER) is SAMPLER
        and EvalConfig().describe(SAMPLER) == f"T = {SAMPLER.temperature:g}"
    )
    greedy_cfg = EvalConfig(temperature=0.0)
    greedy = greedy_cfg.sampler_for(SAMPLER)
    assert greedy.temperature == 0.0 and greedy.steps == SAMPLER.steps and greedy_cfg.describe(SAMPLER) == "greedy"
    a = evaluate(engine, data.train, data.task, TOK, greedy, samples_per_prompt=2, seed=3)
    b = evaluate(engine, data.train, data.task, TOK, greedy, samples_per_prompt=2, seed=4)
    assert a.completions == b.completions  # argmax decoding: no seed enters
    assert all(len(set(c)) == 1 for c in a.completions)  # both samples of a prompt are the same
    assert a.pass_at[1] == a.pass_at[2]


def test_bad_arguments_are_refused():
    data = arithmetic(8)
    engine = OracleEngine(data.task, data.train, lambda row, seed: row.answer)
    with pytest.raises(ValueError, match="at least one row"):
        evaluate(engine, [], data.task, TOK, SAMPLER)
    with pytest.raises(ValueError, match="every k"):
        evaluate(engine, data.train, data.task, TOK, SAMPLER, samples_per_prompt=2, ks=[3])
