"""DPPO: trust regions on the sampled token's probability shift, anchored at the behaviour policy."""
from __future__ import annotations

import torch
from torch import Tensor

from stabledrl.common.config.loss import DppoLossConfig
from stabledrl.learner.losses.inputs import LossInputs, units
from stabledrl.learner.losses.statistics import (
    LossOutput, Metric, advantage_metrics, masked_mean, ratio_from_log, ratio_metrics,
)
from stabledrl.learner.losses.registry import register_loss


def binary_kl(p: Tensor, mu: Tensor, eps: float = 1e-8) -> Tensor:
    """KL(Bern(μ) ‖ Bern(p)) = μ log(μ/p) + (1−μ) log((1−μ)/(1−p)): the divergence restricted to
    {sampled token, everything else}."""
    return mu * (torch.log(mu + eps) - torch.log(p + eps)) + (1 - mu) * (
        torch.log(1 - mu + eps) - torch.log(1 - p + eps)
    )


def trust_region_mask(p: Tensor, mu: Tensor, advantages: Tensor, cfg: DppoLossConfig) -> Tensor:
    """M (bool, True = keep): drop a unit whose divergence from μ left the trust region in the
    direction its advantage pushes (A > 0 and p > μ, or A < 0 and p < μ).

    binary_tv: |p − μ| > δ_TV (0.15);  binary_kl: KL(Bern(μ) ‖ Bern(p)) > δ_KL (0.05).
    """
    pushed_further = ((advantages > 0) & (p > mu)) | ((advantages < 0) & (p < mu))
    if cfg.divergence == "binary_tv":
        outside = (p - mu).abs() > cfg.tv_delta
    else:
        outside = binary_kl(p, mu) > cfg.kl_delta
    return ~(pushed_further & outside)


@register_loss("dppo", group_coupled=False)
def dppo_loss(inputs: LossInputs, cfg: DppoLossConfig) -> LossOutput:
    """DPPO (arXiv 2602.04879):

        r_ik = π_θ(o_ik) / μ(o_ik)                 anchored at the *behaviour* policy μ
        L = −(1/Σ|o|) Σ_i Σ_k A_i · sg(min(r_ik, C)) · M_ik · log π_θ(o_ik)

    with M from ``trust_region_mask`` (binary-TV δ = 0.15 or binary-KL δ = 0.05). The paper's
    ablation found anchoring at a recomputed old policy instead of μ collapses. For dLLMs π is the
    estimator's per-token value (mean_field / coupled / trajectory); with a sequence estimator the
    sequence form uses π = exp(log π̂(o_i)), one unit of weight |o_i| per sequence, and assumes a
    length-normalised (per-token mean) sequence value.
    """
    u = units(inputs, cfg.level)
    valid = u.weight > 0
    zero = torch.zeros_like(u.logp)
    logp = torch.where(valid, u.logp, zero)
    behaviour = torch.where(valid, u.behaviour_logp, zero)
    log_ratio = (logp - behaviour).detach()
    ratio = ratio_from_log(log_ratio)
    p, mu = torch.exp(logp.detach()).clamp(max=1.0), torch.exp(behaviour).clamp(max=1.0)
    keep = trust_region_mask(p, mu, u.advantages, cfg) & valid
    coeff = u.advantages * ratio.clamp(max=cfg.ratio_cap) * keep.float()  # detached
    policy = -(coeff * logp * u.weight).sum() / inputs.num_tokens

    divergence = (p - mu).abs() if cfg.divergence == "binary_tv" else binary_kl(p, mu)
    metrics = {
        **ratio_metrics(log_ratio, valid),
        "dppo/masked_frac": Metric.mean(masked_mean((~keep & valid).float(), valid)),
        "dppo/ratio_capped_frac": Metric.mean(masked_mean((ratio > cfg.ratio_cap).float(), valid)),
        "dppo/divergence_mean": Metric.mean(masked_mean(divergence, valid)),
        "loss/policy": Metric.share(policy),
        "loss/total": Metric.share(policy),
        **advantage_metrics(inputs.advantages),
    }
    return LossOutput(policy, metrics)
