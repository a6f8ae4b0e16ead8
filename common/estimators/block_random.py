"""SPG block-wise masking and the SPG sandwich (Wang et al., arXiv 2510.09541), as released with
StableDRL (arXiv 2603.06743).

block_random, per draw j (completion cut into generation blocks of ``block_length``):
  - block b_j: the released rule, a random permutation of the canvas's blocks taken modulo the
    number of blocks the completion covers, draw j takes entry j -- uniform over the completion's
    blocks when their number divides the canvas's, and the n draws hit different blocks when the
    completion fills the canvas;
  - blocks < b_j clean (each token masked with prompt_mask_prob when ``mask_clean_blocks``, as the
    released code's light noise does); in b_j, m ~ U{1 .. n_b} of its n_b real tokens masked;
    blocks > b_j and the canvas after the first EOS fully masked; prompt tokens masked with p;
  - value_j = mean of log p_theta(o_k | x^j) over the masked real completion tokens M_j;
  ELBO = mean_j value_j. Forwards: ``num_draws``.

spg_sandwich reuses exactly these draws (so its ``elbo`` equals block_random's value bitwise):
  A > 0:  ELBO;     A <= 0:  omega * EUBO_beta + (1 - omega) * ELBO, with
  EUBO_beta = (1/beta) * mean_{k covered} log( (1/n) sum_j 1[k in M_j] p_theta(o_k | x^j)^beta / t_j ),
  t_j = |M_j| / |o|, "covered" = masked in at least one draw; computed as a logsumexp in log space.

Draw order per sample: the block permutation; then per draw: m, the block's subset permutation,
the prompt mask, the clean-block mask.
"""
from __future__ import annotations

import math

import torch

from stabledrl.common.config.estimator import BlockRandomConfig, SPGSandwichConfig
from stabledrl.common.estimators.base import ESTIMATORS, LogLikelihood
from stabledrl.common.estimators.elbo import elbo_values
from stabledrl.common.estimators.masking import (
    Views,
    draw_bernoulli,
    draw_count,
    draw_subset,
    mask_prompt,
    row_infos,
    sample_generators,
)
from stabledrl.common.estimators.scoring import score_views
from stabledrl.common.models.base import DiffusionPolicy
from stabledrl.common.types import SequenceBatch


def block_random_views(batch: SequenceBatch, seeds: torch.Tensor, cfg: BlockRandomConfig) -> tuple[Views, torch.Tensor]:
    """Views and the [B, n] chosen block of every draw (-1 for an empty completion)."""
    n, width = cfg.num_draws, cfg.block_length
    views = Views.empty(batch, n)
    chosen_blocks = torch.full((views.score.shape[0], n), -1, dtype=torch.long)
    for i, (info, g) in enumerate(zip(row_infos(batch), sample_generators(seeds))):
        length = info.completion_length
        if length == 0:
            continue
        canvas_blocks = -(-info.gen_length // width)
        completion_blocks = -(-length // width)
        order = torch.randperm(canvas_blocks, generator=g) % completion_blocks
        for j in range(n):
            block = int(order[j % canvas_blocks])
            start = block * width
            real = min(width, length - start)
            count = draw_count(g, real, cfg.t_min, cfg.t_max)
            noise = views.completion[i, j]
            noise[start:] = True
            noise[start : start + real] = draw_subset(g, real, count)
            mask_prompt(views, i, j, info, g, cfg.prompt_mask_prob)
            if cfg.mask_clean_blocks:
                noise[:start] = draw_bernoulli(g, start, cfg.prompt_mask_prob)
            views.score[i, j, :length] = noise[:length]
            chosen_blocks[i, j] = block
    return views, chosen_blocks


def _block_random_draws(policy, batch, seeds, cfg) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logp [B, n, C], score [B, n, C], ELBO [B], per-draw values [B, n])."""
    views, _ = block_random_views(batch, seeds, cfg)
    logp = score_views(policy, batch, views, cfg.draw_batch)
    score = views.score.to(logp.device)
    draws = elbo_values(logp, score, score, "mean")  # [B, n]
    return logp, score, draws.mean(dim=1), draws


@ESTIMATORS.register("block_random")
def block_random(
    policy: DiffusionPolicy, batch: SequenceBatch, seeds: torch.Tensor, cfg: BlockRandomConfig
) -> LogLikelihood:
    _, score, elbo, draws = _block_random_draws(policy, batch, seeds, cfg)
    return LogLikelihood(
        sequence=elbo, forwards=cfg.num_draws, diagnostics={"draws": draws.detach(), "masked": score.sum(-1)}
    )


_NEG = -1e30


def eubo(logp: torch.Tensor, score: torch.Tensor, completion_length: torch.Tensor, beta: float) -> torch.Tensor:
    """[B, n, C] log-probs and scored positions, [B] |o| -> [B] EUBO_beta (see the module docstring)."""
    n = logp.shape[1]
    t = score.sum(dim=-1).float() / completion_length.clamp(min=1)[:, None].float()  # [B, n]
    terms = beta * logp - torch.log(t.clamp(min=1e-8))[:, :, None]  # [B, n, C]
    terms = terms.masked_fill(~score, _NEG)  # finite, so uncovered tokens keep a zero (not NaN) gradient
    covered = score.any(dim=1)  # [B, C]
    log_avg = torch.logsumexp(terms, dim=1) - math.log(n)  # [B, C]
    log_avg = torch.where(covered, log_avg, torch.zeros_like(log_avg))
    return log_avg.sum(dim=-1) / covered.sum(dim=-1).clamp(min=1) / beta


@ESTIMATORS.register("spg_sandwich")
def spg_sandwich(
    policy: DiffusionPolicy, batch: SequenceBatch, seeds: torch.Tensor, cfg: SPGSandwichConfig
) -> LogLikelihood:
    """SPG's sandwiched log-likelihood: the ELBO for A > 0, the EUBO/ELBO mix for A <= 0 (needs
    ``batch.advantages``). ``elbo`` carries the plain ELBO of the same draws, for importance ratios."""
    if batch.advantages is None:
        raise ValueError("spg_sandwich needs batch.advantages (the sign picks ELBO or the EUBO mix); "
                         "estimate behaviour values with block_random, which draws the same masks")
    logp, score, elbo, draws = _block_random_draws(policy, batch, seeds, cfg)
    length = batch.completion_mask.sum(dim=1).to(logp.device)
    upper = eubo(logp, score, length, cfg.eubo_beta)
    if cfg.logp_estimation == "mix":
        negative = cfg.mix_weight * upper + (1.0 - cfg.mix_weight) * elbo
    elif cfg.logp_estimation == "eubo":
        negative = upper
    else:
        negative = elbo
    positive = batch.advantages.to(logp.device) > 0
    return LogLikelihood(
        sequence=torch.where(positive, elbo, negative),
        elbo=elbo,
        forwards=cfg.num_draws,
        diagnostics={"eubo": upper.detach(), "draws": draws.detach(), "masked": score.sum(-1)},
    )
