"""TraceRL's trajectory-aware likelihood (Wang et al., arXiv 2509.06949; Gen-Verse/dLLM-RL).

The rollout records ``decode_step``: the sampler step at which each canvas token was unmasked. A
token is scored in the state the sampler decoded it from:

    s_tau = the completion with every token decoded at a step >= tau masked,
    log pi_hat(o_k) = log p_theta(o_k | q, s_tau(k)),   tau(k) = decode_step[k],

and the sequence value is the sum over the completion up to and including its first EOS (tokens
after it still shape the states, as in TraceRL, but are not scored). No randomness: seeds are unused.

``shrink`` merges every ``shrink`` consecutive distinct steps into one forward (TraceRL's
``collapse_k_unique``): each step maps to the last step of its group, so the group's tokens are all
predicted from the state where the whole group is masked. shrink = 1 is the exact trajectory.

Full-attention families: one forward per merged step (the distinct steps of the whole completion).
Block-diffusion families: steps are merged within each block, and round r scores the r-th merged
step of *every* block at once through the staircase layout (block b's noisy copy in its state, the
blocks before it clean, as the block-wise sampler saw them). Forwards: the number of rounds.
"""
from __future__ import annotations

import torch

from stabledrl.common.config.estimator import TrajectoryConfig
from stabledrl.common.estimators.base import ESTIMATORS, LogLikelihood
from stabledrl.common.estimators.masking import Views
from stabledrl.common.estimators.scoring import score_views
from stabledrl.common.models.base import DiffusionPolicy
from stabledrl.common.types import SequenceBatch


def collapse_steps(steps: torch.Tensor, shrink: int) -> torch.Tensor:
    """[n] decode steps -> [n] merged steps: the distinct steps, sorted, in groups of ``shrink``;
    each step becomes the largest step of its group. shrink = 1 returns ``steps``."""
    if steps.numel() == 0:
        return steps.clone()
    distinct, rank = torch.unique(steps, sorted=True, return_inverse=True)
    last = ((rank // shrink) + 1) * shrink - 1
    return distinct[last.clamp(max=distinct.numel() - 1)]


def trajectory_rounds(
    steps: torch.Tensor, shrink: int, block_size: int | None
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """[C] decode steps of one sample -> per round (masked [C] bool, target [C] bool).

    ``block_size=None``: one round per merged step tau of the whole completion (masked = merged >= tau,
    target = merged == tau). Otherwise steps merge within each block and round r holds the r-th
    merged step of every block that has one (its block's masked/target sets; other blocks clean).
    """
    c = steps.numel()
    spans = [(0, c)] if block_size is None else [(s, min(s + block_size, c)) for s in range(0, c, block_size)]
    per_span = []
    for start, end in spans:
        merged = collapse_steps(steps[start:end], shrink)
        per_span.append((start, end, merged, torch.unique(merged, sorted=True)))
    rounds = []
    for r in range(max((len(levels) for *_, levels in per_span), default=0)):
        masked = torch.zeros(c, dtype=torch.bool)
        target = torch.zeros(c, dtype=torch.bool)
        for start, end, merged, levels in per_span:
            if r < len(levels):
                masked[start:end] = merged >= levels[r]
                target[start:end] = merged == levels[r]
        rounds.append((masked, target))
    return rounds


def trajectory_views(batch: SequenceBatch, cfg: TrajectoryConfig, block_size: int | None) -> Views:
    if batch.decode_step is None:
        raise ValueError("the trajectory estimator needs batch.decode_step (the rollout's per-token decode step)")
    steps = batch.decode_step.cpu()
    completion_mask = batch.completion_mask.cpu()
    per_row = [trajectory_rounds(steps[i], cfg.shrink, block_size) for i in range(steps.shape[0])]
    views = Views.empty(batch, max((len(r) for r in per_row), default=0))
    for i, rounds in enumerate(per_row):
        for r, (masked, target) in enumerate(rounds):
            views.completion[i, r] = masked
            views.score[i, r] = target & completion_mask[i]
    return views


@ESTIMATORS.register("trajectory")
def trajectory(
    policy: DiffusionPolicy, batch: SequenceBatch, seeds: torch.Tensor, cfg: TrajectoryConfig
) -> LogLikelihood:
    block_size = policy.block_size if policy.is_block_diffusion else None
    views = trajectory_views(batch, cfg, block_size)
    logp = score_views(policy, batch, views, cfg.draw_batch)  # [B, rounds, C]
    token = logp.sum(dim=1)  # every token is a target in exactly one round
    token_mask = batch.completion_mask.to(token.device)
    return LogLikelihood(
        sequence=(token * token_mask).sum(dim=-1),
        token=token,
        token_mask=token_mask,
        forwards=views.num_views,
        diagnostics={"scored_rounds": views.score.any(dim=-1).sum(dim=-1)},
    )
