"""Tiny random-initialised presets of every family, for tests and the CPU quickstart.

Each preset is the family's real transformers class at a toy shape (two layers, hidden size 64), so
tests exercise exactly the code paths a released checkpoint uses, in milliseconds on a CPU. The
default vocabulary and special ids fit ``stabledrl.common.tokenizer.build_char_tokenizer()``.
"""
from __future__ import annotations

from typing import Optional

import torch

from stabledrl.common.models.base import DiffusionPolicy
from stabledrl.common.models.families import FAMILIES, make_policy
from stabledrl.common.models.diffusion_gemma import require_diffusion_gemma, tiny_config

TINY_SHAPE = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
)

# ModelConfig.preset name -> family
PRESETS: dict[str, str] = {
    "tiny-llada": "llada",
    "tiny-dream": "dream",
    "tiny-sdar": "sdar",
    "tiny-diffusion-gemma": "diffusion_gemma",
}
TINY_CANVAS = 4  # DiffusionGemma's canvas (block) length at the tiny shape


def build_tiny_policy(
    family: str = "llada",
    *,
    vocab_size: int = 97,
    mask_token_id: int = 2,
    eos_token_id: int = 1,
    pad_token_id: int = 0,
    bos_token_id: int = 3,
    block_size: Optional[int] = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "sdpa",
    **shape: int,
) -> DiffusionPolicy:
    """A random-initialised policy of ``family`` at a tiny shape (defaults fit the char tokenizer)."""
    if family not in FAMILIES:
        raise KeyError(f"unknown model family {family!r}; valid: {', '.join(sorted(FAMILIES))}")
    dims = {**TINY_SHAPE, **shape}
    torch.manual_seed(seed)
    ids = dict(pad_token_id=pad_token_id, eos_token_id=eos_token_id, bos_token_id=bos_token_id)
    if family == "diffusion_gemma":
        block_size = block_size or TINY_CANVAS
        config = tiny_config(
            vocab_size=vocab_size, canvas_length=block_size, attn_implementation=attn_implementation, **ids, **dims
        )
        model = require_diffusion_gemma().DiffusionGemmaForBlockDiffusion(config)
    else:
        model = _tiny_causal_lm(family, vocab_size, attn_implementation, ids, dims)
    model = model.to(dtype).eval()
    return make_policy(
        family,
        model,
        mask_token_id=mask_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        block_size=block_size,
    )


def _tiny_causal_lm(family: str, vocab_size: int, attn_implementation: str, ids: dict, dims: dict) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(
        vocab_size=vocab_size, attn_implementation=attn_implementation, tie_word_embeddings=False, **ids, **dims
    )
    head_dim = dims["hidden_size"] // dims["num_attention_heads"]
    if family == "llada":
        rope = {"rope_type": "default", "rope_theta": 500000.0}  # LLaDA-8B's theta
        config = LlamaConfig(is_causal=False, head_dim=head_dim, rms_norm_eps=1e-5, rope_parameters=rope, **common)
        return LlamaForCausalLM(config)
    if family == "dream":
        rope = {"rope_type": "default", "rope_theta": 1000000.0}  # Qwen2.5's theta
        return Qwen2ForCausalLM(Qwen2Config(is_causal=False, rms_norm_eps=1e-6, rope_parameters=rope, **common))
    rope = {"rope_type": "default", "rope_theta": 1000000.0}
    return Qwen3ForCausalLM(Qwen3Config(head_dim=head_dim, rms_norm_eps=1e-6, rope_parameters=rope, **common))
