"""``learner.compile``: the elementwise work between a layer's matrix products, compiled.

A decoder layer of the Llama / Qwen2 / Qwen3 classes the full-attention and block families run as
makes, besides its seven matrix products, two RMSNorms (cast to float32, square, mean, rsqrt,
scale, cast back, times the weight), the rotation of queries and keys (RoPE: two products, a
negated half, a concatenation and a sum each; in float32 for LLaDA, common/models/full_precision_rope.py)
and the gated activation (SiLU of the gate times the up projection). Eager, each is several kernels
forward and more backward, every one a pass over the whole activation (at LLaDA-8B's width, 32 rows
x ~450 tokens: 0.1-0.4 GB a pass), and activation checkpointing runs the forward ones twice. Here the
three functions themselves go through ``torch.compile`` (one fused kernel forward, one backward) and
nothing else does:

- each RMSNorm module's forward becomes ``rms_norm(x, weight, eps)`` compiled;
- each MLP's forward becomes ``down(silu_mul(gate(x), up(x)))`` with ``silu_mul`` compiled;
- each attention module rotates with ``rotate_in_table_dtype`` compiled: its class's own forward
  runs with its modeling module's ``apply_rotary_pos_emb`` (a global the forward looks up at the
  call) pointing at the compiled function for the call's duration, so the same forward re-run by
  activation checkpointing rotates the same way, and no other model in the process changes.

The modules are still called as modules, so ZeRO-3's gathers and releases, LoRA's adapted Linears
and checkpointing see the same calls in the same order: compiling whole layers instead would
trace through DeepSpeed's hooks, which it excludes from tracing, and break the graph around every
gathered module (tried on an H100 under ZeRO-3: no gain). The arithmetic is the
modules' own, operation for operation; compiled kernels round differently, so the results match
eager to rounding (tests/unit/learner/test_learner_fused.py).
"""
from __future__ import annotations

import sys
import types
from contextlib import contextmanager
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from stabledrl.common.compiling import compiled_once
from stabledrl.common.models.full_precision_rope import rotate_in_table_dtype

# the transformers classes whose forward is exactly the arithmetic below
RMS_NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")
GATED_MLPS = ("LlamaMLP", "Qwen2MLP", "Qwen3MLP")
ATTENTIONS = ("LlamaAttention", "Qwen2Attention", "Qwen3Attention")  # rotate via their module's apply_rotary_pos_emb


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


def _rotates_as_known(modeling: Any) -> bool:
    """Whether ``modeling``'s ``apply_rotary_pos_emb`` is transformers' own or LLaDA's full-precision
    one: the two whose arithmetic ``rotate_in_table_dtype`` is."""
    fn = getattr(modeling, "apply_rotary_pos_emb", None)
    return fn is rotate_in_table_dtype or (getattr(fn, "__module__", None) == modeling.__name__
                                           and getattr(fn, "__name__", None) == "apply_rotary_pos_emb")


@contextmanager
def _compiled_rotation(modeling: Any) -> Iterator[None]:
    eager = modeling.apply_rotary_pos_emb
    modeling.apply_rotary_pos_emb = compiled_once(rotate_in_table_dtype)
    try:
        yield
    finally:
        modeling.apply_rotary_pos_emb = eager


def _attention_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    with _compiled_rotation(sys.modules[type(self).__module__]):
        return type(self).forward(self, *args, **kwargs)


def fuse_elementwise(model: nn.Module) -> dict[str, int]:
    """Give every RMSNorm, gated MLP and attention rotation of ``model`` the compiled forward (in place,
    per instance). Returns how many of each were changed; a model with none is refused (nothing to
    compile)."""
    counts = {"rms_norm": 0, "mlp": 0, "rotation": 0}
    for module in model.modules():
        name = type(module).__name__
        if name in RMS_NORMS:
            module.forward = types.MethodType(_norm_forward, module)
            counts["rms_norm"] += 1
        elif name in GATED_MLPS and getattr(module.config, "hidden_act", None) == "silu":
            module.forward = types.MethodType(_mlp_forward, module)
            counts["mlp"] += 1
        elif name in ATTENTIONS and "forward" not in vars(module) \
                and _rotates_as_known(sys.modules[type(module).__module__]):
            module.forward = types.MethodType(_attention_forward, module)
            counts["rotation"] += 1
    if not any(counts.values()):
        raise ValueError(f"learner.compile: {type(model).__name__} has no RMSNorm, gated MLP or attention of the Llama "
                         "/ Qwen classes to compile; set learner.compile=false")
    return counts
