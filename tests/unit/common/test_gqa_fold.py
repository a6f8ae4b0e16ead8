"""The GQA fold (common/models/gqa_fold.py) computes transformers' stock sdpa attention: the same
attention output for short queries over long keys, the same logits of a whole model under a
block-causal mask with padding, and the stock path is back after the context."""
from __future__ import annotations

import torch
from torch import nn

from stabledrl.common.attention import block_causal_mask, block_ids
from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.models import build_tiny_policy
from stabledrl.common.models.gqa_fold import NAME, foldable, folded_attention, sdpa_gqa_fold
from stabledrl.common.types import left_pad
from stabledrl.rollout.sampling import generate

torch.set_num_threads(1)


def test_folded_attention_equals_repeated_keys_for_short_queries_over_a_long_cache():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    g = torch.Generator().manual_seed(0)
    module = nn.Module()
    module.num_key_value_groups, module.is_causal = 4, False
    q = torch.randn(3, 8, 4, 16, generator=g)  # [B, H, Lq, D]: 8 query heads over 2 K/V heads
    k, v = torch.randn(3, 2, 40, 16, generator=g), torch.randn(3, 2, 40, 16, generator=g)  # [B, H_kv, K, D]
    mask = torch.rand(3, 1, 4, 40, generator=g) < 0.6  # [B, 1, Lq, K], a different pattern per query row
    mask[..., 0] = True
    folded, _ = sdpa_gqa_fold(module, q, k, v, mask, scaling=0.25)
    stock, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.25)
    assert folded.shape == stock.shape == (3, 4, 8, 16)
    assert torch.allclose(folded, stock, atol=1e-6, rtol=1e-5)


def test_folded_model_gives_the_stock_logits_under_a_block_causal_mask_with_padding():
    p = build_tiny_policy("sdar", block_size=4)
    assert foldable(p)  # 4 query heads over 2 key/value heads, sdpa
    ids, prompt_mask = left_pad([torch.arange(5, 14), torch.arange(20, 23)], pad_id=0)
    inputs = torch.cat([ids, torch.randint(4, 90, (2, 8))], 1)
    valid = torch.cat([prompt_mask, torch.ones(2, 8, dtype=torch.bool)], 1)
    mask = block_causal_mask(block_ids(prompt_mask, 8, 4), valid)
    positions = (valid.long().cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        stock = p(inputs, attention_mask=mask, position_ids=positions).logits
        with folded_attention(p):
            assert p.model.config._attn_implementation == NAME
            folded = p(inputs, attention_mask=mask, position_ids=positions).logits
        again = p(inputs, attention_mask=mask, position_ids=positions).logits
    assert torch.allclose(folded, stock, atol=1e-5, rtol=1e-5)
    assert p.model.config._attn_implementation == "sdpa" and torch.equal(again, stock)


def test_cached_generation_with_the_fold_gives_the_same_tokens():
    p = build_tiny_policy("sdar", block_size=4)
    prompts = [torch.arange(5, 12), torch.arange(30, 33), torch.arange(40, 50)]
    c = SamplerConfig(gen_length=16, block_length=None, steps=8, temperature=0.9, cache="prefix", stop_at_eos=False)
    stock = generate(p, prompts, torch.arange(3), c)
    with folded_attention(p):
        folded = generate(p, prompts, torch.arange(3), c)
    assert torch.equal(folded.completion_ids, stock.completion_ids)


def test_the_fold_leaves_other_attention_backends_alone():
    p = build_tiny_policy("sdar", block_size=4)
    p.model.config._attn_implementation = "eager"
    assert not foldable(p)
    with folded_attention(p):
        assert p.model.config._attn_implementation == "eager"
