"""LLaDA's rotary embedding at full precision, on the transformers Llama block it runs as.

LLaDA's released model code rotates queries and keys in float32 (``rope_full_precision``, set in the
released configs and the converter's, common/models/convert.py): sin and cos tables in fp32, q and k
upcast, rotated, cast back to their dtype. transformers' Llama casts the tables to the activations'
dtype and rotates there. In bf16 the two part by an ulp in a third of the rotated elements, and the
difference grows through the layers: on the tiny LLaDA of tests/parity/d1_generate.py, 2,178 of
3,136 elements of layer 0's output differ (CPU, bf16); with the rotation as LLaDA does it, none
(tests/parity/d1_generate.py --dtype bfloat16 measures the tokens).

``full_precision_rope(model)`` makes a Llama model rotate as LLaDA does: its rotary embedding
returns fp32 tables (computed from fp32 frequencies kept beside the buffer, which a ``.to(bf16)``
would round), and ``apply_rotary_pos_emb`` of transformers' Llama module rotates in the tables'
dtype and returns the queries' dtype. Where tables and queries share a dtype (every Llama model not
made so here) that function computes exactly what transformers' does, so no other model changes.
The cost is two fp32 elementwise passes over q and k per layer.
"""
from __future__ import annotations

import types

import torch
from torch import nn
from transformers.models.llama.modeling_llama import rotate_half


def rotate_in_table_dtype(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                          unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k rotated in the dtype of ``cos`` / ``sin``, returned in their own dtypes (LLaDA's
    ``apply_rotary_pos_emb(...).type_as(q)``). With tables in the activations' dtype this is
    transformers' own ``apply_rotary_pos_emb``, operation for operation."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    q_, k_ = q.to(cos.dtype), k.to(cos.dtype)
    return (q_ * cos + rotate_half(q_) * sin).to(q.dtype), (k_ * cos + rotate_half(k_) * sin).to(k.dtype)


def _fp32_tables(self: nn.Module, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary embedding's (cos, sin) left in float32, from its float32 frequencies (moved to the
    activations' device once, at the first call there: a copy inside a captured CUDA graph would fail)."""
    if self.inv_freq_fp32.device != x.device:
        self.inv_freq_fp32 = self.inv_freq_fp32.to(x.device)
    freqs = position_ids[..., None].float() * self.inv_freq_fp32  # [B, L, D / 2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling


def full_precision_rope(model: nn.Module) -> None:
    """Make ``model`` (a transformers ``LlamaForCausalLM`` with default RoPE) rotate as LLaDA's code does."""
    from transformers.models.llama import modeling_llama

    rotary = model.model.rotary_emb
    if not isinstance(rotary, modeling_llama.LlamaRotaryEmbedding) or rotary.rope_type != "default":
        raise ValueError(f"full-precision RoPE needs a Llama model with default RoPE, got {type(rotary).__name__}")
    rotary.inv_freq_fp32, _ = type(rotary).compute_default_rope_parameters(rotary.config)  # not a buffer: no cast
    rotary.forward = types.MethodType(_fp32_tables, rotary)
    modeling_llama.apply_rotary_pos_emb = rotate_in_table_dtype
