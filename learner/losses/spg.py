"""SPG: a ratio-free policy gradient on the sandwiched likelihood bound."""
from __future__ import annotations


from stabledrl.common.config.loss import SpgLossConfig
from stabledrl.learner.losses.inputs import LossInputs
from stabledrl.learner.losses.statistics import LossOutput, Metric, advantage_metrics
from stabledrl.learner.losses.registry import register_loss


@register_loss("spg", group_coupled=False)
def spg_loss(inputs: LossInputs, cfg: SpgLossConfig) -> LossOutput:
    """SPG (arXiv 2510.09541):

        L = −Σ_i |o_i| A_i ℓ_SPG(o_i) / Σ_i |o_i|

    No ratio and no behaviour estimate: ℓ_SPG is ``inputs.logp`` from the spg_sandwich estimator
    (ELBO for A > 0, ω·EUBO_β + (1−ω)·ELBO for A ≤ 0, a per-masked-token mean), weighted by the
    completion length so that every token counts once; Σ|o| is the step's ``num_tokens``.
    """
    length = inputs.completion_length.float()
    advantages = inputs.advantages.float()
    policy = -(length * advantages * inputs.logp.float()).sum() / inputs.num_tokens
    metrics = {
        "loss/policy": Metric.share(policy),
        "loss/total": Metric.share(policy),
        "logp/mean": Metric.mean(inputs.logp.float().mean()),
        **advantage_metrics(advantages),
    }
    return LossOutput(policy, metrics)
