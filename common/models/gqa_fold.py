"""Grouped-query attention under a 4-D mask without copying the keys: the query heads of a group
are folded into the query length.

SDAR / Qwen3-8B has 32 query heads over 8 key/value heads (g = 4 query heads share one K/V head).
Given a 4-D mask, transformers' sdpa path copies every key/value head g times (``repeat_kv``)
before calling the kernel; for a cached decoding step of a few query tokens that copy of the whole
KV cache (g times its size, every layer, every step) moves more memory than the attention itself.
Folding the g query heads that share a key/value head into the query length instead,

    q    [B, H, Lq, D]    -> [B, H_kv, g*Lq, D]   (head kv*g + j, row i -> head kv, row j*Lq + i)
    mask [B, 1, Lq, K]    -> [B, 1, g*Lq, K]      (each query row's mask, repeated for its g heads)
    out  [B, H_kv, g*Lq, D] -> [B, H, Lq, D],

computes exactly the same attention (each query row still reads only its own key/value head, with
its own mask row) and reads the cache once. transformers does this for a single query token
(``pack_gqa``); this does it for any query length. The sampler's CUDA-graph steps run with it
(rollout/sampling/graphs.py: they read all cache slots through a mask, where ``repeat_kv`` made
the graphed step slower than eager, 0.78x, and the fold 1.57x faster on an H200: tests/benchmarks/results/
components-quick_h200x2.md, target 4d).

It is an attention implementation of transformers' ``AttentionInterface`` (name ``sdpa_gqa_fold``)
and falls back to the stock sdpa function wherever folding does not apply (no grouping, no mask or
a per-head mask, a position bias or softcap).
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

import torch
import torch.nn.functional as F

from stabledrl.common.models.flex_staircase import is_sdpa

NAME = "sdpa_gqa_fold"


def sdpa_gqa_fold(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, H, Lq, D]
    key: torch.Tensor,  # [B, H_kv, K, D]
    value: torch.Tensor,  # [B, H_kv, K, D]
    attention_mask: Optional[torch.Tensor],  # [B, 1, Lq, K] bool (True = attend) or additive float
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    is_causal: Optional[bool] = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature -> ([B, Lq, H, D], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = int(getattr(module, "num_key_value_groups", 1))
    foldable = (
        groups > 1 and attention_mask is not None and attention_mask.dim() == 4 and attention_mask.shape[1] == 1
        and kwargs.get("position_bias") is None and kwargs.get("softcap") is None
    )
    if not foldable:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    b, h, lq, d = query.shape
    kv, k_len = key.shape[1], key.shape[2]
    folded = query.reshape(b, kv, groups * lq, d)  # [B, H_kv, g*Lq, D]
    mask = attention_mask[:, :, None].expand(b, 1, groups, lq, k_len).reshape(b, 1, groups * lq, k_len)
    p = dropout if module.training else 0.0
    out = F.scaled_dot_product_attention(folded, key, value, attn_mask=mask, dropout_p=p, scale=scaling)
    return out.reshape(b, h, lq, d).transpose(1, 2).contiguous(), None  # [B, Lq, H, D]


def foldable(policy: torch.nn.Module) -> bool:
    """True where the fold changes anything: an sdpa model with grouped-query attention."""
    config = policy.model.config
    heads, kv = getattr(config, "num_attention_heads", 0), getattr(config, "num_key_value_heads", None)
    return is_sdpa(config) and kv is not None and heads > kv


@contextlib.contextmanager
def folded_attention(policy: torch.nn.Module) -> Iterator[None]:
    """Run ``policy`` (a DiffusionPolicy) with ``sdpa_gqa_fold`` inside the block, where it
    applies (``foldable``); the previous implementation is restored after."""
    if not foldable(policy):
        yield
        return
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, sdpa_gqa_fold)
    config = policy.model.config
    previous = config._attn_implementation
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = previous
