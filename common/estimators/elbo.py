"""Monte-Carlo ELBO over random completion masks (MDLM, Sahoo et al., arXiv 2406.07524; LLaDA,
Nie et al., arXiv 2502.09992; used as the policy likelihood by FPO-style dLLM RL).

Per draw j: l_j ~ U{lo .. hi} (with t in [0, 1]: LLaDA's l ~ U{1 .. |o|}, i.e. l = ceil(t |o|) for
t ~ U(0, 1)), M_j a uniform l_j-subset of the |o| completion tokens, and

    weighted:  ELBO_j = (|o| / l_j) * sum_{k in M_j} log p_theta(o_k | o_{-M_j})
    mean:      ELBO_j = (1 / l_j)   * sum_{k in M_j} log p_theta(o_k | o_{-M_j})   (StableDRL / SPG)

and the estimate is the mean over the n draws. E[weighted] is the discrete-time ELBO <= log pi(o);
the mean form is its length-normalised variant. |o| counts tokens up to and including the first
EOS; canvas positions after it are masked in every view (as SPG masks them) and never scored.
Forwards: ``num_draws``. No per-token value.

Draw order per sample, for each draw: l_j, the subset's permutation of |o|, then the prompt mask.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from stabledrl.common.config.estimator import ElboMCConfig
from stabledrl.common.estimators.base import ESTIMATORS, LogLikelihood
from stabledrl.common.estimators.masking import (
    Views, draw_count, draw_subset, mask_prompt, row_infos, sample_generators,
)
from stabledrl.common.estimators.scoring import score_views
from stabledrl.common.models.base import DiffusionPolicy
from stabledrl.common.types import SequenceBatch


def elbo_values(logp: torch.Tensor, score: torch.Tensor, weight: torch.Tensor, weighting: str) -> torch.Tensor:
    """[B, V, C] log-probs, scored positions and per-token weights -> [B, V] per-draw values.

    ``weighted``: sum_k weight_k * log p_k over scored k. ``mean``: mean of log p_k over scored k
    (a draw that scores nothing is 0, as the released SPG code's clamped denominator gives).
    """
    score = score.to(logp.device)
    if weighting == "weighted":
        return (logp * weight.to(logp.device)).sum(dim=-1)
    if weighting == "mean":
        return (logp * score).sum(dim=-1) / score.sum(dim=-1).clamp(min=1)
    raise ValueError(f"weighting must be 'weighted' or 'mean', got {weighting!r}")


def block_views(batch: SequenceBatch, seeds: torch.Tensor, cfg: Any,
                block_size: Optional[int] = None) -> tuple[Views, torch.Tensor]:
    """Views and the [B, n, C] token weights n_b / m_b on the masked tokens: for each draw, block by
    block in order, a count m_b of the block's n_b tokens and which ones (``block_size`` None: the
    whole completion is one block, elbo_mc; else the staircase's blocks); then the prompt mask."""
    n = cfg.num_draws
    views = Views.empty(batch, n)
    weight = torch.zeros(views.score.shape, dtype=torch.float32)
    for i, (info, g) in enumerate(zip(row_infos(batch), sample_generators(seeds))):
        length = info.completion_length
        blocks = [(0, length)] if block_size is None else \
            [(start, min(block_size, length - start)) for start in range(0, length, block_size)]
        for j in range(n):
            for start, real in blocks:
                count = draw_count(g, real, cfg.t_min, cfg.t_max)
                chosen = draw_subset(g, real, count)  # [n_b]
                views.score[i, j, start : start + real] = chosen
                views.completion[i, j, start : start + real] = chosen
                weight[i, j, start : start + real] = chosen.float() * (real / max(count, 1))
            views.completion[i, j, length:] = True  # canvas after the first EOS
            mask_prompt(views, i, j, info, g, cfg.prompt_mask_prob)
    return views, weight


def elbo_views(batch: SequenceBatch, seeds: torch.Tensor, cfg: ElboMCConfig) -> tuple[Views, torch.Tensor]:
    """Views and the [B, V, C] token weights |o| / l_j on the masked tokens."""
    return block_views(batch, seeds, cfg)


@ESTIMATORS.register("elbo_mc")
def elbo_mc(policy: DiffusionPolicy, batch: SequenceBatch, seeds: torch.Tensor, cfg: ElboMCConfig) -> LogLikelihood:
    views, weight = elbo_views(batch, seeds, cfg)
    logp = score_views(policy, batch, views, cfg.draw_batch)  # [B, n, C]
    draws = elbo_values(logp, views.score, weight, cfg.weighting)  # [B, n]
    return LogLikelihood(
        sequence=draws.mean(dim=1),
        forwards=cfg.num_draws,
        diagnostics={"draws": draws.detach(), "masked_fraction": _masked_fraction(views, batch)},
    )


def _masked_fraction(views: Views, batch: SequenceBatch) -> torch.Tensor:
    """[B, V] fraction of the |o| completion tokens scored in each draw."""
    length = batch.completion_mask.sum(dim=1).clamp(min=1).cpu()
    return views.score.sum(dim=-1).float() / length[:, None]
