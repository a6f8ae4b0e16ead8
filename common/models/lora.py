"""LoRA adapters held unmerged by a policy that samples or scores: a rollout worker, an evaluation.

A LoRA learner (learner/lora.py, through peft) trains, for each target Linear W [out, in], the
adapters A [rank, in] and B [out, rank]. Its forward computes, in the training dtype and in this
order (peft's LoRA Linear),

    y = (x W^T + b) + ((x A^T) B^T) · s,    s = alpha / rank.

``LoraLinear`` computes the same expression with the same operations, so a policy that holds the
learner's A and B computes the learner's function, bit for bit on the same kernels: the rollout
policy is the learner's. Merging instead, W' = W + s·B·A rounded to W's dtype, loses every element
of the update under half an ulp of W: in bf16, with B's entries at 1e-4 (a first small update at
r 128), most of it. The cost of holding them unmerged: two small matmuls per target (r·(in + out)
multiply-adds per token beside in·out) and r·(in + out) numbers of memory.

A target keeps its parameter names (``<path>.weight``, ``<path>.bias``) and gains ``<path>.lora_A``
and ``<path>.lora_B``: the names an adapter push carries (common/transport/adapters.py), so every
transport loads the adapters as it loads any parameter (received, staged, put together from shards,
pulled), in place, where CUDA graphs read them.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn


class LoraLinear(nn.Linear):
    """A Linear with unmerged LoRA adapters. It shares the Linear's weight and bias (no copy); A and
    B start at zero (the Linear's own function) and are loaded, never trained here."""

    def __init__(self, base: nn.Linear, rank: int, scale: float) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias
        like = dict(dtype=base.weight.dtype, device=base.weight.device)
        self.lora_A = nn.Parameter(torch.zeros(rank, base.in_features, **like), requires_grad=False)
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, **like), requires_grad=False)
        self.rank, self.scale = int(rank), float(scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = F.linear(x, self.weight, self.bias)
        x = x.to(self.lora_A.dtype)  # peft casts the input to the adapters' dtype likewise
        return (result + F.linear(F.linear(x, self.lora_A), self.lora_B) * self.scale).to(result.dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.rank}, scale={self.scale:g}"


def target_paths(model: nn.Module, names: Sequence[str]) -> list[str]:
    """Paths in ``model`` of the Linear modules whose last name is in ``names``: the modules a LoRA
    learner adapts and a rollout worker holds adapters for (the same rule on both sides, so the
    push's names meet). Only plain Linear modules count (DiffusionGemma's vision tower wraps its
    q_proj etc. in modules of its own); a name that matches none is an error."""
    linears = [path for path, m in model.named_modules() if isinstance(m, nn.Linear)]
    unknown = [n for n in names if not any(path.rsplit(".", 1)[-1] == n for path in linears)]
    if unknown:
        raise ValueError(f"learner.lora.target_modules: {unknown} name no Linear module of this model "
                         f"(its Linear modules: {sorted({path.rsplit('.', 1)[-1] for path in linears})})")
    return [path for path in linears if path.rsplit(".", 1)[-1] in names]


def attach_adapters(model: nn.Module, paths: Sequence[str], rank: int, scale: float) -> list[str]:
    """Replace each Linear at ``paths`` (in ``model``) by a ``LoraLinear`` of ``rank`` and ``scale``,
    in place; returns the paths replaced. A path already holding adapters of that rank and scale
    keeps them (a worker whose push is set up again keeps the version it holds); of another rank or
    scale, or a path that is no Linear, is an error."""
    replaced = []
    for path in paths:
        parent_path, _, name = path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        module = getattr(parent, name, None)
        if isinstance(module, LoraLinear):
            if (module.rank, module.scale) != (int(rank), float(scale)):
                raise ValueError(f"{path} holds LoRA adapters of rank {module.rank}, scale {module.scale:g}; "
                                 f"rank {rank}, scale {scale:g} were asked for")
            continue
        if not isinstance(module, nn.Linear):
            raise ValueError(f"LoRA adapters for {path!r}, which is no Linear module of this model")
        setattr(parent, name, LoraLinear(module, rank, scale))
        replaced.append(path)
    return replaced


def adapted_paths(model: nn.Module) -> list[str]:
    """Paths of every ``LoraLinear`` of ``model``, in module order."""
    return [path for path, m in model.named_modules() if isinstance(m, LoraLinear)]


@torch.no_grad()
def load_adapters(model: nn.Module, adapters: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Copy ``{path: (A, B)}`` into the ``LoraLinear`` modules of ``model`` (cast to their dtype);
    every adapted module must get its pair and every pair must fit its module."""
    held = set(adapted_paths(model))
    if held != set(adapters):
        raise ValueError(f"adapters for {sorted(set(adapters) - held)[:3]} which hold none here, none for "
                         f"{sorted(held - set(adapters))[:3]}")
    for path, (lora_A, lora_B) in adapters.items():
        module = model.get_submodule(path)
        if tuple(lora_A.shape) != tuple(module.lora_A.shape) or tuple(lora_B.shape) != tuple(module.lora_B.shape):
            raise ValueError(f"adapters of {path} have shapes A {tuple(lora_A.shape)}, B {tuple(lora_B.shape)}; "
                             f"the module takes A {tuple(module.lora_A.shape)}, B {tuple(module.lora_B.shape)}")
        module.lora_A.copy_(lora_A)
        module.lora_B.copy_(lora_B)
