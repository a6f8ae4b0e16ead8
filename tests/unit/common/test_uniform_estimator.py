"""The uniform-noise estimator (DiffusionGemma): the closed form equals UDLM's literal V-sum, is a
bound (<= 0, = 0 for a perfect denoiser), the staircase value equals a per-block forward through the
release's encoder/decoder split, draws depend only on the sample's seed, and with shared
corruption at theta = mu the ratio is exactly 1."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from stabledrl.common.config.estimator import StaircaseConfig, UniformStaircaseConfig
from stabledrl.common.estimators import estimate, learner_seeds
from stabledrl.common.estimators.elbo import elbo_values
from stabledrl.common.estimators.scoring import token_logp
from stabledrl.common.estimators.uniform import udlm_elbo_terms, uniform_views
from stabledrl.common.models import build_tiny_policy
from stabledrl.common.types import SequenceBatch, left_pad

pytest.importorskip("transformers.models.diffusion_gemma")
torch.set_num_threads(1)
BLOCK, C = 4, 12  # three blocks


@pytest.fixture(scope="module")
def policy():
    p = build_tiny_policy("diffusion_gemma", block_size=BLOCK, sliding_window=5, seed=2)
    with torch.no_grad():
        p.model.lm_head.weight.mul_(8.0)  # peaked, context-dependent predictions
    return p


def _batch() -> SequenceBatch:
    gen = torch.Generator().manual_seed(7)
    ids, pm = left_pad([torch.tensor([5, 6, 7, 8, 9]), torch.tensor([10, 11])], pad_id=0)  # row 1 left-padded
    completion = torch.randint(4, 90, (2, C), generator=gen)
    completion[1, 6:] = 1  # row 1: EOS at 6, inside block 1; blocks 1 (after the EOS) and 2 unscored
    cm = torch.arange(C)[None] < torch.tensor([[C], [7]])
    return SequenceBatch(input_ids=torch.cat([ids, completion], 1), prompt_mask=pm, completion_mask=cm)


def _literal_udlm(logits, x, z, alpha):
    """UDLM's continuous-time integrand written out over the vocabulary (x-bar vectors), float64: -g."""
    n = logits.shape[-1]
    p = logits.double().softmax(-1)
    a = alpha.double()[:, None]
    xb = n * a * F.one_hot(x, n).double() + 1 - a
    xbt = n * a * p + 1 - a
    xb_i, xbt_i = xb.gather(-1, z[:, None]), xbt.gather(-1, z[:, None])
    term1 = n / xb_i - n / xbt_i
    term2 = ((xb / xb_i) * (xbt_i.log() - xbt.log() + xb.log() - xb_i.log())).sum(-1, keepdim=True)
    return ((term1 - term2) / (n * a)).squeeze(-1)


def test_closed_form_equals_the_literal_vocabulary_sum_and_is_a_bound():
    g = torch.Generator().manual_seed(0)
    m, v = 256, 97
    logits = torch.randn(m, v, generator=g) * 3
    x = torch.randint(0, v, (m,), generator=g)
    z = torch.where(torch.rand(m, generator=g) < 0.5, torch.randint(0, v, (m,), generator=g), x)
    alpha = torch.rand(m, generator=g).double().clamp(1e-3, 1 - 1e-3)
    ours = udlm_elbo_terms(logits, x, z, alpha)
    ref = _literal_udlm(logits, x, z, alpha)
    torch.testing.assert_close(ours.double(), ref, rtol=1e-5, atol=1e-4)
    assert (ours <= 0).all() and (ours < -1e-3).any()  # a KL rate: never positive, here really negative
    perfect = torch.full((m, v), -30.0).scatter_(1, x[:, None], 30.0)  # DiffusionGemma's soft cap
    assert udlm_elbo_terms(perfect, x, z, alpha).abs().max() < 1e-5


def _per_block_terms(policy, batch, views, objective):
    """Brute force: block b alone through the release's split, [prompt | clean y_<b] to the encoder
    and the noisy block b to the decoder, one row at a time without padding."""
    out = torch.zeros(views.score.shape)
    p = batch.prompt_width
    for i in range(batch.input_ids.shape[0]):
        prompt = batch.input_ids[i, :p][batch.prompt_mask[i]][None]
        clean = batch.completion_ids[i]
        for j in range(views.noisy.shape[1]):
            for start in range(0, C, BLOCK):
                span = slice(start, start + BLOCK)
                sel = views.score[i, j, span]
                if not sel.any():
                    continue
                x = torch.cat([prompt, clean[None, :start], views.noisy[i, j, None, span]], 1)
                with torch.no_grad():
                    logits = policy(x, logits_from=x.shape[1] - BLOCK).logits[0]  # [BLOCK, V]
                if objective == "elbo":
                    t = udlm_elbo_terms(
                        logits[sel], clean[span][sel], views.noisy[i, j, span][sel], views.alpha[i, j, span][sel]
                    )
                else:
                    t = token_logp(logits[sel], clean[span][sel])
                out[i, j, start : start + BLOCK][sel] = t
    return out


@pytest.mark.parametrize(
    "objective,weighting", [("elbo", "weighted"), ("elbo", "mean"), ("corrupted_logp", "weighted")]
)
def test_staircase_value_equals_the_per_block_computation(policy, objective, weighting):
    batch, seeds = _batch(), torch.tensor([3, 4])
    cfg = UniformStaircaseConfig(objective=objective, weighting=weighting, num_draws=2, t_min=0.2, t_max=0.9)
    with torch.no_grad():
        ll = estimate(policy, batch, seeds, cfg)
    views = uniform_views(policy, batch, seeds, cfg)
    expected = elbo_values(_per_block_terms(policy, batch, views, objective), views.score, views.weight, weighting)
    torch.testing.assert_close(ll.sequence, expected.mean(1), rtol=1e-4, atol=1e-4)
    assert not views.score[1, :, 7:].any() and views.score[0].any(-1).all()  # nothing after row 1's EOS
    if objective == "elbo":
        assert (ll.sequence < 0).all()


def test_corruption_is_uniform_noise_seeded_per_sample(policy):
    batch = _batch()
    cfg = UniformStaircaseConfig(num_draws=3)
    a = uniform_views(policy, batch, torch.tensor([3, 4]), cfg)
    b = uniform_views(policy, batch.select([1]), torch.tensor([4]), cfg)  # row alone: same draws
    assert torch.equal(a.noisy[1], b.noisy[0]) and torch.equal(a.alpha[1], b.alpha[0])
    c = uniform_views(policy, batch, torch.tensor([5, 4]), cfg)
    assert not torch.equal(a.noisy[0], c.noisy[0])
    hit = a.corrupted & (torch.arange(C) < 7)  # corrupted real positions of both rows
    assert (
        not (a.noisy[hit] == policy.mask_token_id).all()
        and (a.noisy[~a.corrupted] == batch.completion_ids[:, None].expand(-1, 3, -1)[~a.corrupted]).all()
    )
    # row 1: the rest of block 1 after the EOS is noise, block 2 is left clean (never seen by a scored row)
    assert a.corrupted[1, :, 7:8].all() and not a.corrupted[1, :, 8:].any()


@pytest.mark.parametrize("objective", ["elbo", "corrupted_logp"])
def test_shared_corruption_at_theta_equal_mu_gives_ratio_one(policy, objective):
    batch, mask_seeds = _batch(), torch.tensor([101, 202])
    cfg = UniformStaircaseConfig(objective=objective, num_draws=2)
    with torch.no_grad():
        behaviour = estimate(policy, batch, mask_seeds, cfg).sequence
    learner = estimate(policy, batch, learner_seeds(mask_seeds, "shared"), cfg).sequence  # grad on, as the learner
    assert torch.equal(torch.exp(learner.detach() - behaviour), torch.ones(2))
    learner.sum().backward()
    assert policy.model.lm_head.weight.grad is not None and policy.model.lm_head.weight.grad.abs().sum() > 0
    policy.zero_grad()
    independent = estimate(policy, batch, learner_seeds(mask_seeds, "independent", 0), cfg).sequence.detach()
    assert not torch.equal(independent, behaviour)


def test_noise_kinds_do_not_mix(policy):
    batch = _batch()
    with pytest.raises(ValueError, match="does not corrupt with the 'uniform' noise"):
        estimate(policy, batch, torch.tensor([1, 2]), StaircaseConfig())
    sdar = build_tiny_policy("sdar", block_size=BLOCK)
    with pytest.raises(ValueError, match="does not corrupt with the 'mask' noise"):
        estimate(sdar, batch, torch.tensor([1, 2]), UniformStaircaseConfig())
