"""DRPO: a smooth, advantage-weighted quadratic regulariser on the shift from the behaviour policy."""
from __future__ import annotations

import torch

from stabledrl.common.config.loss import DrpoLossConfig
from stabledrl.learner.losses.inputs import LossInputs, units
from stabledrl.learner.losses.statistics import (
    LossOutput, Metric, advantage_metrics, masked_mean, ratio_from_log, ratio_metrics,
)
from stabledrl.learner.losses.registry import register_loss


@register_loss("drpo", group_coupled=False)
def drpo_loss(inputs: LossInputs, cfg: DrpoLossConfig) -> LossOutput:
    """DRPO (arXiv 2606.09821), per token (or per sequence, weight |o_i|):

        r = π_θ / μ        (differentiable; μ = the behaviour probability, detached; no clipping)
        ℓ = −A·r + |A|·μ·(r − 1)² / (2δ)            δ = 12.5
        L = (1/Σ|o|) Σ_i Σ_k ℓ_ik

    ∂ℓ/∂r = −A·(1 − sign(A(r−1))·|π − μ|/δ): the *gradient weight* in brackets damps updates that
    move π away from μ in the advantage's direction, reaches 0 at |π − μ| = δ and turns corrective
    beyond it, and amplifies updates that move back toward μ. The region is always measured from
    the behaviour policy, so stale samples are handled as they are. Note the released δ = 12.5
    keeps that weight within 1 ± 1/12.5 for probabilities in [0, 1]; smaller δ regularises harder.
    """
    u = units(inputs, cfg.level)
    valid = u.weight > 0
    zero = torch.zeros_like(u.logp)
    log_ratio = torch.where(valid, u.logp - u.behaviour_logp, zero)
    ratio = ratio_from_log(log_ratio)
    mu = torch.exp(torch.where(valid, u.behaviour_logp, zero)).detach()
    a = u.advantages
    per_unit = -a * ratio + a.abs() * mu * (ratio - 1.0).square() / (2.0 * cfg.delta)
    total = (per_unit * u.weight).sum() / inputs.num_tokens

    r = ratio.detach()
    shift = mu * (r - 1.0)  # π − μ
    grad_weight = 1.0 - torch.sign(a * (r - 1.0)) * shift.abs() / cfg.delta
    penalty = a.abs() * mu * (r - 1.0).square() / (2.0 * cfg.delta)
    penalty_part = (penalty * u.weight).sum() / inputs.num_tokens
    metrics = {
        **ratio_metrics(log_ratio, valid),
        "drpo/grad_weight_mean": Metric.mean(masked_mean(grad_weight, valid)),
        "drpo/grad_weight_min": Metric.min(torch.where(valid, grad_weight, torch.ones_like(grad_weight)).amin()),
        "drpo/corrective_frac": Metric.mean(masked_mean((grad_weight < 0).float(), valid)),
        "drpo/penalty_mean": Metric.mean(masked_mean(penalty, valid)),
        "loss/policy": Metric.share(total - penalty_part),
        "loss/penalty": Metric.share(penalty_part),
        "loss/total": Metric.share(total),
        **advantage_metrics(inputs.advantages),
    }
    return LossOutput(total, metrics)
