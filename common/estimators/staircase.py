"""Block-diffusion ELBO with every block's term in one staircase forward (SDAR, arXiv 2510.06303;
TraDo / TraceRL, arXiv 2509.06949; docs/algorithms.md §5).

Block diffusion factorises log pi(y) = sum_b log pi(y_b | q, y_<b). Per draw j and per completion
block b (``policy.block_size`` tokens, n_b of them real): m_b ~ U{lo .. hi} with fractions in
[t_min, t_max] (TraDo: 0.1 .. 0.9), M_b a uniform m_b-subset of the block's real tokens, and

    weighted:  ELBO_j = sum_b (n_b / m_b) * sum_{k in M_b} log p_theta(o_k | q, y_<b, y_b masked at M_b)
    mean:      ELBO_j = mean over all masked k of log p_theta(o_k | ...)

The forward is ``[prompt | clean completion | noisy completion]`` with the staircase mask
(stabledrl.common.attention.staircase_mask), both completion copies at the same position ids; logits are read
at the noisy copy. It equals the per-block multi-pass value to float tolerance. The canvas after the
first EOS is masked in the noisy copy and never scored. Forwards: ``num_draws`` (each of length
P + 2C). Only for block-diffusion families; no per-token value.

Draw order per sample, for each draw: per block in order, m_b then the block's subset permutation;
then the prompt mask.
"""
from __future__ import annotations

import torch

from stabledrl.common.config.estimator import StaircaseConfig
from stabledrl.common.estimators.base import ESTIMATORS, LogLikelihood
from stabledrl.common.estimators.elbo import block_views, elbo_values
from stabledrl.common.estimators.masking import Views
from stabledrl.common.estimators.scoring import score_views
from stabledrl.common.models.base import DiffusionPolicy
from stabledrl.common.types import SequenceBatch


def staircase_views(
    batch: SequenceBatch, seeds: torch.Tensor, cfg: StaircaseConfig, block_size: int
) -> tuple[Views, torch.Tensor]:
    """Views of the noisy copy and the [B, n, C] token weights n_b / m_b on the masked tokens."""
    return block_views(batch, seeds, cfg, block_size)


@ESTIMATORS.register("staircase")
def staircase(
    policy: DiffusionPolicy, batch: SequenceBatch, seeds: torch.Tensor, cfg: StaircaseConfig
) -> LogLikelihood:
    if not policy.is_block_diffusion:
        raise ValueError(f"the staircase estimator needs a block-diffusion family, got {policy.spec.name!r}")
    views, weight = staircase_views(batch, seeds, cfg, policy.block_size)
    logp = score_views(policy, batch, views, cfg.draw_batch)  # [B, n, C]
    draws = elbo_values(logp, views.score, weight, cfg.weighting)  # [B, n]
    return LogLikelihood(
        sequence=draws.mean(dim=1),
        forwards=cfg.num_draws,
        diagnostics={"draws": draws.detach(), "token_logp": logp.detach(), "masked": views.score.sum(-1)},
    )
