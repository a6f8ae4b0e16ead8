"""Threshold decoding with the approximate caches: rows are block-synchronous, so the cache is
refreshed exactly once per block, and a waiting row decodes exactly as it would alone."""
from __future__ import annotations

import pytest
import torch

from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.models import build_tiny_policy
from stabledrl.rollout.sampling import generate

torch.set_num_threads(1)
PROMPTS = [torch.tensor([5, 6, 7, 8, 9]), torch.tensor([10, 11]), torch.tensor([12, 13, 14, 15, 16, 17, 18])]
SEEDS = torch.tensor([101, 202, 303])
GEN, BLOCK = 32, 8
# threshold just above the tiny models' uniform probability (1/97): rows finish blocks after different steps
THRESHOLD = dict(gen_length=GEN, block_length=BLOCK, steps=GEN, threshold=0.012, stop_at_eos=False)


@pytest.fixture(scope="module", params=["llada", "dream"])
def policy(request):
    return build_tiny_policy(request.param)


def cfg(**kw) -> SamplerConfig:
    return SamplerConfig(**{**THRESHOLD, "temperature": 0.9, **kw})


def forward_lengths(policy, prompts, seeds, c):
    """(output, [input length of every model forward]) of one generation."""
    lengths: list[int] = []
    hook = policy.model.register_forward_pre_hook(lambda m, a, kw: lengths.append(kw["input_ids"].shape[1]),
                                                  with_kwargs=True)
    try:
        out = generate(policy, prompts, seeds, c)
    finally:
        hook.remove()
    return out, lengths


@pytest.mark.parametrize("mode", ["dual", "prefix"])
def test_cache_refreshes_once_per_block_under_threshold_decoding(policy, mode):
    out, lengths = forward_lengths(policy, PROMPTS, SEEDS, cfg(cache=mode))
    canvas = max(len(p) for p in PROMPTS) + GEN
    assert len(lengths) == out.num_forwards
    refreshes = sum(n == canvas for n in lengths)  # a refresh is the one forward over the whole canvas
    assert refreshes == GEN // BLOCK
    # the rows really moved at different paces: without waiting they would have entered blocks apart
    block_ends = out.decode_step.view(len(PROMPTS), GEN // BLOCK, BLOCK).max(-1).values  # [B, blocks], row steps
    assert not (block_ends == block_ends[0]).all()
    # every forward between refreshes reads the cache: feeds the block (dual) or block + suffix (prefix)
    assert all(n < canvas for n in lengths[1:] if n != canvas)
    assert out.num_forwards < GEN  # still parallel decoding: fewer forwards than one token per step


@pytest.mark.parametrize("mode", ["dual", "prefix"])
@pytest.mark.parametrize("kw", [dict(), dict(temperature=0.0), dict(stop_at_eos=True)])
def test_a_waiting_row_decodes_as_it_would_alone(policy, mode, kw):
    """Tokens and the row's own step counter equal those of the row generated alone (no waiting)."""
    c = cfg(cache=mode, **kw)
    together = generate(policy, PROMPTS, SEEDS, c)
    for row in range(len(PROMPTS)):
        alone = generate(policy, PROMPTS[row : row + 1], SEEDS[row : row + 1], c)
        assert torch.equal(together.completion_ids[row], alone.completion_ids[0])
        assert torch.equal(together.decode_step[row], alone.decode_step[0])
        assert torch.equal(together.completion_length[row], alone.completion_length[0])


def test_every_step_of_a_row_commits_and_blocks_stay_in_order(policy):
    """decode_step counts only the row's own steps: waiting steps leave no gap."""
    out = generate(policy, PROMPTS, SEEDS, cfg(cache="dual"))
    for row in out.decode_step:
        used = torch.unique(row)
        assert torch.equal(used, torch.arange(used.numel()))
        per_block = row.view(GEN // BLOCK, BLOCK)
        assert torch.all(per_block.max(1).values[:-1] < per_block.min(1).values[1:])


def test_batch_forwards_are_the_sum_over_blocks_of_the_slowest_row(policy):
    """With waiting, block k costs the batch max_rows(steps of row in block k) forwards."""
    out = generate(policy, PROMPTS, SEEDS, cfg(cache="dual"))
    blocks = out.decode_step.view(len(PROMPTS), GEN // BLOCK, BLOCK)
    steps_per_block = blocks.max(-1).values - blocks.min(-1).values + 1  # [B, blocks]
    assert out.num_forwards == int(steps_per_block.max(0).values.sum())


@pytest.mark.parametrize("mode", ["dual", "prefix"])
def test_fixed_steps_are_unchanged_by_block_sync(policy, mode):
    """With a fixed number of steps every row ends each block together: the schedule alone rules."""
    c = SamplerConfig(gen_length=GEN, block_length=BLOCK, steps=16, temperature=0.9, cache=mode, stop_at_eos=False)
    out = generate(policy, PROMPTS, SEEDS, c)
    assert out.num_forwards == 16
    for row in out.decode_step:
        assert torch.equal(torch.bincount(row, minlength=16), torch.full((16,), 2))
