"""Properties every registered loss must keep: global normalisation under micro-batching, DiPOD's
exact additive regulariser, no host syncs, and configs that round-trip with released defaults."""
import contextlib

import pytest
import torch
import torch.nn.functional as F

from stabledrl.common.config.base import ConfigError
from stabledrl.common.config.loss import (
    DipodLossConfig,
    DppoLossConfig,
    DrpoLossConfig,
    GrpoLossConfig,
    SpgLossConfig,
    StableDrlLossConfig,
    Wd1LossConfig,
    parse_loss_config,
)
from stabledrl.learner.losses import (
    LOSSES, LossInputs, compute_loss, group_advantages, local_counts, needs_whole_groups,
)

B, G, T, D = 8, 4, 6, 5

BASE_CASES = [
    GrpoLossConfig(level="token"),
    GrpoLossConfig(level="sequence"),
    StableDrlLossConfig(),
    StableDrlLossConfig(clip_max=1.4, clip_min=0.9),
    SpgLossConfig(),
    Wd1LossConfig(),
    DppoLossConfig(divergence="binary_tv", ratio_cap=1.3),
    DppoLossConfig(divergence="binary_kl", level="sequence"),
    DrpoLossConfig(level="token", delta=0.3),
    DrpoLossConfig(level="sequence"),
]
CASES = BASE_CASES + [DipodLossConfig(base=StableDrlLossConfig()), DipodLossConfig(base=GrpoLossConfig())]


def case_id(cfg):
    return f"{cfg.name}-{cfg.base.name}" if cfg.name == "dipod" else f"{cfg.name}-{getattr(cfg, 'level', '')}"


def toy_data(seed=0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, T + 1, (B,), generator=gen)
    group_index = torch.arange(B) // G * 7 + 3  # ids need not be 0..n-1
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 2.0])
    return {
        "theta": (0.7 * torch.randn(D, generator=gen)).requires_grad_(True),
        "features": torch.randn(B, T, D, generator=gen),
        "mask": torch.arange(T)[None, :] < lengths[:, None],
        "lengths": lengths.float(),
        "behaviour_noise": 0.6 * torch.randn(B, T, generator=gen),
        "ref_noise": 0.3 * torch.randn(B, T, generator=gen),
        "group_index": group_index,
        "advantages": group_advantages(rewards, group_index),
    }


def masked_token_mean(x, mask, lengths):
    return (x * mask).sum(1) / lengths


def build(data):
    """A toy estimator: per-token log-likelihoods of a D-parameter model, θ-differentiable."""
    mask, lengths = data["mask"], data["lengths"]
    token_logp = -F.softplus(data["features"] @ data["theta"])  # [B, T]
    behaviour_tok = (token_logp.detach() + data["behaviour_noise"]).clamp(max=-1e-3)
    ref_tok = token_logp.detach() + data["ref_noise"]
    logp = masked_token_mean(token_logp, mask, lengths)
    return LossInputs(
        logp=logp,
        behaviour_logp=masked_token_mean(behaviour_tok, mask, lengths),
        advantages=data["advantages"],
        group_index=data["group_index"],
        completion_length=lengths,
        token_logp=token_logp,
        token_mask=mask,
        behaviour_token_logp=behaviour_tok,
        ref_logp=masked_token_mean(ref_tok, mask, lengths),
        ref_token_logp=ref_tok,
        elbo=logp - F.softplus(data["features"][:, 0] @ data["theta"]),  # a looser bound than logp
        **local_counts(data["group_index"], lengths),
    )


def micro_batches(cfg, data):
    if needs_whole_groups(cfg):
        return [torch.nonzero(data["group_index"] == g).flatten() for g in data["group_index"].unique()]
    return [torch.tensor([i]) for i in range(B)]


def test_cases_cover_every_registered_loss():
    assert {cfg.name for cfg in CASES} == set(LOSSES.names())


@pytest.mark.parametrize("cfg", CASES, ids=case_id)
def test_micro_batches_with_global_counts_sum_to_the_full_batch(cfg):
    data = toy_data()
    full, metrics = compute_loss(build(data), cfg)
    (full_grad,) = torch.autograd.grad(full, data["theta"])
    total, grad = torch.zeros(()), torch.zeros(D)
    batches = micro_batches(cfg, data)
    assert len(batches) == (2 if needs_whole_groups(cfg) else B)
    for rows in batches:
        part, _ = compute_loss(build(data).select(rows), cfg)
        total = total + part.detach()
        grad += torch.autograd.grad(part, data["theta"])[0]
    torch.testing.assert_close(total, full.detach(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grad, full_grad, atol=1e-6, rtol=1e-5)
    assert full_grad.norm() > 1e-4  # a real gradient, not 0 == 0


def test_the_toy_batch_exercises_clips_and_masks():
    data = toy_data()
    _, grpo = compute_loss(build(data), GrpoLossConfig(level="token"))
    _, dppo = compute_loss(build(data), DppoLossConfig(ratio_cap=1.3))
    _, stable = compute_loss(build(data), StableDrlLossConfig(clip_max=1.4, clip_min=0.9))
    assert grpo["clip/frac_upper"].value + grpo["clip/frac_lower"].value > 0
    assert 0 < dppo["dppo/masked_frac"].value < 1 and dppo["dppo/ratio_capped_frac"].value > 0
    assert stable["clip/frac_upper"].value > 0 and stable["clip/frac_lower"].value > 0


@pytest.mark.parametrize("base", BASE_CASES, ids=case_id)
def test_dipod_adds_exactly_minus_beta_mean_elbo(base):
    data = toy_data(seed=1)
    base_value, _ = compute_loss(build(data), base)
    (base_grad,) = torch.autograd.grad(base_value, data["theta"])
    value, metrics = compute_loss(build(data), DipodLossConfig(beta=0.05, base=base))
    (grad,) = torch.autograd.grad(value, data["theta"])
    elbo_mean = build(data).elbo.mean()
    (elbo_grad,) = torch.autograd.grad(elbo_mean, data["theta"])
    torch.testing.assert_close(value.detach() - base_value.detach(), -0.05 * elbo_mean.detach())
    torch.testing.assert_close(grad - base_grad, -0.05 * elbo_grad, atol=1e-7, rtol=1e-5)
    torch.testing.assert_close(metrics["loss/elbo_reg"].value, -0.05 * elbo_mean.detach())
    assert metrics["dipod/logp_minus_elbo"].value > 0  # the toy ELBO sits below logp


@contextlib.contextmanager
def no_host_sync():
    """Make every tensor -> Python conversion raise (what .item() or `if tensor:` would do)."""

    def refuse(*_args, **_kwargs):
        raise AssertionError("a loss synchronised with the host")

    names = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "numpy")
    saved = {n: getattr(torch.Tensor, n) for n in names}
    for n in names:
        setattr(torch.Tensor, n, refuse)
    try:
        yield
    finally:
        for n, fn in saved.items():
            setattr(torch.Tensor, n, fn)


@pytest.mark.parametrize("cfg", CASES, ids=case_id)
def test_losses_never_sync_with_the_host(cfg):
    data = toy_data()
    inputs = build(data)
    with no_host_sync():
        loss, metrics = compute_loss(inputs, cfg)
        loss.backward()
    assert loss.dim() == 0 and all(m.value.dim() == 0 and not m.value.requires_grad for m in metrics.values())


def test_loss_configs_parse_with_released_defaults():
    assert parse_loss_config({"name": "grpo"}).model_dump() == {
        "name": "grpo",
        "clip_eps": 0.5,
        "kl_beta": 0.04,
        "level": "auto",
    }
    stable = parse_loss_config({"name": "stabledrl"})
    assert (stable.clip_max, stable.clip_min) == (5.0, None)
    dppo = parse_loss_config({"name": "dppo"})
    assert (dppo.divergence, dppo.tv_delta, dppo.kl_delta) == ("binary_tv", 0.15, 0.05)
    assert parse_loss_config({"name": "drpo"}).delta == 12.5
    dipod = parse_loss_config({"name": "dipod", "base": {"name": "stabledrl", "clip_max": 3}})
    assert dipod.beta == 0.05 and dipod.base == StableDrlLossConfig(clip_max=3.0)
    for name in LOSSES:
        extra = {"base": {"name": "spg"}} if name == "dipod" else {}
        assert parse_loss_config({"name": name, **extra}).name == name


@pytest.mark.parametrize(
    "data, message",
    [
        ({"name": "ppo"}, "loss.name: 'ppo' is not one of"),
        ({"name": "grpo", "clip_epsilon": 0.2}, "loss.clip_epsilon"),
        ({"name": "stabledrl", "clip_min": 6.0}, "clip_min"),
        ({"name": "dipod", "base": {"name": "dipod", "base": {"name": "spg"}}}, "loss.base"),
        ({"name": "dipod"}, "loss.base"),
        ({"name": "dppo", "divergence": "tv"}, "loss.divergence"),
    ],
)
def test_bad_loss_configs_name_the_field(data, message):
    with pytest.raises(ConfigError, match=message):
        parse_loss_config(data)
