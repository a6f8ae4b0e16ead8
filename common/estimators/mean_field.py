"""d1's one-pass mean-field estimate (diffu-GRPO, Zhao et al., arXiv 2504.12216).

Mask every completion token and each real prompt token with probability p (0.15); then

    log pi_hat(o_k) = log p_theta(o_k | q_masked, [M] * C),     log pi_hat(o) = sum_k log pi_hat(o_k)

over the completion up to and including its first EOS (d1 scores every canvas position, its loss
then keeps only those; here the others are not even scored). Token values are defined; with
``num_draws > 1`` they are averaged over independent prompt masks. Forwards: ``num_draws``.

Draw order per sample, for each draw: one uniform per real prompt token.

``masks: per_iteration`` draws as d1's ``forward_process`` does instead: each run of consecutive rows
carrying one seed value is one of d1's micro-batches; a generator seeded with that value modulo
PER_ITERATION_SEEDS (the learner numbers the micro-batches of one forward in the multiples,
``learner.rl_batch.MicroBatch.for_iteration``) draws, for each draw, a
[rows, P + C] uniform matrix in row-major order (P the run's longest prompt, its rows left-padded to
it as d1's collate pads them), row r reading row r of the matrix; a real prompt token is masked
where its uniform is below p. One unpadded row draws the same mask either way. d1 draws on the GPU
(CUDA's generator) and here the CPU's: the same law from the same seeds, not the same draws there.
"""
from __future__ import annotations

import torch

from stabledrl.common.config.estimator import MeanFieldConfig
from stabledrl.common.estimators.base import ESTIMATORS, PER_ITERATION_SEEDS, LogLikelihood
from stabledrl.common.estimators.masking import RowInfo, Views, mask_prompt, row_infos, sample_generators
from stabledrl.common.estimators.scoring import score_views
from stabledrl.common.models.base import DiffusionPolicy
from stabledrl.common.seeding import generator
from stabledrl.common.types import SequenceBatch


def mean_field_views(batch: SequenceBatch, seeds: torch.Tensor, cfg: MeanFieldConfig) -> Views:
    views = Views.empty(batch, cfg.num_draws)
    views.completion[:] = True
    views.score[:] = batch.completion_mask.cpu()[:, None, :]
    infos = row_infos(batch)
    if cfg.masks == "per_iteration":
        for rows in seed_runs(seeds):
            _mask_micro_batch(views, rows, infos, int(seeds[rows.start]) % PER_ITERATION_SEEDS, cfg)
        return views
    for i, (info, g) in enumerate(zip(infos, sample_generators(seeds))):
        for j in range(cfg.num_draws):
            mask_prompt(views, i, j, info, g, cfg.prompt_mask_prob)
    return views


def seed_runs(seeds: torch.Tensor) -> list[range]:
    """Row ranges of consecutive equal seeds (``per_iteration``: one micro-batch each)."""
    values = torch.as_tensor(seeds).reshape(-1).tolist()
    starts = [i for i in range(len(values)) if i == 0 or values[i] != values[i - 1]]
    return [range(a, b) for a, b in zip(starts, starts[1:] + [len(values)])]


def _mask_micro_batch(views: Views, rows: range, infos: list[RowInfo], seed: int, cfg: MeanFieldConfig) -> None:
    """d1's prompt masks of one micro-batch (module docstring): one stream for all its rows."""
    g = generator(seed)
    width = max(len(infos[i].prompt_positions) for i in rows)  # the micro-batch's left-padded prompt width
    for j in range(cfg.num_draws):
        u = torch.rand(len(rows), width + infos[rows.start].gen_length, generator=g)  # [rows, P + C]
        for r, i in enumerate(rows):
            n = len(infos[i].prompt_positions)
            views.prompt[i, j, infos[i].prompt_positions] = u[r, width - n : width] < cfg.prompt_mask_prob


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
