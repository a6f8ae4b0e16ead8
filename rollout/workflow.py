"""The episode: what one group is, apart from how it is sampled (the engine) or trained on.

For each prompt of a request (AReaL's ``arun_episode`` idea, batched over the request):

  1. sample G completions, row i of prompt q seeded by derive_seed(seed, "sample", uid_q, i);
  2. reward each completion (decoded up to its first EOS, special tokens removed; a batched user
     reward gets the request's completions in one call); a reward the task config says to drop
     removes that sample, a group with no sample left is dropped;
  3. estimate the behaviour log-likelihood ELBO_μ(o_i) under the weights that sampled it, with
     mask seed derive_seed(seed, "mask", uid_q, i) carried on the sample, so the learner can
     redraw the same masks (``masks: shared``) or fresh ones derived from it (``independent``);
  4. stamp every sample with the engine's ``policy_version`` and the id "prompt_id/index".

``uid`` is the prompt's position in the run's prompt stream (the coordinator numbers requests),
so seeds do not depend on which worker ran the request or when: re-running a request after a
worker failure reproduces it exactly.
"""
from __future__ import annotations

import time
from typing import Any, Optional, Sequence

import torch

from stabledrl.common.compiling import graphs_compiled
from stabledrl.common.config.estimator import BlockRandomConfig, EstimatorConfig, SPGSandwichConfig
from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.seeding import derive_seed
from stabledrl.common.sandbox.scorer import RewardScorer
from stabledrl.common.tasks import Row, Task
from stabledrl.common.tasks.prompts import prompt_ids
from stabledrl.common.types import Episode, Group, PromptRequest, Sample, collate_samples
from stabledrl.rollout.engine import RolloutEngine


def encode_prompt(tokenizer: Any, task: Task, row: Row) -> torch.Tensor:
    """[Lp] int64 ids of the prompt as the model reads it (chat-templated when the tokenizer has a
    template, ``stabledrl.common.tasks.prompts``): the one encoding rollouts, evaluation (rollout/evaluate.py),
    the warm start (learner/sft.py) and ``max_prompt_tokens`` share. The learner never re-encodes:
    it trains on the ``prompt_ids`` carried by the samples."""
    return torch.tensor(prompt_ids(tokenizer, task, row), dtype=torch.long)


def decode_completion(tokenizer: Any, completion_ids: torch.Tensor, length: int, eos_token_id: int) -> str:
    """The reward functions' input: text up to (not including) the first EOS, specials removed."""
    ids = completion_ids[:length].tolist()
    if ids and ids[-1] == eos_token_id:
        ids = ids[:-1]
    return tokenizer.decode(ids, skip_special_tokens=True)


def behaviour_estimator(cfg: EstimatorConfig) -> EstimatorConfig:
    """The estimator the rollout side runs: the configured one, except that the SPG sandwich
    (whose value depends on the advantage, unknown here) is replaced by block_random with the
    same settings: its ELBO is the sandwich's ``ratio_value`` on the same masks."""
    if isinstance(cfg, SPGSandwichConfig):
        fields = {k: v for k, v in cfg.model_dump().items() if k in BlockRandomConfig.model_fields and k != "name"}
        return BlockRandomConfig(**fields)
    return cfg


def sample_seed(seed: int, uid: int, index: int) -> int:
    return derive_seed(seed, "sample", uid, index)


def mask_seed(seed: int, uid: int, index: int) -> int:
    return derive_seed(seed, "mask", uid, index)


@torch.no_grad()
def run_episodes(
    engine: RolloutEngine,
    requests: Sequence[PromptRequest],
    *,
    tokenizer: Any,
    task: Task,
    scorer: RewardScorer,
    group_size: int,
    sampler: SamplerConfig,
    estimator: EstimatorConfig,
    seed: int,
    worker: int = 0,
) -> list[Episode]:
    """One request: G completions of every prompt, rewarded, behaviour-estimated and stamped."""
    g = group_size
    t0, compiled0 = time.perf_counter(), graphs_compiled()
    prompts = [encode_prompt(tokenizer, task, r.row) for r in requests]
    rows = [(q, i) for q in range(len(requests)) for i in range(g)]  # row b = (prompt q, sample i)
    seeds = torch.tensor([sample_seed(seed, requests[q].uid, i) for q, i in rows], dtype=torch.long)
    out = engine.generate([prompts[q] for q, _ in rows], seeds, sampler)
    version = out.policy_version
    completions, lengths = out.completion_ids.cpu(), out.completion_length.cpu()
    decode_steps = out.decode_step.cpu()
    t1 = time.perf_counter()

    samples: list[list[Sample]] = [[] for _ in requests]
    texts = [decode_completion(tokenizer, completions[b], int(lengths[b]), engine.eos_token_id)
             for b in range(len(rows))]
    rewards = scorer.score_batch(texts, [requests[q].row for q, _ in rows])  # one call if the reward is batched
    for b, (q, i) in enumerate(rows):
        reward = rewards[b]
        if reward is None:  # the task config drops samples whose reward failed
            continue
        row = requests[q].row
        samples[q].append(Sample(
            sample_id=f"{row.prompt_id}/{i}", prompt_id=row.prompt_id, index=i, prompt_ids=prompts[q],
            completion_ids=completions[b], completion_length=int(lengths[b]), reward=reward.total,
            reward_parts=dict(reward.parts), policy_version=version, estimator=estimator.name,
            mask_seed=mask_seed(seed, requests[q].uid, i), decode_step=decode_steps[b], answer=row.answer,
        ))
    t2 = time.perf_counter()
    _estimate_behaviour(engine, [s for group in samples for s in group], estimator, sampler.max_batch_size,
                        sampler.max_tokens_per_forward)
    t3 = time.perf_counter()

    n = len(requests)
    stats = {"generate_s": (t1 - t0) / n, "reward_s": (t2 - t1) / n, "estimate_s": (t3 - t2) / n,
             "tokens": out.tokens_generated / n, "forwards": out.num_forwards / n,
             "forward_rows": out.forward_rows / n, "forward_tokens": out.forward_tokens / n,
             "forward_attended": out.forward_attended / n,
             "prompt_tokens": sum(len(prompts[q]) for q, _ in rows) / n,
             "compiles": (graphs_compiled() - compiled0) / n}  # common/compiling.py: zero in the steady state
    return [
        Episode(uid=r.uid, prompt_id=r.row.prompt_id, group=Group(r.row.prompt_id, s) if s else None,
                worker=worker, stats=stats)
        for r, s in zip(requests, samples)
    ]


# logit elements one behaviour-estimate call may produce (4 GiB in bf16): every scored view keeps
# the logits of the whole completion, so TraDo-8B's 512 x 151,936 per row caps a call at 27 views
LOGIT_BUDGET = 2**31


def _estimate_behaviour(engine: RolloutEngine, samples: list[Sample], estimator: EstimatorConfig, chunk: int,
                        max_tokens: Optional[int] = None) -> None:
    """Fill behaviour_logp (and the per-token values where the estimator defines them) in place,
    at most ``chunk`` samples per ``engine.score`` call, fewer where their logits would exceed
    LOGIT_BUDGET or their forward ``max_tokens`` tokens (views x (the longest prompt + completion))."""
    if samples:
        views = getattr(estimator, "draw_batch", None) or getattr(estimator, "num_draws", 1)
        per_sample = len(samples[0].completion_ids) * engine.vocab_size * views
        chunk = max(1, min(chunk, LOGIT_BUDGET // per_sample))
        if max_tokens:
            width = max(len(s.prompt_ids) for s in samples) + len(samples[0].completion_ids)
            chunk = max(1, min(chunk, max_tokens // (views * width)))
    for start in range(0, len(samples), chunk):
        part = samples[start : start + chunk]
        batch = collate_samples(part, engine.pad_token_id)
        seeds = torch.tensor([s.mask_seed for s in part], dtype=torch.long)
        ll = engine.score(batch, seeds, estimator)
        values = ll.ratio_value.float().cpu()
        tokens = None if ll.token is None else ll.token.float().cpu()
        for j, s in enumerate(part):
            s.behaviour_logp = float(values[j])
            s.behaviour_token_logp = None if tokens is None else tokens[j].clone()
