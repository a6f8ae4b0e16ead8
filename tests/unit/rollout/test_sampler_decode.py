"""The per-step rule (rollout/sampling/decode.py): schedule, token choice, confidence, commits."""
from __future__ import annotations

import pytest
import torch

from stabledrl.common.seeding import generator
from stabledrl.rollout.sampling.decode import choose_tokens, commit_mask, transfer_schedule

torch.set_num_threads(1)


def gens(seeds):
    return [generator(s) for s in seeds]


@pytest.mark.parametrize("block,steps", [(32, 4), (32, 5), (7, 7), (8, 3), (1, 1)])
def test_transfer_schedule_splits_the_block_evenly_remainder_first(block, steps):
    k = transfer_schedule(block, steps)
    assert k.sum() == block and k.numel() == steps
    assert k.max() - k.min() <= 1 and torch.all(k[:-1] >= k[1:])


def test_confidence_is_the_softmax_probability_of_the_chosen_token():
    logits = torch.randn(3, 5, 50) * 4
    x0, conf = choose_tokens(logits.clone(), 0.0, gens([0, 1, 2]), mask_token_id=2)
    ref = logits.double()
    ref[..., 2] = float("-inf")
    probs = torch.softmax(ref, dim=-1)
    assert torch.equal(x0, ref.argmax(-1))
    torch.testing.assert_close(conf.double(), probs.gather(-1, x0[..., None]).squeeze(-1), atol=1e-6, rtol=1e-5)


def test_mask_token_is_never_chosen():
    logits = torch.zeros(2, 4, 10)
    logits[..., 2] = 100.0  # the model "predicts" [MASK]
    for temperature in (0.0, 1.0):
        x0, conf = choose_tokens(logits.clone(), temperature, gens([0, 1]), mask_token_id=2)
        assert not (x0 == 2).any()
        assert torch.all(conf > 0) and torch.all(conf <= 1)


@pytest.mark.parametrize("noise_dtype", [torch.float32, torch.float64])
def test_gumbel_max_samples_from_softmax_of_logits_over_temperature(noise_dtype):
    """Frequencies over 6000 rows (one generator each) match softmax(scores / T) to sampling error."""
    temperature = 0.7
    scores = torch.tensor([1.0, 0.0, -0.5, 0.8, -3.0, 0.3])
    rows = 6000
    logits = scores.expand(rows, 1, -1).clone()
    x0, _ = choose_tokens(logits, temperature, gens(range(rows)), mask_token_id=4, noise_dtype=noise_dtype)
    freq = torch.bincount(x0.flatten(), minlength=6).double() / rows
    p = torch.softmax(scores.double() / temperature, dim=0)
    p[4] = 0.0  # the mask token (id 4 here) is excluded; its mass is tiny anyway
    p = p / p.sum()
    assert (freq - p).abs().max() < 4 * (p * (1 - p) / rows).sqrt().max() + 1e-3


def test_a_rows_choice_depends_only_on_its_own_generator():
    logits = torch.randn(4, 3, 30)
    x_all, c_all = choose_tokens(logits.clone(), 0.9, gens([10, 11, 12, 13]), mask_token_id=2)
    x_one, c_one = choose_tokens(logits[2:3].clone(), 0.9, gens([12]), mask_token_id=2)
    assert torch.equal(x_all[2:3], x_one) and torch.equal(c_all[2:3], c_one)


def test_commit_fixed_k_takes_the_k_best_masked_positions_ties_to_the_left():
    scores = torch.tensor([[0.9, 0.1, 0.5, 0.5, 0.7], [0.2, 0.2, 0.2, 0.2, 0.2]])
    masked = torch.tensor([[False, True, True, True, True], [True, True, True, True, True]])
    commit = commit_mask(scores, masked, k=torch.tensor([2, 3]))
    assert commit.tolist() == [[False, False, True, False, True], [True, True, True, False, False]]


def test_commit_threshold_takes_all_above_and_at_least_the_best():
    scores = torch.tensor([[0.95, 0.2, 0.91, 0.3], [0.1, 0.4, 0.2, 0.3], [0.99, 0.99, 0.99, 0.99]])
    masked = torch.tensor([[True, True, True, True], [True, True, True, True], [False, False, False, False]])
    commit = commit_mask(scores, masked, threshold=0.9)
    assert commit.tolist() == [[True, False, True, False], [False, True, False, False], [False] * 4]


def test_commit_never_touches_unmasked_positions_even_with_k_larger_than_masked():
    scores = torch.rand(3, 8)
    masked = torch.rand(3, 8) > 0.5
    commit = commit_mask(scores, masked, k=torch.tensor([8, 8, 8]))
    assert torch.equal(commit, masked)


# x0 of the releases' own Gumbel functions, run on these logits with torch.manual_seed(k) (a scratch run of
# d1's diffu_grpo_trainer.add_gumbel_noise(dtype=bfloat16) and the StableDRL release's
# networks/llada_svpo.add_gumbel_noise_spg(dtype=bfloat16), then argmax, temperature 0.9)
_D1_BF16_X0 = [[51, 23, 44, 29, 25, 52, 54, 50], [63, 42, 6, 40, 51, 45, 10, 51], [59, 40, 60, 1, 1, 40, 47, 11],
               [11, 13, 52, 15, 0, 53, 18, 23], [49, 48, 39, 0, 48, 62, 58, 17], [39, 51, 43, 37, 9, 26, 12, 48]]
_STABLEDRL_X0 = [[51, 23, 44, 29, 25, 17, 1, 50], [63, 58, 6, 40, 51, 45, 10, 51], [59, 40, 60, 1, 1, 40, 47, 11],
                 [11, 13, 52, 15, 0, 53, 18, 23], [49, 48, 39, 0, 48, 62, 58, 31], [39, 51, 43, 37, 9, 26, 12, 48]]


def _release_logits(k: int, mask: int = 7) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + k)
    logits = (torch.randn(1, 8, 64, generator=g) * 2.5).to(torch.bfloat16).float()
    logits[..., mask] = float("-inf")
    return logits


@pytest.mark.parametrize("noise_dtype, expected", [("bfloat16", _D1_BF16_X0), ("float32_then_bfloat16", _STABLEDRL_X0)])
def test_low_precision_noise_picks_what_the_releases_pick(noise_dtype, expected):
    for k, want in enumerate(expected):
        x0, _ = choose_tokens(_release_logits(k), 0.9, gens([k]), mask_token_id=7, noise_dtype=noise_dtype)
        assert x0[0].tolist() == want, k
    # the default float64 draw is a different sampler on the same seeds
    x64 = [choose_tokens(_release_logits(k), 0.9, gens([k]), mask_token_id=7)[0][0].tolist() for k in range(6)]
    assert x64 != expected


def test_float32_product_noise_is_the_stabledrl_release_under_its_fsdp_launch():
    """Two equally likely tokens at 2048 positions (row seed 1): the release's add_gumbel_noise_spg cast to
    float32 (its model.dtype under FSDP) picks token 11 at 1007 of them, cast to bfloat16 at 1004; the three
    positions where the bf16 cast makes a tie (the lower id wins) are 356, 985 and 1590 (a scratch run of
    the release's function after torch.manual_seed(1))."""
    logits = torch.full((1, 2048, 16), float("-inf"))
    logits[..., 3] = logits[..., 11] = 1.0
    x32, _ = choose_tokens(logits.clone(), 0.9, gens([1]), mask_token_id=7, noise_dtype="float32_product")
    x16, _ = choose_tokens(logits.clone(), 0.9, gens([1]), mask_token_id=7, noise_dtype="float32_then_bfloat16")
    assert int((x32 == 11).sum()) == 1007 and int((x16 == 11).sum()) == 1004
    assert x32[0, [356, 985, 1590]].tolist() == [11, 11, 11] and x16[0, [356, 985, 1590]].tolist() == [3, 3, 3]
    assert (x32 != x16).nonzero()[:, 1].tolist() == [356, 985, 1590]


def test_noise_dtype_is_a_sampler_setting():
    from stabledrl.common.config.base import ConfigError
    from stabledrl.common.config.sampler import SamplerConfig

    assert SamplerConfig().noise_dtype == "float64"
    assert SamplerConfig(noise_dtype="float32_then_bfloat16").noise_dtype == "float32_then_bfloat16"
    with pytest.raises((ValueError, ConfigError)):
        SamplerConfig(noise_dtype="float16")
    with pytest.raises(ValueError, match="valid: float64, float32, bfloat16"):
        choose_tokens(torch.zeros(1, 2, 4), 0.9, gens([0]), mask_token_id=3, noise_dtype="float16")


# tokens per step that d1's get_num_transfer_tokens and the StableDRL release's get_num_transfer_tokens_spg
# return for a fully masked block (a scratch run; both gave these lists)
_RELEASE_SCHEDULES = {(32, 4): [8, 8, 8, 8], (32, 5): [7, 7, 6, 6, 6], (8, 3): [3, 3, 2],
                      (32, 12): [3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2], (32, 16): [2] * 16, (7, 7): [1] * 7}


@pytest.mark.parametrize("block_steps", sorted(_RELEASE_SCHEDULES))
def test_transfer_schedule_is_the_releases(block_steps):
    assert transfer_schedule(*block_steps).tolist() == _RELEASE_SCHEDULES[block_steps]
