"""Staircase attention: one forward over [prompt | clean | noisy] equals the per-block multi-pass
value, and no label leaks from a block's clean copy into its own noisy rows."""
import pytest
import torch

from stabledrl.common.attention import block_causal_mask, block_ids, staircase_mask
from stabledrl.common.config.estimator import StaircaseConfig
from stabledrl.common.estimators import build_inputs, estimate
from stabledrl.common.estimators.elbo import elbo_values
from stabledrl.common.estimators.staircase import staircase_views
from stabledrl.common.models import build_tiny_policy
from stabledrl.common.types import SequenceBatch, left_pad

BLOCK = 4
C = 12  # three blocks


@pytest.fixture(scope="module")
def policy():
    torch.set_num_threads(1)
    p = build_tiny_policy("sdar", block_size=BLOCK, seed=3)
    with torch.no_grad():
        p.model.lm_head.weight.mul_(12.0)  # peaked, context-dependent predictions
    return p


def _batch() -> SequenceBatch:
    gen = torch.Generator().manual_seed(7)
    ids, pm = left_pad([torch.tensor([5, 6, 7, 8, 9]), torch.tensor([10, 11])], pad_id=0)  # left padding on row 1
    completion = torch.randint(4, 90, (2, C), generator=gen)
    completion[1, 9:] = 1  # row 1: EOS at 9, so its completion mask stops at 10 tokens
    cm = torch.arange(C)[None] < torch.tensor([[C], [10]])
    return SequenceBatch(input_ids=torch.cat([ids, completion], 1), prompt_mask=pm, completion_mask=cm)


def _noisy(completion: torch.Tensor, policy) -> torch.Tensor:
    gen = torch.Generator().manual_seed(11)
    masked = torch.rand(completion.shape, generator=gen) < 0.5
    masked[:, ::BLOCK] = True  # every block has at least one masked token
    return torch.where(masked, policy.mask_token_id, completion)


def _one_pass_logits(policy, batch, clean, noisy):
    p = batch.prompt_width
    args = build_inputs(policy, batch.input_ids[:, :p], batch.prompt_mask, clean, noisy)
    inputs, attn, positions, logits_from = args
    with torch.no_grad():
        return policy(inputs, attention_mask=attn, position_ids=positions, logits_from=logits_from).logits  # [B, C, V]


def _multi_pass_logits(policy, batch, noisy):
    """Block b alone: [prompt | clean blocks < b | noisy block b] under the plain block-causal mask."""
    p, out = batch.prompt_width, []
    for b in range(C // BLOCK):
        end = (b + 1) * BLOCK
        x = torch.cat([batch.input_ids[:, : p + b * BLOCK], noisy[:, b * BLOCK : end]], 1)
        valid = torch.cat([batch.prompt_mask, torch.ones(2, end, dtype=torch.bool)], 1)
        pos = (valid.long().cumsum(1) - 1).clamp(min=0)
        mask = block_causal_mask(block_ids(batch.prompt_mask, end, BLOCK), valid)
        with torch.no_grad():
            out.append(policy(x, attention_mask=mask, position_ids=pos, logits_from=p + b * BLOCK).logits)
    return torch.cat(out, 1)


def test_staircase_mask_rules():
    pm = torch.tensor([[False, True, True]])  # one pad, two prompt tokens (prompt block -1)
    m = staircase_mask(pm, completion_width=4, block_size=2)[0, 0]  # L = 3 + 4 + 4
    clean = lambda k: 3 + k  # noqa: E731
    noisy = lambda k: 7 + k  # noqa: E731
    assert m[0, 0] and m[:, 0].sum() == 1  # the pad key is seen only by its own row
    assert m[noisy(2), 1] and m[noisy(2), 2]  # noisy rows see the prompt
    assert m[noisy(2), clean(0)] and m[noisy(2), clean(1)]  # ... and earlier clean blocks
    assert not m[noisy(2), clean(2)] and not m[noisy(2), clean(3)]  # never their own clean block
    assert m[noisy(2), noisy(3)] and not m[noisy(2), noisy(1)]  # own noisy block only
    assert m[clean(2), clean(3)] and not m[clean(1), clean(2)]  # clean copy: block-causal
    assert not m[clean(3), noisy(3)] and not m[1, clean(0)]  # nothing sees the noisy copy but itself


def test_one_pass_equals_per_block_multi_pass(policy):
    batch = _batch()
    noisy = _noisy(batch.completion_ids, policy)
    one = torch.log_softmax(_one_pass_logits(policy, batch, batch.completion_ids, noisy), -1)
    multi = torch.log_softmax(_multi_pass_logits(policy, batch, noisy), -1)
    torch.testing.assert_close(one, multi, atol=1e-5, rtol=0)


def test_staircase_estimate_equals_multi_pass_value(policy):
    batch, seeds = _batch(), torch.tensor([21, 22])
    for weighting in ("weighted", "mean"):
        cfg = StaircaseConfig(num_draws=3, weighting=weighting)
        with torch.no_grad():
            got = estimate(policy, batch, seeds, cfg)
        views, weight = staircase_views(batch, seeds, cfg, BLOCK)
        draws = []
        for j in range(cfg.num_draws):
            noisy = torch.where(views.completion[:, j], policy.mask_token_id, batch.completion_ids)
            logp = torch.log_softmax(_multi_pass_logits(policy, batch, noisy), -1)
            logp = logp.gather(-1, batch.completion_ids[..., None])[..., 0] * views.score[:, j]
            draws.append(elbo_values(logp[:, None], views.score[:, j : j + 1], weight[:, j : j + 1], weighting))
        want = torch.cat(draws, 1).mean(1)
        torch.testing.assert_close(got.sequence, want, atol=1e-5, rtol=0)


def test_no_label_leak_from_own_clean_block(policy):
    batch = _batch()
    noisy = _noisy(batch.completion_ids, policy)
    base = _one_pass_logits(policy, batch, batch.completion_ids, noisy)
    changed_b = batch.completion_ids.clone()
    changed_b[:, 4:8] = (changed_b[:, 4:8] + 17) % 80 + 4  # clean block 1 (and later) altered
    changed_b[:, 8:] = (changed_b[:, 8:] + 29) % 80 + 4
    after = _one_pass_logits(policy, batch, changed_b, noisy)
    # noisy block 1 (and block 0) rows cannot see clean block 1 or later
    torch.testing.assert_close(after[:, :8], base[:, :8], atol=1e-6, rtol=0)
    changed_prev = batch.completion_ids.clone()
    changed_prev[:, 0:4] = (changed_prev[:, 0:4] + 17) % 80 + 4  # clean block 0
    after_prev = _one_pass_logits(policy, batch, changed_prev, noisy)
    torch.testing.assert_close(after_prev[:, :4], base[:, :4], atol=1e-6, rtol=0)
    assert (after_prev[:, 4:8] - base[:, 4:8]).abs().max() > 1e-3  # block 1 does condition on block 0


def test_staircase_refuses_full_attention_family():
    policy = build_tiny_policy("llada")
    with pytest.raises(ValueError, match="block-diffusion"):
        estimate(policy, _batch(), torch.tensor([1, 2]), StaircaseConfig())
