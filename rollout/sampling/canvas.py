"""The decoding canvas: prompts left-padded in the SequenceBatch layout, then [MASK] x C.

    ids [B, P + C] = [ prompt, left-padded to P | [MASK] x C ]

Positions are counted from each row's first real token and padding is invisible to attention,
so a row's logits do not depend on how much padding its batch needed (common/types.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from stabledrl.common.types import left_pad


@dataclass
class Canvas:
    ids: torch.Tensor  # [B, P + C] int64, updated in place while decoding
    valid: torch.Tensor  # [B, P + C] bool, False on left padding
    position_ids: torch.Tensor  # [B, P + C] int64, counted from each row's first real token
    prompt_mask: torch.Tensor  # [B, P] bool
    gen_length: int
    padded: bool = True  # any row left-padded (build_canvas reads it on the host: no device sync)

    @property
    def prompt_width(self) -> int:
        return self.prompt_mask.shape[1]

    @property
    def batch_size(self) -> int:
        return self.ids.shape[0]

    @property
    def total_length(self) -> int:
        return self.ids.shape[1]

    @property
    def completion(self) -> torch.Tensor:
        return self.ids[:, self.prompt_width :]  # [B, C] view


def build_canvas(
    prompts: Sequence[torch.Tensor],
    gen_length: int,
    *,
    mask_token_id: int,
    pad_token_id: int,
    device: torch.device | str,
    min_prompt_width: int = 1,
) -> Canvas:
    """Left-pad the prompts (to at least ``min_prompt_width``) and append ``gen_length`` masks."""
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
    width = max(max(len(p) for p in prompts), min_prompt_width)
    prompt_ids, prompt_mask = left_pad([torch.as_tensor(p).long().cpu() for p in prompts], pad_token_id, width)
    b = len(prompts)
    ids = torch.cat([prompt_ids, torch.full((b, gen_length), mask_token_id, dtype=torch.long)], dim=1)
    valid = torch.cat([prompt_mask, torch.ones(b, gen_length, dtype=torch.bool)], dim=1)
    positions = (valid.long().cumsum(dim=1) - 1).clamp(min=0)
    return Canvas(ids.to(device), valid.to(device), positions.to(device), prompt_mask.to(device), gen_length,
                  padded=not bool(prompt_mask.all()))
