"""``learner.compile``: the elementwise work between a layer's matrix products, compiled.

A decoder layer of the Llama / Qwen2 / Qwen3 classes the full-attention and block families run as
makes, besides its seven matrix products, two RMSNorms (cast to float32, square, mean, rsqrt,
scale, cast back, times the weight) and the gated activation (SiLU of the gate times the up
projection). Eager, each is several kernels forward and more backward, every one a pass over the
whole activation (at LLaDA-8B's width, 32 rows x ~450 tokens: 0.1-0.4 GB a pass), and
activation checkpointing runs the forward ones twice. Here the two functions themselves go through
``torch.compile`` (one fused kernel forward, one backward) and nothing else does:

- each RMSNorm module's forward becomes ``rms_norm(x, weight, eps)`` compiled;
- each MLP's forward becomes ``down(silu_mul(gate(x), up(x)))`` with ``silu_mul`` compiled.

The modules are still called as modules, so ZeRO-3's gathers and releases, LoRA's adapted Linears
and checkpointing see the same calls in the same order: compiling whole layers instead would
trace through DeepSpeed's hooks, which it excludes from tracing, and break the graph around every
gathered module (tried on an H100 under ZeRO-3: no gain). The arithmetic is the
modules' own, operation for operation; compiled kernels round differently, so the results match
eager to rounding (tests/unit/learner/test_learner_fused.py).
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

from stabledrl.common.compiling import compiled_once

# the transformers classes whose forward is exactly the arithmetic below
RMS_NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")
GATED_MLPS = ("LlamaMLP", "Qwen2MLP", "Qwen3MLP")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def _norm_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return compiled_once(rms_norm)(x, self.weight, self.variance_epsilon)


def _mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return self.down_proj(compiled_once(silu_mul)(self.gate_proj(x), self.up_proj(x)))


def fuse_elementwise(model: nn.Module) -> dict[str, int]:
    """Give every RMSNorm and gated MLP of ``model`` the compiled forward (in place, per instance).
    Returns how many of each were changed; a model with neither is refused (nothing to compile)."""
    counts = {"rms_norm": 0, "mlp": 0}
    for module in model.modules():
        name = type(module).__name__
        if name in RMS_NORMS:
            module.forward = types.MethodType(_norm_forward, module)
            counts["rms_norm"] += 1
        elif name in GATED_MLPS and getattr(module.config, "hidden_act", None) == "silu":
            module.forward = types.MethodType(_mlp_forward, module)
            counts["mlp"] += 1
    if not any(counts.values()):
        raise ValueError(f"learner.compile: {type(model).__name__} has no RMSNorm or gated MLP of the Llama / Qwen "
                         "classes to compile; set learner.compile=false")
    return counts
