"""DiPOD: any base loss plus an on-policy ELBO regulariser that keeps the bound tight."""
from __future__ import annotations


from stabledrl.common.config.loss import DipodLossConfig
from stabledrl.learner.losses.inputs import LossInputs
from stabledrl.learner.losses.statistics import LossOutput, Metric
from stabledrl.learner.losses.registry import get_loss, register_loss


@register_loss("dipod", group_coupled=False, wraps_base=True)
def dipod_loss(inputs: LossInputs, cfg: DipodLossConfig) -> LossOutput:
    """DiPOD (arXiv 2606.13795):

        L = L_base − β_D · (1/num_samples) Σ_i ELBO_θ(o_i)        β_D = 0.05, same rollout batch

    ELBO = log π − D with D ≥ 0. Reward-seeking updates can grow D ("double drift": the bound
    drifts from log π, then the proxy gradient drifts from the true one; for A < 0 the model can
    lower the ELBO by loosening the bound instead of lowering log π). Raising the ELBO on the
    policy's own samples keeps the bound tight. ``inputs.elbo`` may be the very tensor ``logp``.

    Wraps any registered non-dipod loss (``cfg.base``) and inherits its group coupling. Logged
    likelihood-gap proxies (means over the rows here):
      dipod/elbo_mean              the ELBO level itself (a falling level under a rising reward is
                                   the drift's signature);
      dipod/elbo_minus_behaviour   ELBO_θ − ELBO_μ on μ's samples: how far the bound moved since
                                   generation. Logged as logp − behaviour_logp, the ratio's own log:
                                   under spg_sandwich the learner shifts behaviour_logp by
                                   (ℓ_θ − ELBO_θ) so that logp − behaviour_logp = ELBO_θ − ELBO_μ
                                   (learner/worker.py); ELBO_θ − behaviour_logp would then be off by
                                   that slack. Without the sandwich logp is the ELBO and the two agree;
      dipod/logp_minus_elbo        ℓ_θ − ELBO_θ when the base loss reads a different (e.g.
                                   sandwich) estimate: a proxy for the bound's slack D; 0 when the
                                   two are one tensor.
    """
    if inputs.elbo is None:
        raise ValueError("dipod needs inputs.elbo (the on-policy ELBO under θ; pass logp itself if it is the ELBO)")
    base_loss, base_metrics = get_loss(cfg.base.name)(inputs, cfg.base)
    elbo = inputs.elbo.float()
    regulariser = -cfg.beta * elbo.sum() / inputs.num_samples
    total = base_loss + regulariser
    e = elbo.detach()
    metrics = {
        **base_metrics,
        "loss/elbo_reg": Metric.share(regulariser),
        "loss/total": Metric.share(total),
        "dipod/elbo_mean": Metric.mean(e.mean()),
        "dipod/elbo_minus_behaviour": Metric.mean(
            (inputs.logp.detach().float() - inputs.behaviour_logp.float()).mean()
        ),
        "dipod/logp_minus_elbo": Metric.mean((inputs.logp.detach().float() - e).mean()),
    }
    return LossOutput(total, metrics)
