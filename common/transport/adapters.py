"""LoRA adapters merged on the receiving end of a weight push.

A LoRA learner (learner/lora.py) trains, for each target Linear W [out, in], the adapters
A [rank, in] and B [out, rank]; the policy it trains computes with W' = W + s·B·A, s = alpha / rank.
Its push carries A and B only, under ``<module>.lora_A`` and ``<module>.lora_B`` (the module's
path in the plain policy): r·(in + out) numbers per target instead of out·in (at LLaDA-8B, r 128,
the seven default targets: 0.67 GB against 13 GB of merged matrices).

The receiver merges them with ``merged_weight``, the same function the learner's export and its
merged push use, so a worker holds the same bits as the exported model. It merges into a copy of
each target's *unmerged* weight, taken the first time that target's adapters arrive (the
weight the worker loaded from ``model.path``, which a LoRA learner never changes): a later push
replaces the previous adapters exactly, with no rounding error carried from one push to the next.
Memory: one more copy of the target matrices on the worker's device.
"""
from __future__ import annotations

from typing import Callable, Union

import torch
from torch import nn

SUFFIXES = (".lora_A", ".lora_B")


@torch.no_grad()
def merged_weight(base: torch.Tensor, lora_A: torch.Tensor, lora_B: torch.Tensor, scale: float) -> torch.Tensor:
    """W + s·B·A, computed in fp32 and rounded once to W's dtype."""
    return (base.float() + scale * (lora_B.float() @ lora_A.float())).to(base.dtype)


def adapter_names(path: str) -> tuple[str, str]:
    """The names of a target module's A and B on the wire."""
    return f"{path}{SUFFIXES[0]}", f"{path}{SUFFIXES[1]}"


class AdapterMerger:
    """The receiver's state for adapter pushes into ``module`` (a plain policy, or the dictionary
    of its parameters): the unmerged copy of each target weight and the scale s.

    ``wrap(load)`` returns a loader that passes every ordinary tensor through to ``load`` and
    turns each module's (A, B) pair into ``(<module>.weight, W + s·B·A)``; A and B may arrive in
    different buckets (the pair is completed across calls)."""

    def __init__(self, module: Union[nn.Module, dict[str, torch.Tensor]], scale: float) -> None:
        self.params = dict(module) if isinstance(module, dict) else dict(module.named_parameters())
        self.scale = float(scale)
        self.base: dict[str, torch.Tensor] = {}  # <module>.weight -> its unmerged weight

    def wrap(self, load: Callable[[list[tuple[str, torch.Tensor]]], None]
             ) -> Callable[[list[tuple[str, torch.Tensor]]], None]:
        pending: dict[str, dict[str, torch.Tensor]] = {}

        def merge_and_load(named: list[tuple[str, torch.Tensor]]) -> None:
            out = []
            for name, tensor in named:
                suffix = next((s for s in SUFFIXES if name.endswith(s)), None)
                if suffix is None:
                    out.append((name, tensor))
                    continue
                path = name[: -len(suffix)]
                pair = pending.setdefault(path, {})
                pair[suffix] = tensor.clone()  # the bucket's buffer is reused for the next bucket
                if len(pair) == 2:
                    del pending[path]
                    out.append((f"{path}.weight", self.merge(path, pair[".lora_A"], pair[".lora_B"])))
            if out:
                load(out)

        return merge_and_load

    def merge(self, path: str, lora_A: torch.Tensor, lora_B: torch.Tensor) -> torch.Tensor:
        name = f"{path}.weight"
        param = self.params.get(name)
        if param is None:
            raise KeyError(f"weight push: adapters for {path!r}, which the receiving model does not have as a Linear")
        if lora_A.dim() != 2 or lora_B.dim() != 2 or lora_B.shape[0] != param.shape[0] or \
                lora_A.shape[1] != param.shape[1] or lora_A.shape[0] != lora_B.shape[1]:
            raise ValueError(f"weight push: adapters of {path} have shapes A {tuple(lora_A.shape)}, B "
                             f"{tuple(lora_B.shape)}; the weight is {tuple(param.shape)}")
        if name not in self.base:
            self.base[name] = param.detach().clone()
        base = self.base[name]
        return merged_weight(base, lora_A.to(base.device), lora_B.to(base.device), self.scale)
