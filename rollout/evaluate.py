"""Held-out evaluation: pass@1, pass@k and mean correctness with the run's sampler settings.

For each of N prompts, n completions are sampled (``samples_per_prompt``), decoded up to the first
EOS without special tokens, and scored with the task's *correctness* (the checker, not the format
part). A completion is correct when its correctness is 1 (full marks: a partly solved Sudoku is not
correct). The generic task has no checker of its own: its completions are judged by their whole
reward, correct when it is at least ``task.correct_at``. With c_i correct completions of prompt i:

    pass@1 = (1/N) Σ_i c_i / n
    pass@k = (1/N) Σ_i [1 - C(n - c_i, k) / C(n, k)]          (unbiased; Chen et al., arXiv 2107.03374)

Scoring goes through the job's ``RewardScorer`` (its sandbox when ``task.reward.isolation`` is
``process``): the correctness is the reward's correctness part; a call that fails (raises, times
out, hits a sandbox limit, crashes) counts as wrong and in ``scoring_failures``. A prompt's n
completions are scored as one batch (one call where the user's reward is batched).

Sample j of prompt i is drawn with seed ``derive_seed(seed, "eval", prompt_id, j)``, so a result is a
function of (weights, rows, sampler settings, seed) whatever the batching or row order, and two
evaluations with one seed (BEFORE and AFTER training) are a paired comparison.
"""
from __future__ import annotations

import math
import time
from typing import Any, Optional, Sequence

import torch

from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.metrics import pass_at_k
from stabledrl.common.seeding import derive_seed
from stabledrl.common.tasks.base import RewardResult, Row, Task
from stabledrl.common.sandbox.scorer import RewardFailureRate, RewardScorer, check_failure_rate
from stabledrl.common.types import EvalResult
from stabledrl.rollout.engine import RolloutEngine
from stabledrl.rollout.workflow import decode_completion, encode_prompt  # the rollouts' own encoding and decoding


def evaluate(
    engine: RolloutEngine,
    rows: Sequence[Row],
    task: Task,
    tokenizer: Any,
    sampler_cfg: SamplerConfig,
    samples_per_prompt: int = 1,
    seed: int = 0,
    ks: Optional[Sequence[int]] = None,
    eos_token_id: Optional[int] = None,
    scorer: Optional[RewardScorer] = None,
    failure_check: Any = None,
) -> EvalResult:
    """Sample ``samples_per_prompt`` completions per row with ``engine`` and score them (module docstring).

    ``ks``: the k of the reported pass@k (default 1 and ``samples_per_prompt``). ``eos_token_id``:
    the policy's EOS (default the tokenizer's; checkpoints may record their own). One ``generate``
    call covers every sample; the engine splits it by ``sampler_cfg.max_batch_size``. ``scorer``:
    the job's reward scorer (built for ``task``); without one, ``task``'s checker is called inline.
    ``failure_check``: the task config; scoring stops, with ``EvalResult.stopped`` saying why, as
    soon as the scorer's failures make ``check_failure_rate``'s verdict certain (a reward that times
    out on every call would otherwise hold the evaluation for every one of its calls).
    """
    if not rows:
        raise ValueError("evaluate needs at least one row")
    n = int(samples_per_prompt)
    ks = sorted({1, n} if ks is None else set(ks))
    if ks[0] < 1 or ks[-1] > n:
        raise ValueError(f"every k must lie in 1..samples_per_prompt={n}, got {ks}")
    t0 = time.perf_counter()
    prompts = [encode_prompt(tokenizer, task, row) for row in rows for _ in range(n)]
    seeds = torch.tensor(
        [derive_seed(seed, "eval", row.prompt_id, j) for row in rows for j in range(n)], dtype=torch.long
    )
    out = engine.generate(prompts, seeds, sampler_cfg)
    eos = tokenizer.eos_token_id if eos_token_id is None else int(eos_token_id)
    completions: list[list[str]] = []
    correct: list[int] = []
    total, failures, stopped = 0.0, 0, ""
    before = scorer.stats.as_metrics(prefix="") if scorer is not None else {}
    for i, row in enumerate(rows):
        texts = [decode_completion(tokenizer, out.completion_ids[b].cpu(), int(out.completion_length[b]), eos)
                 for b in range(i * n, (i + 1) * n)]
        scores = _scores(scorer, task, texts, row)
        failures += sum(failed for _, failed in scores)
        total += sum(score for score, _ in scores)
        completions.append(texts)
        correct.append(sum(int(score >= task.correct_at) for score, _ in scores))
        if failure_check is not None and any(failed for _, failed in scores):
            stopped = _too_many_failures(scorer, before, failure_check)
            if stopped:
                break
    calls = _since(scorer, before)
    scored = max(len(correct), 1)
    return EvalResult(
        num_prompts=len(correct),
        samples_per_prompt=n,
        pass_at={k: sum(pass_at_k(n, c, k) for c in correct) / scored for k in ks},
        mean_correctness=total / (scored * n),
        correct=correct,
        completions=completions,
        time_s=time.perf_counter() - t0,
        scoring_failures=failures,
        reward_calls=calls,
        stopped=stopped,
    )


def _since(scorer: Optional[RewardScorer], before: dict[str, float]) -> dict[str, float]:
    """The scorer's calls by outcome since ``before`` (RewardStats.as_metrics without a prefix)."""
    if scorer is None:
        return {}
    after = scorer.stats.as_metrics(prefix="")
    return {k: after[k] - before.get(k, 0.0) for k in after}


def _too_many_failures(scorer: Optional[RewardScorer], before: dict[str, float], task_cfg: Any) -> str:
    """Why scoring stops ('' while it goes on): this evaluation's failures so far, judged as a
    job judges its rollouts' (common/sandbox/scorer.py check_failure_rate)."""
    try:
        check_failure_rate({f"reward_calls/{k}": v for k, v in _since(scorer, before).items()}, task_cfg)
    except RewardFailureRate as e:
        return str(e)
    return ""


def _scores(scorer: Optional[RewardScorer], task: Task, texts: list[str], row: Row) -> list[tuple[float, int]]:
    """(score, 1 if scoring failed else 0) of each completion of one prompt, scored as one batch:
    the correctness part, or the whole reward where the task is judged by it (``Task.judged_by``).
    A failure scores 0 (a scored result always carries its parts; a failed one none)."""
    def score(result: RewardResult) -> float:
        return result.total if task.judged_by == "reward" else result.parts.get(task.correctness_name, 0.0)

    if scorer is None:
        results = [None if isinstance(r, BaseException) or not math.isfinite(r.total) else r
                   for r in task.reward_batch(texts, [row] * len(texts))]
    else:
        results = scorer.score_batch(texts, [row] * len(texts))
    return [(0.0, 1) if result is None or not result.parts else (score(result), 0) for result in results]


__all__ = ["EvalResult", "decode_completion", "encode_prompt", "evaluate", "pass_at_k"]
