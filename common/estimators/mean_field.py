"""d1's one-pass mean-field estimate (diffu-GRPO, Zhao et al., arXiv 2504.12216).

Mask every completion token and each real prompt token with probability p (0.15); then

    log pi_hat(o_k) = log p_theta(o_k | q_masked, [M] * C),     log pi_hat(o) = sum_k log pi_hat(o_k)

over the completion up to and including its first EOS (d1 scores every canvas position, its loss
then keeps only those; here the others are not even scored). Token values are defined; with
``num_draws > 1`` they are averaged over independent prompt masks. Forwards: ``num_draws``.

Draw order per sample, for each draw: one uniform per real prompt token.
"""
from __future__ import annotations

import torch

from stabledrl.common.config.estimator import MeanFieldConfig
from stabledrl.common.estimators.base import ESTIMATORS, LogLikelihood
from stabledrl.common.estimators.masking import Views, mask_prompt, row_infos, sample_generators
from stabledrl.common.estimators.scoring import score_views
from stabledrl.common.models.base import DiffusionPolicy
from stabledrl.common.types import SequenceBatch


def mean_field_views(batch: SequenceBatch, seeds: torch.Tensor, cfg: MeanFieldConfig) -> Views:
    views = Views.empty(batch, cfg.num_draws)
    views.completion[:] = True
    views.score[:] = batch.completion_mask.cpu()[:, None, :]
    for i, (info, g) in enumerate(zip(row_infos(batch), sample_generators(seeds))):
        for j in range(cfg.num_draws):
            mask_prompt(views, i, j, info, g, cfg.prompt_mask_prob)
    return views


@ESTIMATORS.register("mean_field")
def mean_field(
    policy: DiffusionPolicy, batch: SequenceBatch, seeds: torch.Tensor, cfg: MeanFieldConfig
) -> LogLikelihood:
    views = mean_field_views(batch, seeds, cfg)
    logp = score_views(policy, batch, views, cfg.draw_batch)  # [B, n, C]
    token = logp.mean(dim=1)  # [B, C]
    token_mask = batch.completion_mask.to(token.device)
    return LogLikelihood(
        sequence=(token * token_mask).sum(dim=-1),
        token=token,
        token_mask=token_mask,
        forwards=cfg.num_draws,
    )
