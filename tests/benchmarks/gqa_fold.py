"""An experiment for block-diffusion decoding with grouped-query attention (SDAR / Qwen3: 32 query
heads, 8 key/value heads): attention without ``repeat_kv``.

With a 4-D mask, transformers' sdpa path copies every key/value head ``g`` times
(``repeat_kv``) before calling the kernel: for a cached decoding step of 4 query tokens per row
that copy of the whole KV cache (g = 4: 4x its size, every layer, every step) costs more memory
traffic than the attention itself. Folding instead the ``g`` query heads that share a key/value
head into the query length,

    q [B, H, Lq, D] -> [B, H_kv, g*Lq, D],   mask [B, 1, Lq, K] -> [B, 1, g*Lq, K] (repeated rows),

gives exactly the same attention (each query row still sees only its own key/value head) with
no copy of the cache. transformers does this for one query token (``pack_gqa``, newer releases);
this does it for any query length. Registered as attention implementation ``sdpa_gqa_fold``
(``transformers.AttentionInterface``); bench_block_diffusion measures it against the stock path.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F

NAME = "sdpa_gqa_fold"


def sdpa_gqa_fold(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers attention-function signature: query [B, H, Lq, D], key/value [B, H_kv, K, D],
    mask [B, 1, Lq, K] bool -> ([B, Lq, H, D], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = int(getattr(module, "num_key_value_groups", 1))
    if groups == 1 or attention_mask is None or attention_mask.dim() != 4 or attention_mask.shape[1] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    b, h, lq, d = query.shape
    kv, k_len = key.shape[1], key.shape[2]
    folded = query.reshape(b, kv, groups * lq, d)  # head kv*g + j, row i -> head kv, row j*Lq + i
    mask = attention_mask[:, :, None].expand(b, 1, groups, lq, k_len).reshape(b, 1, groups * lq, k_len)
    out = F.scaled_dot_product_attention(folded, key, value, attn_mask=mask, dropout_p=0.0, scale=scaling)
    return out.reshape(b, h, lq, d).transpose(1, 2).contiguous(), None


@contextlib.contextmanager
def folded_attention(policy: torch.nn.Module) -> Iterator[None]:
    """Run ``policy`` with ``sdpa_gqa_fold`` inside the block (restores the previous implementation)."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, sdpa_gqa_fold)
    config = policy.model.config
    previous = config._attn_implementation
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = previous
