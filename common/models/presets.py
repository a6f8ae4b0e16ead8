"""Tiny random-initialised presets of every family, for tests and the CPU quickstart."""
from __future__ import annotations

import torch

from common.models.base import DiffusionPolicy, FamilySpec

FAMILIES: dict[str, FamilySpec] = {
    "llada": FamilySpec("llada", attention="full", shifted_logits=False, default_block_size=32),
    "dream": FamilySpec("dream", attention="full", shifted_logits=True, default_block_size=32),
    "sdar": FamilySpec("sdar", attention="block", shifted_logits=False, default_block_size=4),
}

TINY_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def build_tiny_policy(
    family: str = "llada",
    *,
    vocab_size: int = 97,
    mask_token_id: int = 2,
    eos_token_id: int = 1,
    pad_token_id: int = 0,
    block_size: int | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    **shape: int,
) -> DiffusionPolicy:
    """A random-initialised policy of ``family`` at a tiny shape (defaults fit the char tokenizer)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    dims = {**TINY_SHAPE, **shape}
    spec = FAMILIES[family]
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab_size, pad_token_id=pad_token_id, eos_token_id=eos_token_id, attn_implementation="sdpa", **dims)
    if family == "llada":
        model = LlamaForCausalLM(LlamaConfig(is_causal=False, **common))
    elif family == "sdar":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=dims["hidden_size"] // dims["num_attention_heads"], **common))
    else:
        raise NotImplementedError(family)
    model = model.to(dtype).eval()
    return DiffusionPolicy(
        model, spec, mask_token_id=mask_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id, block_size=block_size
    )
