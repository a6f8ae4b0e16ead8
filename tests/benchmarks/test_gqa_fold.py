"""The folded grouped-query attention of the block-diffusion experiment computes the stock sdpa
attention: same logits for block-causal masks with padding, same tokens in a cached generation."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib as bl  # noqa: E402
from gqa_fold import folded_attention  # noqa: E402
from common.attention import block_causal_mask, block_ids  # noqa: E402
from common.config.sampler import SamplerConfig  # noqa: E402
from common.types import left_pad  # noqa: E402
from rollout.sampling import generate  # noqa: E402


def test_folded_attention_gives_the_stock_logits_under_a_block_causal_mask_with_padding():
    p = bl.build_policy("tiny-sdar", torch.device("cpu"), torch.float32, block_size=4)
    assert p.model.config.num_attention_heads > p.model.config.num_key_value_heads  # grouped-query
    ids, prompt_mask = left_pad([torch.arange(5, 14), torch.arange(20, 23)], pad_id=0)
    completion = torch.randint(4, 500, (2, 8))
    inputs = torch.cat([ids, completion], 1)
    valid = torch.cat([prompt_mask, torch.ones(2, 8, dtype=torch.bool)], 1)
    mask = block_causal_mask(block_ids(prompt_mask, 8, 4), valid)
    positions = (valid.long().cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        stock = p(inputs, attention_mask=mask, position_ids=positions).logits
        with folded_attention(p):
            folded = p(inputs, attention_mask=mask, position_ids=positions).logits
        again = p(inputs, attention_mask=mask, position_ids=positions).logits  # the stock path is back
    assert torch.allclose(folded, stock, atol=1e-5, rtol=1e-5)
    assert torch.equal(again, stock)


def test_cached_generation_with_folded_attention_gives_the_same_tokens():
    p = bl.build_policy("tiny-sdar", torch.device("cpu"), torch.float32, block_size=4)
    prompts = [torch.arange(5, 12), torch.arange(30, 33), torch.arange(40, 50)]
    cfg = SamplerConfig(gen_length=16, block_length=None, steps=8, temperature=0.9, cache="prefix", stop_at_eos=False)
    stock = generate(p, prompts, torch.arange(3), cfg)
    with folded_attention(p):
        folded = generate(p, prompts, torch.arange(3), cfg)
    assert torch.equal(folded.completion_ids, stock.completion_ids)
