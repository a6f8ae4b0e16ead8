"""Mask constructions checked against their definitions: SPG's block-wise masks and sandwich,
DiffuCoder's complementary pairs, TraceRL's trajectory states (with shrink)."""
import math

import pytest
import torch

from stabledrl.common.attention import block_causal_mask, block_ids
from stabledrl.common.config.estimator import BlockRandomConfig, CoupledConfig, SPGSandwichConfig, TrajectoryConfig
from stabledrl.common.estimators import estimate, score_views
from stabledrl.common.estimators.block_random import block_random_views
from stabledrl.common.estimators.coupled import coupled_views
from stabledrl.common.estimators.trajectory import collapse_steps, trajectory_rounds
from stabledrl.common.models import build_tiny_policy
from stabledrl.common.types import SequenceBatch, left_pad

C = 16


@pytest.fixture(scope="module")
def policy():
    torch.set_num_threads(1)
    p = build_tiny_policy("llada", seed=2)
    with torch.no_grad():
        p.model.lm_head.weight.mul_(10.0)
    return p


def _batch(lengths=(C, 11, 3), advantages=(1.0, -1.0, 0.0)) -> SequenceBatch:
    g = torch.Generator().manual_seed(3)
    ids, pm = left_pad([torch.tensor([5, 6, 7, 8]), torch.tensor([9]), torch.tensor([10, 11])], pad_id=0)
    comp = torch.randint(4, 90, (3, C), generator=g)
    lengths = torch.tensor(lengths)
    return SequenceBatch(
        input_ids=torch.cat([ids, comp], 1),
        prompt_mask=pm,
        completion_mask=torch.arange(C)[None] < lengths[:, None],
        advantages=torch.tensor(advantages),
    )


@pytest.mark.parametrize("mask_clean_blocks", [True, False])
def test_block_random_masks_follow_spg(mask_clean_blocks):
    batch = _batch()
    lengths = batch.completion_mask.sum(1)
    cfg = BlockRandomConfig(block_length=4, num_draws=3, mask_clean_blocks=mask_clean_blocks)
    seen_noise = False
    for seed in range(40):
        views, blocks = block_random_views(batch, torch.tensor([seed, seed + 1, seed + 2]), cfg)
        for i in range(3):
            n = int(lengths[i])
            covered = -(-n // 4)
            if covered == C // 4 or covered == 1:  # a permutation of the canvas blocks: distinct draws
                assert len(set(blocks[i].tolist())) == min(3, covered)
            for j in range(3):
                b, start = int(blocks[i, j]), int(blocks[i, j]) * 4
                noise = views.completion[i, j]
                assert 0 <= b < covered
                assert noise[start + 4 :].all() and noise[n:].all()  # later blocks and after-EOS canvas
                assert 1 <= int(noise[start : min(start + 4, n)].sum()) <= min(4, n - start)
                assert mask_clean_blocks or not noise[:start].any()
                seen_noise |= bool(noise[:start].any())
                assert torch.equal(views.score[i, j], noise & batch.completion_mask[i])
    assert seen_noise == mask_clean_blocks


def test_spg_sandwich_uses_elbo_for_positive_and_the_mix_otherwise(policy):
    batch, seeds = _batch(), torch.tensor([5, 6, 7])
    cfg = SPGSandwichConfig(block_length=4, num_draws=3)
    with torch.no_grad():
        sandwich = estimate(policy, batch, seeds, cfg)
        plain = estimate(
            policy,
            batch,
            seeds,
            BlockRandomConfig(**cfg.model_dump(exclude={"name", "logp_estimation", "mix_weight", "eubo_beta"})),
        )
        views, _ = block_random_views(batch, seeds, cfg)
        logp = score_views(policy, batch, views).double()  # [B, n, C]
    assert torch.equal(sandwich.elbo, plain.sequence)  # the same draws, bitwise
    assert sandwich.sequence[0] == sandwich.elbo[0]  # A > 0
    # EUBO_beta by its definition, token by token, in float64
    beta, n = cfg.eubo_beta, cfg.num_draws
    lengths = batch.completion_mask.sum(1)
    for i in (1, 2):  # A <= 0
        t = [float(views.score[i, j].sum()) / float(lengths[i]) for j in range(n)]
        logs = []
        for k in range(C):
            avg = sum(math.exp(beta * logp[i, j, k]) / t[j] for j in range(n) if views.score[i, j, k]) / n
            if avg > 0:
                logs.append(math.log(avg))
        eubo = sum(logs) / len(logs) / beta
        assert math.isclose(float(sandwich.diagnostics["eubo"][i]), eubo, abs_tol=1e-4)
        mix = 0.5 * eubo + 0.5 * float(sandwich.elbo[i])
        assert math.isclose(float(sandwich.sequence[i]), mix, abs_tol=1e-4)
    with pytest.raises(ValueError, match="advantages"):
        estimate(policy, SequenceBatch(batch.input_ids, batch.prompt_mask, batch.completion_mask), seeds, cfg)


def test_coupled_pairs_score_every_completion_token_exactly_once(policy):
    batch, seeds = _batch(), torch.tensor([8, 9, 10])
    cfg = CoupledConfig(num_draws=2)
    views, weights = coupled_views(batch, seeds, cfg)
    for j in range(cfg.num_draws):
        first, second = views.completion[:, 1 + 2 * j], views.completion[:, 2 + 2 * j]
        assert torch.equal(first ^ second, torch.ones_like(first))  # complementary on the whole canvas
        scored = views.score[:, 1 + 2 * j].long() + views.score[:, 2 + 2 * j].long()
        assert torch.equal(scored, batch.completion_mask.long())  # each completion token exactly once
        t = 1.0 / weights[:, 1 + 2 * j]
        assert ((t >= 0.2) & (t <= 0.8)).all()
        torch.testing.assert_close(weights[:, 2 + 2 * j], 1.0 / (1.0 - t))
    with torch.no_grad():
        ll = estimate(policy, batch, seeds, cfg)
        logp = score_views(policy, batch, views)  # [B, 5, C]
    pair = sum(weights[:, v, None] * logp[:, v] for v in range(1, 5)) / 2
    torch.testing.assert_close(ll.token, 0.5 * (logp[:, 0] + pair), atol=1e-5, rtol=0)
    assert ll.forwards == 5 and torch.equal(ll.diagnostics["pair_coverage"].sum(1), 2 * batch.completion_mask.long())


def test_collapse_and_rounds_on_a_hand_built_trajectory():
    steps = torch.tensor([0, 0, 1, 2, 2, 3, 5, 5])
    assert collapse_steps(steps, 1).tolist() == steps.tolist()
    assert collapse_steps(steps, 2).tolist() == [1, 1, 1, 3, 3, 3, 5, 5]  # {0,1}->1, {2,3}->3, {5}->5
    assert collapse_steps(steps, 8).tolist() == [5] * 8
    rounds = trajectory_rounds(steps, shrink=2, block_size=None)
    masked = [r[0].int().tolist() for r in rounds]
    target = [r[1].int().tolist() for r in rounds]
    assert masked == [[1] * 8, [0, 0, 0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 1, 1]]
    assert target == [[1, 1, 1, 0, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0, 1, 1]]
    assert len(trajectory_rounds(steps, shrink=1, block_size=None)) == 5
    # per block (block diffusion): block [0,0,1,2] has 3 levels, block [2,3,5,5] has 3; round r pairs them
    blocks = trajectory_rounds(steps, shrink=1, block_size=4)
    assert [r[1].int().tolist() for r in blocks] == [
        [1, 1, 0, 0, 1, 0, 0, 0],
        [0, 0, 1, 0, 0, 1, 0, 0],
        [0, 0, 0, 1, 0, 0, 1, 1],
    ]
    assert blocks[1][0].int().tolist() == [0, 0, 1, 1, 0, 1, 1, 1]


def _trajectory_batch(steps: torch.Tensor) -> SequenceBatch:
    batch = _batch(lengths=(C, 11, 3))
    return SequenceBatch(batch.input_ids, batch.prompt_mask, batch.completion_mask, decode_step=steps)


def test_trajectory_shrink_is_the_exact_trajectory_of_the_merged_steps(policy):
    g = torch.Generator().manual_seed(1)
    steps = torch.stack([torch.randperm(C, generator=g) // 2 for _ in range(3)])  # two tokens per step
    seeds = torch.zeros(3, dtype=torch.long)
    with torch.no_grad():
        shrunk = estimate(policy, _trajectory_batch(steps), seeds, TrajectoryConfig(shrink=3))
        merged = torch.stack([collapse_steps(s, 3) for s in steps])
        exact = estimate(policy, _trajectory_batch(merged), seeds, TrajectoryConfig(shrink=1))
        fine = estimate(policy, _trajectory_batch(steps), seeds, TrajectoryConfig(shrink=1))
    torch.testing.assert_close(shrunk.token, exact.token, atol=1e-6, rtol=0)
    assert shrunk.forwards == 3 and fine.forwards == 8  # ceil(8 distinct steps / 3), 8
    assert (shrunk.token - fine.token).abs().max() > 1e-3  # merging changes the states


def test_trajectory_token_is_scored_in_the_state_it_was_decoded_from(policy):
    steps = torch.arange(C).flip(0).expand(3, C).clone()  # right to left, one token per step
    batch = _trajectory_batch(steps)
    with torch.no_grad():
        ll = estimate(policy, batch, torch.zeros(3, dtype=torch.long), TrajectoryConfig())
        k = 10  # decoded at step 5: tokens 0..10 are still masked, 11.. are clean
        x = batch.input_ids.clone()
        p = batch.prompt_width
        x[:, p : p + k + 1] = policy.mask_token_id
        valid = batch.valid
        attn = valid[:, None, None, :] & valid[:, None, :, None] | torch.eye(x.shape[1], dtype=torch.bool)
        logp = torch.log_softmax(policy(x, attention_mask=attn, position_ids=batch.position_ids).logits[:, p + k], -1)
    want = logp.gather(-1, batch.completion_ids[:, k, None])[:, 0]
    torch.testing.assert_close(
        ll.token[:, k] * batch.completion_mask[:, k], want * batch.completion_mask[:, k], atol=1e-5, rtol=0
    )
    assert ll.token[2, 3:].abs().sum() == 0  # after its first EOS a row's tokens are not scored


def test_block_trajectory_equals_the_global_state_definition():
    """On a block-diffusion model decoding block by block, the staircase rounds reproduce each token's
    state s_tau (decoded-at->=tau masked) under the plain block-causal mask."""
    policy = build_tiny_policy("sdar", block_size=4, seed=6)
    with torch.no_grad():
        policy.model.lm_head.weight.mul_(10.0)
    g = torch.Generator().manual_seed(2)
    steps = torch.stack(
        [torch.cat([torch.randperm(4, generator=g) // 2 + 2 * b for b in range(C // 4)]) for _ in range(3)]
    )
    batch = _trajectory_batch(steps)
    p = batch.prompt_width
    with torch.no_grad():
        ll = estimate(policy, batch, torch.zeros(3, dtype=torch.long), TrajectoryConfig())
        want = torch.zeros(3, C)
        mask = block_causal_mask(block_ids(batch.prompt_mask, C, 4), batch.valid)
        for tau in steps.unique().tolist():
            x = batch.input_ids.clone()
            x[:, p:] = torch.where(steps >= tau, policy.mask_token_id, batch.completion_ids)
            logp = torch.log_softmax(policy(x, attention_mask=mask, position_ids=batch.position_ids).logits[:, p:], -1)
            want += (steps == tau) * logp.gather(-1, batch.completion_ids[..., None])[..., 0]
    torch.testing.assert_close(ll.token * batch.completion_mask, want * batch.completion_mask, atol=1e-5, rtol=0)
    assert ll.forwards == 2  # two merged steps per block, all blocks in each staircase forward


def test_trajectory_needs_decode_steps(policy):
    with pytest.raises(ValueError, match="decode_step"):
        estimate(policy, _batch(), torch.zeros(3, dtype=torch.long), TrajectoryConfig())


# prompt positions that d1's diffu_grpo_trainer.forward_process (p_mask_prompt 0.15, mask_seed = seed) masks
# in a batch of one row of 40 prompt and 8 completion tokens (a scratch run on CPU; every completion token
# was masked too)
_D1_PROMPT_MASKS = {0: [2, 3, 12, 27, 35], 1: [4, 28, 33, 34], 7: [17, 19, 29], 42: [9, 24, 29, 31],
                    1234: [0, 4, 6, 39]}


@pytest.mark.parametrize("seed", sorted(_D1_PROMPT_MASKS))
def test_mean_field_masks_are_d1s_for_one_row(seed):
    from stabledrl.common.config.estimator import MeanFieldConfig
    from stabledrl.common.estimators.mean_field import mean_field_views
    from stabledrl.common.types import Sample, collate_samples

    sample = Sample(sample_id="p/0", prompt_id="p", index=0, prompt_ids=torch.arange(1, 41),
                    completion_ids=torch.arange(41, 49), completion_length=8, reward=0.0)
    views = mean_field_views(collate_samples([sample], 0), torch.tensor([seed]), MeanFieldConfig())
    assert views.prompt[0, 0].nonzero().flatten().tolist() == _D1_PROMPT_MASKS[seed]
    assert views.completion[0, 0].all()
