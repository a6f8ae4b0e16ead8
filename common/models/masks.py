"""Our 4-D boolean masks in the form each transformers attention backend obeys.

Every layout in common/attention.py is a ``[B, 1, Q, K]`` bool tensor (True = may attend).

- ``sdpa`` takes it as is (tests/unit/common/test_attention.py checks it).
- ``flex_attention``: transformers *adds* a tensor mask to the scores (``score + mask``), so a bool
  mask would add 0/1 and mask nothing (measured on CUDA: 6-36% logit error). It is turned into a
  flex ``BlockMask`` instead, which also lets the kernel skip fully-masked tiles (half of a
  staircase layout). The staircase's own BlockMask, built from its mask_mod without the dense
  mask, is common/models/flex_staircase.py (``model.staircase_attention: flex``).
- ``flash_attention_2`` can apply no 4-D mask at all (only padding derived from a 2-D mask), so a
  mask is refused there rather than silently dropped.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from stabledrl.common.models.flex_staircase import FLEX_STAIRCASE


def backend_mask(mask: Optional[torch.Tensor], attn_implementation: str) -> Any:
    """``mask`` ([B, 1, Q, K] bool or None) converted for ``attn_implementation``."""
    if mask is None or attn_implementation in ("sdpa", FLEX_STAIRCASE):
        return mask  # FLEX_STAIRCASE: a staircase BlockMask goes to flex, a tensor to sdpa
    if attn_implementation == "flex_attention":
        return flex_block_mask(mask)
    if attn_implementation == "flash_attention_2":
        raise ValueError(
            "flash_attention_2 cannot apply a 4-D attention mask (padding, block-causal or staircase layouts); "
            "pass attention_mask=None for unpadded full-attention batches or load the model with sdpa"
        )
    return mask


def flex_block_mask(mask: torch.Tensor) -> Any:
    """[B, 1, Q, K] bool -> flex ``BlockMask`` with the same pattern (True = attend)."""
    from torch.nn.attention.flex_attention import create_block_mask

    dense = mask[:, 0].bool()  # [B, Q, K]

    def mask_mod(b, h, q_idx, kv_idx):
        return dense[b, q_idx, kv_idx]

    b, q, k = dense.shape
    return create_block_mask(mask_mod, B=b, H=None, Q_LEN=q, KV_LEN=k, device=dense.device)
