"""DiffuCoder's coupled sampling (coupled-GRPO, Gong et al., arXiv 2506.20639).

Per sample: view v0 masks the whole completion (weight 1). Per pair j: t_j ~ U(0.2, 0.8), a uniform
matrix R over the C canvas positions, view v1 masks {R < t_j} (weight 1/t_j) and view v2 masks the
complement {R >= t_j} (weight 1/(1 - t_j)), so every completion token is masked -- and scored --
exactly once by the pair. Token value (the released ``selective_log_softmax``):

    token_k = 1/2 [ log p(o_k | v0) + w_j(k) * log p(o_k | v_j(k)) ],   v_j(k) the pair view masking k

averaged over pairs when ``num_draws > 1``; sequence = sum of token values over the completion up to
and including its first EOS (canvas positions after it follow R like any other, as released, and are
not scored). The prompt is never masked. Forwards: 1 + 2 * ``num_draws``.

Draw order per sample, for each pair: t_j, then R (C uniforms).
"""
from __future__ import annotations

import torch

from stabledrl.common.config.estimator import CoupledConfig
from stabledrl.common.estimators.base import ESTIMATORS, LogLikelihood
from stabledrl.common.estimators.masking import Views, row_infos, sample_generators
from stabledrl.common.estimators.scoring import score_views
from stabledrl.common.models.base import DiffusionPolicy
from stabledrl.common.types import SequenceBatch


def coupled_views(batch: SequenceBatch, seeds: torch.Tensor, cfg: CoupledConfig) -> tuple[Views, torch.Tensor]:
    """Views [v0, (v1, v2) per pair] and the [B, 1 + 2n] view weights (1, 1/t_j, 1/(1 - t_j), ...)."""
    n = cfg.num_draws
    views = Views.empty(batch, 1 + 2 * n)
    weights = torch.ones(views.score.shape[0], 1 + 2 * n, dtype=torch.float32)
    completion_mask = batch.completion_mask.cpu()
    views.completion[:, 0] = True
    views.score[:, 0] = completion_mask
    for i, (info, g) in enumerate(zip(row_infos(batch), sample_generators(seeds))):
        for j in range(n):
            t = cfg.t_min + (cfg.t_max - cfg.t_min) * float(torch.rand((), generator=g))
            first = torch.rand(info.gen_length, generator=g) < t  # [C]
            for view, mask, w in ((1 + 2 * j, first, 1.0 / t), (2 + 2 * j, ~first, 1.0 / (1.0 - t))):
                views.completion[i, view] = mask
                views.score[i, view] = mask & completion_mask[i]
                weights[i, view] = w
    return views, weights


@ESTIMATORS.register("coupled")
def coupled(policy: DiffusionPolicy, batch: SequenceBatch, seeds: torch.Tensor, cfg: CoupledConfig) -> LogLikelihood:
    views, weights = coupled_views(batch, seeds, cfg)
    logp = score_views(policy, batch, views, cfg.draw_batch)  # [B, 1 + 2n, C]
    weights = weights.to(logp.device)
    pairs = (logp[:, 1:] * weights[:, 1:, None]).sum(dim=1) / cfg.num_draws  # [B, C]
    token = 0.5 * (logp[:, 0] + pairs)
    token_mask = batch.completion_mask.to(token.device)
    coverage = views.score[:, 1::2].long() + views.score[:, 2::2].long()  # [B, n, C]
    return LogLikelihood(
        sequence=(token * token_mask).sum(dim=-1),
        token=token,
        token_mask=token_mask,
        forwards=1 + 2 * cfg.num_draws,
        diagnostics={"pair_coverage": coverage, "t": 1.0 / weights[:, 1::2]},
    )
