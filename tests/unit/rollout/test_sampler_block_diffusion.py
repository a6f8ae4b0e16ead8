"""Block-diffusion sampler on tiny random SDAR: the exact KV cache changes nothing but the cost."""
from __future__ import annotations

import pytest
import torch

from stabledrl.common.attention import block_causal_mask, block_ids
from stabledrl.common.config.base import ConfigError
from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.models import build_tiny_policy
from stabledrl.common.types import left_pad
from stabledrl.rollout.sampling import generate
from stabledrl.rollout.sampling.block_diffusion import chunk_block_mask

torch.set_num_threads(1)
PROMPTS = [torch.tensor([5, 6, 7, 8, 9]), torch.tensor([10, 11]), torch.tensor([12, 13, 14, 15, 16, 17, 18, 19])]
SEEDS = torch.tensor([11, 22, 33])


@pytest.fixture(scope="module")
def sdar():
    return build_tiny_policy("sdar", block_size=4)


def cfg(**kw) -> SamplerConfig:
    return SamplerConfig(**{**dict(gen_length=16, block_length=None, steps=8, temperature=0.9), **kw})


@pytest.mark.parametrize(
    "kw",
    [dict(temperature=0.0), dict(), dict(remasking="random"), dict(steps=16, threshold=0.015),
     dict(steps=16, threshold=0.015, temperature=0.0), dict(stop_at_eos=False, steps=4)],
)
def test_kv_cache_gives_the_same_tokens_as_the_reference_path(sdar, kw):
    cached = generate(sdar, PROMPTS, SEEDS, cfg(cache="prefix", **kw))
    reference = generate(sdar, PROMPTS, SEEDS, cfg(cache="none", **kw))
    assert torch.equal(cached.completion_ids, reference.completion_ids)
    assert torch.equal(cached.decode_step, reference.decode_step)
    assert torch.equal(cached.completion_length, reference.completion_length)
    assert cached.num_forwards == reference.num_forwards


def test_cached_forwards_feed_at_most_two_blocks_after_the_prompt(sdar):
    lengths = []
    hook = sdar.model.register_forward_pre_hook(
        lambda m, a, kw: lengths.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        out = generate(sdar, PROMPTS, SEEDS, cfg(cache="prefix", stop_at_eos=False))
    finally:
        hook.remove()
    # 2 steps per block: [prompt | block 0], [block 0]; then per block [previous | current], [current]
    assert lengths == [8 + 4, 4] + [2 * 4, 4] * (out.num_forwards // 2 - 1)


def test_chunk_mask_is_the_block_causal_mask_restricted_to_the_chunk():
    _, prompt_mask = left_pad([torch.arange(6), torch.arange(2)], pad_id=0, width=8)
    blocks = block_ids(prompt_mask, 12, 4)
    valid = torch.cat([prompt_mask, torch.ones(2, 12, dtype=torch.bool)], 1)
    full = block_causal_mask(blocks, valid)  # [2, 1, 20, 20]
    query = torch.tensor([[4, 5, 6, 7, 8, 9, 10, 11], [12, 13, 14, 15, 16, 17, 18, 19]])
    for visible in (12, 20):
        chunk = chunk_block_mask(blocks, valid, query.clamp(max=visible - 1), visible)
        ref = full[:, :, :, :visible].gather(
            2, query.clamp(max=visible - 1)[:, None, :, None].expand(-1, 1, -1, visible)
        )
        assert torch.equal(chunk, ref)


@pytest.mark.parametrize("kw", [dict(), dict(steps=16, threshold=0.011)])
def test_a_row_does_not_depend_on_its_batch_neighbours_or_padding(sdar, kw):
    together = generate(sdar, PROMPTS, SEEDS, cfg(stop_at_eos=False, **kw))
    alone = generate(sdar, PROMPTS[1:2], SEEDS[1:2], cfg(stop_at_eos=False, **kw))
    assert torch.equal(together.completion_ids[1], alone.completion_ids[0])
    assert torch.equal(together.decode_step[1], alone.decode_step[0])
    if "threshold" in kw:  # the rows really finished their blocks at different steps
        block_ends = together.decode_step.view(3, 4, 4).max(-1).values
        assert not (block_ends == block_ends[0]).all()


def test_decode_steps_are_ordered_by_block(sdar):
    out = generate(sdar, PROMPTS, SEEDS, cfg(stop_at_eos=False))
    assert out.num_forwards == 8
    for row in out.decode_step:
        per_block = row.view(4, 4)
        assert torch.all(per_block.max(1).values[:-1] < per_block.min(1).values[1:])
        assert torch.equal(torch.bincount(row, minlength=8), torch.full((8,), 2))


def test_block_settings_are_checked_against_the_policy(sdar):
    with pytest.raises(ConfigError, match="block_length=8 differs"):
        generate(sdar, PROMPTS, SEEDS, cfg(block_length=8))
    with pytest.raises(ConfigError, match="dual"):
        generate(sdar, PROMPTS, SEEDS, cfg(cache="dual"))
