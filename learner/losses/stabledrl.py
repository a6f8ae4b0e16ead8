"""StableDRL: unconditional clipping and self-normalised weights within each group."""
from __future__ import annotations

import math

import torch

from stabledrl.common.config.loss import StableDrlLossConfig
from stabledrl.learner.losses.advantages import group_softmax, same_group
from stabledrl.learner.losses.inputs import LossInputs
from stabledrl.learner.losses.statistics import (
    LossOutput, Metric, advantage_metrics, ess_metrics, masked_mean, ratio_metrics,
)
from stabledrl.learner.losses.registry import register_loss


@register_loss("stabledrl", group_coupled=True)
def stabledrl_loss(inputs: LossInputs, cfg: StableDrlLossConfig) -> LossOutput:
    """StableDRL (arXiv 2603.06743), as released for LLaDA-8B:

        log w_i = (ELBO_θ(o_i) − ELBO_μ(o_i)).detach()
        log w̄_i = min(log w_i, log C)        C = 5, whatever the sign of A_i (optional lower bound)
        w̃_i     = exp(log w̄_i) / Σ_{j in group(i)} exp(log w̄_j)      (Σ_group w̃ = 1, no 1/G)
        L       = −(1/num_groups) Σ_groups Σ_{i in group} w̃_i A_i ℓ_θ(o_i)

    ℓ_θ is ``inputs.logp`` (the SPG sandwich in the release, any estimator in general), and the
    weights compare it with ``behaviour_logp`` from the same estimator. Because w̃ is a detached
    convex combination, ∇L = −(1/num_groups) Σ_g Σ_i w̃_i A_i ∇ℓ_i: per group its norm never
    exceeds max_i ‖A_i ∇ℓ_i‖, however noisy the ratios. Group-coupled: the softmax needs the
    whole group in one micro-batch.
    """
    logp = inputs.logp.float()
    log_w = (logp - inputs.behaviour_logp.float()).detach()
    log_upper = math.log(cfg.clip_max)
    log_w_bar = log_w.clamp(max=log_upper)
    if cfg.clip_min is not None:
        log_w_bar = log_w_bar.clamp(min=math.log(cfg.clip_min))
    same = same_group(inputs.group_index)
    weights = group_softmax(log_w_bar, same)  # [B] self-normalised within each group
    advantages = inputs.advantages.float()
    policy = -(weights * advantages * logp).sum() / inputs.num_groups

    valid = torch.ones_like(log_w, dtype=torch.bool)
    metrics = {
        **ratio_metrics(log_w, valid),
        "clip/frac_upper": Metric.mean(masked_mean((log_w > log_upper).float(), valid)),
        **ess_metrics(weights, same),
        "loss/policy": Metric.share(policy),
        "loss/total": Metric.share(policy),
        **advantage_metrics(advantages),
    }
    if cfg.clip_min is not None:
        metrics["clip/frac_lower"] = Metric.mean(masked_mean((log_w < math.log(cfg.clip_min)).float(), valid))
    return LossOutput(policy, metrics)
