"""wd1: a ratio-free weighted likelihood with advantage-softmax weights."""
from __future__ import annotations


from stabledrl.common.config.loss import Wd1LossConfig
from stabledrl.learner.losses.advantages import group_softmax, same_group
from stabledrl.learner.losses.inputs import LossInputs
from stabledrl.learner.losses.statistics import LossOutput, Metric, advantage_metrics, ess_metrics
from stabledrl.learner.losses.registry import register_loss


@register_loss("wd1", group_coupled=True)
def wd1_loss(inputs: LossInputs, cfg: Wd1LossConfig) -> LossOutput:
    """wd1 (arXiv 2507.08838):

        w⁺_i = softmax_{group}(A)_i,   w⁻_i = softmax_{group}(−A)_i
        L = (1/num_groups) Σ_groups Σ_{i in group} (−w⁺_i + w⁻_i) · log π̂_θ(o_i)

    Raise the likelihood of the group's better completions, lower that of its worse ones; no
    ratio, no old or reference policy (``behaviour_logp`` is unused). A degenerate group (all A
    equal) has w⁺ = w⁻ and contributes nothing. Group-coupled: the softmax runs over the group.
    """
    same = same_group(inputs.group_index)
    advantages = inputs.advantages.float()
    w_pos = group_softmax(advantages, same)  # [B]
    w_neg = group_softmax(-advantages, same)  # [B]
    logp = inputs.logp.float()
    positive = -(w_pos * logp).sum() / inputs.num_groups
    negative = (w_neg * logp).sum() / inputs.num_groups
    total = positive + negative
    metrics = {
        **ess_metrics(w_pos, same, prefix="wd1/pos_ess"),
        **ess_metrics(w_neg, same, prefix="wd1/neg_ess"),
        "loss/policy": Metric.share(total),
        "loss/positive": Metric.share(positive),
        "loss/negative": Metric.share(negative),
        "loss/total": Metric.share(total),
        **advantage_metrics(advantages),
    }
    return LossOutput(total, metrics)
