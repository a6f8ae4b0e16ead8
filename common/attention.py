"""Attention layouts as 4-D boolean masks ``[B, 1, Q, K]`` (True = may attend).

transformers honours a custom 4-D boolean mask with the ``sdpa`` backend (``eager`` silently
ignores it; tests/unit/common/test_attention.py checks the backend we rely on). Rows of padding tokens
attend only to themselves so that no softmax row is empty.

Block layout for block-diffusion families (SDAR / TraDo / DiffusionGemma): completion position c
is in block ``c // block_size``; the prompt is cut into blocks counted *backwards* from its end
(ids -1, -2, ...), so response blocks start exactly at the response and a row's layout does not
depend on the batch's left padding. A key is visible to a query iff ``block[k] <= block[q]``.
When the prompt length is a multiple of the block size this is SDAR's absolute alignment.
"""
from __future__ import annotations

import torch

PAD_BLOCK = torch.iinfo(torch.long).min // 2


def full_mask(valid: torch.Tensor) -> torch.Tensor:
    """[B, L] bool -> [B, 1, L, L]: every real token sees every real token (LLaDA, Dream)."""
    b, length = valid.shape
    allowed = valid[:, None, :].expand(b, length, length)
    return _pad_rows_see_self(allowed, valid)[:, None]


def block_ids(prompt_mask: torch.Tensor, completion_width: int, block_size: int) -> torch.Tensor:
    """[B, P] prompt mask -> [B, P + C] block index of every position (PAD_BLOCK on padding)."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    b, p = prompt_mask.shape
    device = prompt_mask.device
    # distance of each real prompt token from the end of its prompt: 0 for the last one
    from_end = prompt_mask.long().flip(1).cumsum(1).flip(1) - 1
    prompt_blocks = torch.where(prompt_mask, -(from_end // block_size) - 1, torch.full_like(from_end, PAD_BLOCK))
    completion_blocks = (torch.arange(completion_width, device=device) // block_size).expand(b, completion_width)
    return torch.cat([prompt_blocks, completion_blocks], dim=1)


def block_causal_mask(blocks: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[B, L] block ids + [B, L] valid -> [B, 1, L, L]: a query sees keys of its own and earlier blocks."""
    allowed = (blocks[:, None, :] <= blocks[:, :, None]) & valid[:, None, :]
    return _pad_rows_see_self(allowed, valid)[:, None]


def _pad_rows_see_self(allowed: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    eye = torch.eye(valid.shape[1], dtype=torch.bool, device=valid.device)[None]
    return torch.where(valid[:, :, None], allowed, eye)


def staircase_mask(prompt_mask: torch.Tensor, completion_width: int, block_size: int) -> torch.Tensor:
    """[B, P] prompt mask -> [B, 1, P + 2C, P + 2C]: the staircase layout of block-diffusion training.

    The sequence is ``[prompt | clean completion | noisy completion]``; both completion copies carry
    the same block ids (and, at the caller, the same position ids). Attention rules:

    - prompt and clean rows: block-causal over ``[prompt | clean]`` (own and earlier blocks);
    - noisy row in block b: the prompt, clean blocks ``< b`` and its own noisy block b
      (bidirectional inside), never clean block b or later, so no label leaks.

    One forward then scores every block's term log p(y_b | q, y_<b) at the noisy copy: the rows of
    noisy block b see exactly what a per-block forward over ``[prompt | y_<b | noisy y_b]`` sees.
    """
    b, p = prompt_mask.shape
    c = completion_width
    device = prompt_mask.device
    clean_blocks = block_ids(prompt_mask, c, block_size)  # [B, P + C]
    noisy_blocks = clean_blocks[:, p:]  # [B, C]
    blocks = torch.cat([clean_blocks, noisy_blocks], dim=1)  # [B, L]
    noisy = torch.zeros(p + 2 * c, dtype=torch.bool, device=device)
    noisy[p + c :] = True
    ones = torch.ones(b, 2 * c, dtype=torch.bool, device=device)
    valid = torch.cat([prompt_mask, ones], dim=1)  # [B, L]

    bq, bk = blocks[:, :, None], blocks[:, None, :]  # [B, L, 1], [B, 1, L]
    q_noisy, k_noisy = noisy[None, :, None], noisy[None, None, :]
    clean_rule = ~k_noisy & (bk <= bq)
    noisy_rule = (~k_noisy & (bk < bq)) | (k_noisy & (bk == bq))
    allowed = torch.where(q_noisy, noisy_rule, clean_rule) & valid[:, None, :]
    return _pad_rows_see_self(allowed, valid)[:, None]
