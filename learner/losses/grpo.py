"""GRPO, the baseline: conditional clipping and a fixed token normalisation."""
from __future__ import annotations

import torch

from stabledrl.common.config.loss import GrpoLossConfig
from stabledrl.learner.losses.inputs import LossInputs, units
from stabledrl.learner.losses.statistics import (
    LossOutput, Metric, advantage_metrics, masked_mean, ratio_from_log, ratio_metrics,
)
from stabledrl.learner.losses.registry import register_loss


@register_loss("grpo", group_coupled=False)
def grpo_loss(inputs: LossInputs, cfg: GrpoLossConfig) -> LossOutput:
    """GRPO (arXiv 2402.03300) as d1 runs it on dLLMs (arXiv 2504.12216):

        ρ_ik = exp(log π̂_θ(o_ik) − log π̂_μ(o_ik))            (token ratios, or one per sequence)
        L = −(1/Σ|o|) Σ_i Σ_k min(ρ_ik A_i, clip(ρ_ik, 1−ε, 1+ε) A_i)  +  β (1/Σ|o|) Σ_i Σ_k KL_k3,ik
        KL_k3 = exp(log π_ref − log π_θ) − (log π_ref − log π_θ) − 1

    d1 defaults ε = 0.5, β = 0.04. The ratio is anchored at the behaviour estimate shipped with the
    sample. The clip is *conditional*: for A < 0 the min keeps the unclipped ρA, so a noise-inflated
    ρ passes straight into the gradient (docs/algorithms.md §1; ``clip/unclipped_high_neg_frac`` counts
    it). Sequence form: each sequence counts as |o_i| tokens sharing its ratio.
    """
    u = units(inputs, cfg.level)
    valid = u.weight > 0
    log_ratio = torch.where(valid, u.logp - u.behaviour_logp, torch.zeros_like(u.logp))
    ratio = ratio_from_log(log_ratio)
    eps = cfg.clip_eps
    surrogate = torch.minimum(ratio * u.advantages, ratio.clamp(1.0 - eps, 1.0 + eps) * u.advantages)
    policy = -(surrogate * u.weight).sum() / inputs.num_tokens

    kl = torch.zeros((), dtype=policy.dtype, device=policy.device)
    k3 = torch.zeros_like(u.logp)
    if cfg.kl_beta > 0:
        if u.ref_logp is None:
            raise ValueError(
                f"grpo with kl_beta={cfg.kl_beta} needs ref_logp/ref_token_logp; set kl_beta=0 to drop the KL"
            )
        d = torch.where(valid, u.ref_logp - u.logp, torch.zeros_like(u.logp))
        k3 = torch.exp(d) - d - 1.0
        kl = (k3 * u.weight).sum() / inputs.num_tokens
    total = policy + cfg.kl_beta * kl

    a = u.advantages.detach()
    r = ratio.detach()
    metrics = {
        **ratio_metrics(log_ratio, valid),
        "clip/frac_upper": Metric.mean(masked_mean(((a > 0) & (r > 1.0 + eps)).float(), valid)),
        "clip/frac_lower": Metric.mean(masked_mean(((a < 0) & (r < 1.0 - eps)).float(), valid)),
        "clip/unclipped_high_neg_frac": Metric.mean(masked_mean(((a < 0) & (r > 1.0 + eps)).float(), valid)),
        "kl/k3_mean": Metric.mean(masked_mean(k3.detach(), valid)),
        "loss/policy": Metric.share(policy),
        "loss/kl": Metric.share(cfg.kl_beta * kl),
        "loss/total": Metric.share(total),
        **advantage_metrics(inputs.advantages),
    }
    return LossOutput(total, metrics)
