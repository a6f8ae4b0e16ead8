"""The per-step rule (rollout/sampling/decode.py): schedule, token choice, confidence, commits."""
from __future__ import annotations

import pytest
import torch

from common.seeding import generator
from rollout.sampling.decode import choose_tokens, commit_mask, transfer_schedule

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
