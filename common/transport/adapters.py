"""LoRA adapters on the wire, and the one merge.

A LoRA learner (learner/lora.py) trains, for each target Linear W [out, in], the adapters
A [rank, in] and B [out, rank]; the policy it trains computes y = x W^T + s·(x A^T) B^T,
s = alpha / rank. An adapter push (``learner.lora.push: adapters``) carries A and B only, under
``<module>.lora_A`` and ``<module>.lora_B`` (the module's path in the plain policy): r·(in + out)
numbers per target instead of out·in (at LLaDA-8B, r 128, the seven default targets: 0.67 GB
against 13 GB of merged matrices). A rollout worker holds them under those very names, unmerged
(common/models/lora.py), so it computes the learner's function.

``merged_weight`` is the one place W + s·B·A is formed, in fp32 and rounded once to W's dtype: the
merged push (``learner.lora.push: merged``) and the export of the merged model.
"""
from __future__ import annotations

import torch

SUFFIXES = (".lora_A", ".lora_B")


@torch.no_grad()
def merged_weight(base: torch.Tensor, lora_A: torch.Tensor, lora_B: torch.Tensor, scale: float) -> torch.Tensor:
    """W + s·B·A, computed in fp32 and rounded once to W's dtype."""
    return (base.float() + scale * (lora_B.float() @ lora_A.float())).to(base.dtype)


def adapter_names(path: str) -> tuple[str, str]:
    """The names of a target module's A and B on the wire (and on a rollout worker)."""
    return f"{path}{SUFFIXES[0]}", f"{path}{SUFFIXES[1]}"
