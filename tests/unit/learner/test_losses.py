"""The loss family's math on hand-built cases: clipping, self-normalisation, masks, gradient weights."""
import math

import pytest
import torch

from stabledrl.common.config.loss import (
    DipodLossConfig,
    DppoLossConfig,
    DrpoLossConfig,
    GrpoLossConfig,
    SpgLossConfig,
    StableDrlLossConfig,
    Wd1LossConfig,
)
from stabledrl.learner.losses import LOSSES, LossInputs, get_loss, group_advantages, needs_whole_groups
from stabledrl.learner.losses.advantages import group_softmax, same_group
from stabledrl.learner.losses.dppo import binary_kl


def seq_inputs(logp, behaviour_logp, advantages, group_index=None, length=None, **extra):
    """Sequence-level inputs whose global counts are this batch's own."""
    b = logp.shape[0]
    group_index = torch.zeros(b, dtype=torch.long) if group_index is None else torch.as_tensor(group_index)
    length = torch.ones(b) if length is None else torch.as_tensor(length, dtype=torch.float32)
    return LossInputs(
        logp=logp,
        behaviour_logp=behaviour_logp,
        advantages=torch.as_tensor(advantages, dtype=torch.float32),
        group_index=group_index,
        completion_length=length,
        num_groups=float(len(set(group_index.tolist()))),
        num_samples=float(b),
        num_tokens=float(length.sum()),
        **extra,
    )


def token_inputs(p, mu, advantages, **extra):
    """One token per row: π = p, μ = mu (probabilities); token_logp is the leaf to differentiate."""
    token_logp = torch.log(torch.tensor(p)).reshape(-1, 1).requires_grad_(True)
    behaviour = torch.log(torch.tensor(mu)).reshape(-1, 1)
    b = token_logp.shape[0]
    inputs = seq_inputs(
        token_logp[:, 0], behaviour[:, 0], advantages, group_index=torch.arange(b),
        token_logp=token_logp, token_mask=torch.ones(b, 1, dtype=torch.bool), behaviour_token_logp=behaviour, **extra,
    )
    return inputs, token_logp


# ---------------------------------------------------------------- registry and advantages


def test_registry_names_every_loss_and_unknown_names_list_the_valid_ones():
    assert LOSSES.names() == ["dipod", "dppo", "drpo", "grpo", "spg", "stabledrl", "wd1"]
    with pytest.raises(KeyError, match="valid: dipod, dppo, drpo, grpo, spg, stabledrl, wd1"):
        get_loss("ppo")


def test_group_coupling_is_an_attribute_and_dipod_inherits_its_base():
    coupled = {name: get_loss(name).group_coupled for name in LOSSES}
    assert coupled == {"dipod": False, "dppo": False, "drpo": False, "grpo": False, "spg": False,
                       "stabledrl": True, "wd1": True}
    assert needs_whole_groups(DipodLossConfig(base=StableDrlLossConfig()))
    assert needs_whole_groups(DipodLossConfig(base=Wd1LossConfig()))
    assert not needs_whole_groups(DipodLossConfig(base=GrpoLossConfig()))


def test_group_advantages_centre_scale_and_zero_degenerate_groups():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 5.0])
    groups = torch.tensor([17, 17, 17, 17, 3, 3, 3, 40])  # any ids; id 40 is a group of one
    plain = group_advantages(rewards, groups, scale="none")
    assert plain.tolist() == [0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0]
    scaled = group_advantages(rewards, groups, scale="std", eps=1e-6)
    unbiased_std = math.sqrt((4 * 0.25) / 3)
    torch.testing.assert_close(scaled[:4], plain[:4] / (unbiased_std + 1e-6))
    assert torch.equal(scaled[4:], torch.zeros(4))  # all-equal group and singleton: exactly 0, no NaN


@pytest.mark.parametrize("value", [0.1, 0.7, 3.456, 2.0 / 3.0, -1.3])
@pytest.mark.parametrize("size", [6, 16])
def test_group_advantages_of_equal_rewards_are_exactly_zero(value, size):
    # Σr/n is not exactly r for these values in float32 (16 × 3.456 gave |A| = 0.19 under "std")
    rewards = torch.full((size,), value)
    for scale in ("std", "none"):
        adv = group_advantages(rewards, torch.zeros(size, dtype=torch.long), scale=scale)
        assert torch.equal(adv, torch.zeros(size)), scale


# Reference values: d1's diffu_grpo_trainer and the StableDRL release's llada_svpo advantage lines
# (rewards − group mean, no std), and TRL's (÷ (std + 1e-4)), run on these rewards in groups of 4.
_REF_REWARDS = [2.875, 0.5, 3.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.25, 4.0, 2.0, 0.125]
_D1_ADVANTAGES = [1.28125, -1.09375, 1.40625, -1.59375, 0.0, 0.0, 0.0, 0.0, -1.34375, 2.40625, 0.40625, -1.46875]
_TRL_STD_ADVANTAGES = [0.8182039856910706, -0.6984668374061584, 0.8980287909507751, -1.017765998840332, 0.0, 0.0,
                       0.0, 0.0, -0.7389990091323853, 1.3233238458633423, 0.22341831028461456, -0.8077430725097656]


def test_group_advantages_match_the_releases():
    groups = torch.arange(12) // 4
    rewards = torch.tensor(_REF_REWARDS)
    assert group_advantages(rewards, groups, scale="none").tolist() == _D1_ADVANTAGES
    torch.testing.assert_close(group_advantages(rewards, groups, scale="std"), torch.tensor(_TRL_STD_ADVANTAGES))


# ---------------------------------------------------------------- StableDRL


def test_stabledrl_weights_are_the_clipped_group_softmax_and_sum_to_one():
    log_w = torch.tensor([0.0, math.log(100.0), -1.0, 2.0, 0.5, math.log(3.0)])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    logp = torch.zeros(6, requires_grad=True)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, 2.0])
    loss, metrics = get_loss("stabledrl")(seq_inputs(logp, logp.detach() - log_w, adv, groups), StableDrlLossConfig())
    loss.backward()
    w_bar = log_w.clamp(max=math.log(5.0)).exp()
    expected = torch.cat([w_bar[:3] / w_bar[:3].sum(), w_bar[3:] / w_bar[3:].sum()])
    weights = -logp.grad * 2 / adv  # ∂L/∂logp_i = −w̃_i A_i / num_groups
    torch.testing.assert_close(weights, expected)
    torch.testing.assert_close(weights[:3].sum(), torch.tensor(1.0))
    torch.testing.assert_close(weights[3:].sum(), torch.tensor(1.0))
    ess = [1 / (expected[:3] ** 2).sum(), 1 / (expected[3:] ** 2).sum()]
    torch.testing.assert_close(metrics["ess/mean"].value, (ess[0] + ess[1]) / 2)
    torch.testing.assert_close(metrics["ess/frac"].value, (ess[0] + ess[1]) / 6)
    torch.testing.assert_close(metrics["clip/frac_upper"].value, torch.tensor(2 / 6))  # 100 and e² exceed C


def per_sample_grads(theta, logp):
    return torch.stack([torch.autograd.grad(logp[i], theta, retain_graph=True)[0] for i in range(logp.shape[0])])


def toy_group(seed, g=6, d=4, spread=4.0):
    gen = torch.Generator().manual_seed(seed)
    theta = torch.randn(d, generator=gen, requires_grad=True)
    x = torch.randn(g, d, generator=gen)
    logp = -torch.nn.functional.softplus(x @ theta)  # [G] a smooth per-sample log-likelihood
    behaviour = logp.detach() + spread * torch.randn(g, generator=gen)  # wildly noisy ratios
    adv = group_advantages(torch.randn(g, generator=gen), torch.zeros(g, dtype=torch.long))
    return theta, logp, behaviour, adv


@pytest.mark.parametrize("seed", range(20))
def test_stabledrl_gradient_is_a_convex_combination_of_per_sample_gradients(seed):
    theta, logp, behaviour, adv = toy_group(seed)
    grads = per_sample_grads(theta, logp)  # [G, d] ∇ℓ_i, obtained one sample at a time
    loss, _ = get_loss("stabledrl")(seq_inputs(logp, behaviour, adv), StableDrlLossConfig())
    (grad,) = torch.autograd.grad(loss, theta)
    log_w = (logp.detach() - behaviour).clamp(max=math.log(5.0))
    w = log_w.exp() / log_w.exp().sum()  # hand-computed self-normalised weights, one group
    assert (w >= 0).all() and torch.isclose(w.sum(), torch.tensor(1.0))
    torch.testing.assert_close(grad, -(w[:, None] * adv[:, None] * grads).sum(0), atol=1e-6, rtol=1e-5)
    bound = (adv[:, None] * grads).norm(dim=1).max()
    assert grad.norm() <= bound + 1e-6


def test_inflated_negative_ratio_spikes_grpo_but_not_stabledrl():
    """One A<0 sample's ratio is inflated ×1, ×10, ×100, ×1000 by estimator noise."""
    norms = {"grpo": [], "stabledrl": []}
    for inflation in (1.0, 10.0, 100.0, 1000.0):
        theta, logp, _, _ = toy_group(seed=3, g=4, spread=0.0)
        adv = torch.tensor([-1.5, 0.5, 0.5, 0.5])
        behaviour = logp.detach().clone()
        behaviour[0] -= math.log(inflation)
        grads = per_sample_grads(theta, logp)
        bound = (adv[:, None] * grads).norm(dim=1).max()
        for name, cfg in (("grpo", GrpoLossConfig(kl_beta=0.0)), ("stabledrl", StableDrlLossConfig())):
            loss, metrics = get_loss(name)(seq_inputs(logp, behaviour, adv), cfg)
            (grad,) = torch.autograd.grad(loss, theta, retain_graph=True)
            norms[name].append(grad.norm())
        assert norms["stabledrl"][-1] <= bound + 1e-6
    g = norms["grpo"]
    assert g[0] < g[1] < g[2] < g[3] and g[3] > 50 * g[1]  # grows with the inflation, unbounded
    s = norms["stabledrl"]
    torch.testing.assert_close(s[1], s[3])  # clipped at C = 5: ×10 and ×1000 give the same step


def test_grpo_leaves_an_inflated_ratio_unclipped_when_a_is_negative():
    for adv, expected_grad in ((-1.0, 3.0), (1.0, 0.0)):  # ρ = 3, ε = 0.5: clipped only for A > 0
        logp = torch.zeros(1, requires_grad=True)
        inputs = seq_inputs(logp, torch.tensor([-math.log(3.0)]), [adv])
        loss, metrics = get_loss("grpo")(inputs, GrpoLossConfig(kl_beta=0.0))
        loss.backward()
        torch.testing.assert_close(logp.grad, torch.tensor([expected_grad]))  # −A·ρ = 3 for A = −1
        assert metrics["clip/unclipped_high_neg_frac"].value.item() == (1.0 if adv < 0 else 0.0)
        assert metrics["clip/frac_upper"].value.item() == (1.0 if adv > 0 else 0.0)


@pytest.mark.parametrize("adv", [-1.0, 1.0])
def test_stabledrl_clips_an_inflated_ratio_whatever_the_sign(adv):
    logp = torch.zeros(2, requires_grad=True)
    behaviour = torch.tensor([-math.log(100.0), 0.0])  # ratios 100 and 1
    loss, _ = get_loss("stabledrl")(seq_inputs(logp, behaviour, [adv, -adv]), StableDrlLossConfig())
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([-adv * 5 / 6, adv * 1 / 6]))  # w̃ = (5, 1)/6


# ---------------------------------------------------------------- DPPO and DRPO


def test_dppo_binary_tv_mask_and_gradient_match_the_formula():
    p = [0.9, 0.3, 0.3, 0.9, 0.7, 0.2]
    mu = [0.6, 0.6, 0.6, 0.6, 0.6, 0.1]
    adv = [1.0, 1.0, -1.0, -1.0, 1.0, 2.0]
    keep = torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0, 1.0])  # by hand: |π−μ| > 0.15 in A's direction
    inputs, token_logp = token_inputs(p, mu, adv)
    cfg = DppoLossConfig(divergence="binary_tv", ratio_cap=1.5)
    loss, metrics = get_loss("dppo")(inputs, cfg)
    loss.backward()
    ratio = torch.tensor(p) / torch.tensor(mu)
    expected = -torch.tensor(adv) * ratio.clamp(max=1.5) * keep / len(p)  # −A·sg(min(r,C))·M / Σ|o|
    torch.testing.assert_close(token_logp.grad[:, 0], expected)
    torch.testing.assert_close(metrics["dppo/masked_frac"].value, torch.tensor(2 / 6))


def test_dppo_binary_kl_mask_matches_the_formula():
    torch.testing.assert_close(
        binary_kl(torch.tensor(0.9), torch.tensor(0.6)), torch.tensor(0.311239), atol=1e-5, rtol=0
    )
    p = [0.9, 0.65, 0.45, 0.4, 0.3]
    mu = [0.6, 0.6, 0.6, 0.6, 0.6]
    adv = [1.0, 1.0, -1.0, -1.0, 1.0]
    # KL(Bern(μ)‖Bern(π)) = 0.311, 0.005, 0.045, 0.081, 0.192: masked when > 0.05 and π moved with A
    keep = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0])
    inputs, token_logp = token_inputs(p, mu, adv)
    loss, metrics = get_loss("dppo")(inputs, DppoLossConfig(divergence="binary_kl"))
    loss.backward()
    ratio = torch.tensor(p) / torch.tensor(mu)
    torch.testing.assert_close(token_logp.grad[:, 0], -torch.tensor(adv) * ratio * keep / len(p))
    torch.testing.assert_close(metrics["dppo/masked_frac"].value, torch.tensor(2 / 5))


@pytest.mark.parametrize("delta", [0.5, 12.5])
def test_drpo_gradient_weight_matches_its_closed_form(delta):
    p = [0.9, 0.3, 0.3, 0.9, 0.65, 0.2]
    mu = [0.2, 0.6, 0.6, 0.6, 0.6, 0.1]
    adv = [1.0, 1.0, -1.0, -1.0, 0.5, -2.0]
    inputs, token_logp = token_inputs(p, mu, adv)
    loss, metrics = get_loss("drpo")(inputs, DrpoLossConfig(delta=delta))
    loss.backward()
    pi, m, a = torch.tensor(p), torch.tensor(mu), torch.tensor(adv)
    r = pi / m
    weight = 1 - torch.sign(a * (r - 1)) * (pi - m).abs() / delta
    # ∂ℓ/∂log π = (∂ℓ/∂r)·r = −A·weight·r, over Σ|o| tokens
    torch.testing.assert_close(token_logp.grad[:, 0], -a * weight * r / len(p))
    torch.testing.assert_close(metrics["drpo/grad_weight_mean"].value, weight.mean())
    if delta == 0.5:  # π − μ = 0.7 > δ in A's direction: the weight turned corrective
        assert weight[0] < 0 and metrics["drpo/corrective_frac"].value > 0


def test_drpo_uses_the_sequence_form_without_token_values():
    logp = torch.log(torch.tensor([0.5, 0.2])).requires_grad_(True)
    behaviour = torch.log(torch.tensor([0.4, 0.4]))
    inputs = seq_inputs(logp, behaviour, [1.0, -1.0], group_index=[0, 0], length=[3.0, 5.0])
    loss, _ = get_loss("drpo")(inputs, DrpoLossConfig(delta=0.25))
    loss.backward()
    pi, m, a, n = (
        torch.tensor([0.5, 0.2]),
        torch.tensor([0.4, 0.4]),
        torch.tensor([1.0, -1.0]),
        torch.tensor([3.0, 5.0]),
    )
    r = pi / m
    weight = 1 - torch.sign(a * (r - 1)) * (pi - m).abs() / 0.25
    torch.testing.assert_close(logp.grad, -a * weight * r * n / 8.0)


# ---------------------------------------------------------------- ratio-free losses and GRPO's KL


def test_spg_and_wd1_gradients_match_their_formulas():
    logp = torch.tensor([-1.0, -2.0, -0.5, -3.0], requires_grad=True)
    adv = torch.tensor([1.0, -1.0, 0.0, 0.0])  # second group is degenerate
    groups = torch.tensor([0, 0, 1, 1])
    inputs = seq_inputs(logp, torch.zeros(4), adv, groups, length=[2.0, 4.0, 1.0, 3.0])
    get_loss("spg")(inputs, SpgLossConfig())[0].backward()
    torch.testing.assert_close(logp.grad, -torch.tensor([2.0, 4.0, 1.0, 3.0]) * adv / 10.0)
    logp.grad = None
    get_loss("wd1")(inputs, Wd1LossConfig())[0].backward()
    same = same_group(groups)
    expected = (-group_softmax(adv, same) + group_softmax(-adv, same)) / 2
    torch.testing.assert_close(logp.grad, expected)
    assert torch.equal(logp.grad[2:], torch.zeros(2))  # degenerate group: the two terms cancel


def test_grpo_k3_kl_gradient_and_token_normalisation():
    token_logp = torch.log(torch.tensor([[0.5, 0.4, 0.9], [0.2, 0.7, 0.3]])).requires_grad_(True)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    ref = torch.log(torch.tensor([[0.6, 0.4, 0.5], [0.1, 0.7, 0.6]]))
    inputs = seq_inputs(
        torch.zeros(2), torch.zeros(2), [0.0, 0.0], length=[2.0, 3.0], token_logp=token_logp,
        token_mask=mask, behaviour_token_logp=token_logp.detach(), ref_token_logp=ref,
    )
    loss, metrics = get_loss("grpo")(inputs, GrpoLossConfig())  # A = 0: only β·KL remains
    loss.backward()
    d = ref - token_logp.detach()
    expected = 0.04 * (1 - torch.exp(d)) * mask / 5.0  # ∂k3/∂log π = 1 − exp(log π_ref − log π)
    torch.testing.assert_close(token_logp.grad, expected)
    k3 = (torch.exp(d) - d - 1) * mask
    torch.testing.assert_close(loss.detach(), 0.04 * k3.sum() / 5.0)
    with pytest.raises(ValueError, match="kl_beta"):
        get_loss("grpo")(seq_inputs(torch.zeros(1), torch.zeros(1), [1.0]), GrpoLossConfig())


def test_dipod_elbo_minus_behaviour_under_the_spg_sandwich():
    # the learner's inputs under spg_sandwich (learner/worker.py): logp = the sandwich value, elbo =
    # ELBO_θ, and behaviour_logp = ELBO_μ shifted by (logp − ELBO_θ) so that the ratio compares ELBOs
    sandwich = torch.tensor([-3.0, -5.0, -2.5])
    elbo_theta = torch.tensor([-4.0, -7.5, -2.75])
    elbo_mu = torch.tensor([-4.5, -7.0, -3.0])
    shifted = elbo_mu + (sandwich - elbo_theta)
    inputs = seq_inputs(sandwich, shifted, [1.0, -1.0, 0.5], elbo=elbo_theta)
    _, metrics = get_loss("dipod")(inputs, DipodLossConfig(base=SpgLossConfig()))
    torch.testing.assert_close(metrics["dipod/elbo_minus_behaviour"].value, (elbo_theta - elbo_mu).mean())


# rewards (correctness) of one group each and dLLM-RL's reward/rl_reward.py z_score_normalize on them (a
# scratch run of that function, extracted from the release's file)
DLLM_RL_Z = [
    ([1.0] * 5 + [0.0] * 11, [1.483239697419] * 5 + [-0.674199862463] * 11),
    ([1.0, 0.0], [1.0, -1.0]),
    ([0.0] * 16, [0.0] * 16),
    ([1.0] * 15 + [0.0], [0.258198889747] * 15 + [-3.872983346207]),
    ([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0], [1.0, -1.0, -1.0, 1.0, 1.0, -1.0, 1.0, -1.0]),
]


def test_population_std_advantages_are_dllm_rls_z_scores():
    from stabledrl.learner.losses import group_advantages

    rewards = torch.tensor([r for rs, _ in DLLM_RL_Z for r in rs])
    group_index = torch.tensor([g for g, (rs, _) in enumerate(DLLM_RL_Z) for _ in rs])
    want = torch.tensor([a for _, advs in DLLM_RL_Z for a in advs])
    torch.testing.assert_close(group_advantages(rewards, group_index, "population_std"), want, atol=1e-6, rtol=1e-6)
    unbiased = group_advantages(rewards[:16], group_index[:16], "std")  # TRL's: 3.2% smaller at G = 16
    assert float(unbiased[0] / want[0]) == pytest.approx((15 / 16) ** 0.5, rel=1e-3)  # and TRL's eps
