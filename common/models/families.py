"""The four dLLM families: their specs and how a checkpoint's ``config.json`` names them.

| family          | released checkpoints                    | model_type on disk   | runs as (transformers)          |
|-----------------|-----------------------------------------|----------------------|---------------------------------|
| llada           | GSAI-ML/LLaDA-8B-Base / -Instruct       | ``llada``            | LlamaForCausalLM, is_causal=False |
| dream           | Dream-org/Dream-v0-Base-7B / -Instruct  | ``Dream``            | Qwen2ForCausalLM, is_causal=False |
| sdar            | JetLM/SDAR-*-Chat, Gen-Verse/TraDo-*    | ``sdar``             | Qwen3ForCausalLM + block masks  |
| diffusion_gemma | google/diffusiongemma-*                 | ``diffusion_gemma``  | DiffusionGemmaForBlockDiffusion |

LLaDA (arXiv 2502.09992) and Dream (arXiv 2508.15487) are full-attention masked-diffusion models;
Dream predicts token k from position k-1 (it was adapted from the autoregressive Qwen2.5).
SDAR (arXiv 2510.06303) and its RL descendant TraDo are block-diffusion models (block 4): blocks are
causal among themselves and bidirectional inside. DiffusionGemma is block diffusion with an
encoder (causal, over committed tokens) / decoder (bidirectional, over a canvas) split and a
uniform-noise canvas instead of a mask token.

A directory written by ``export_hf`` carries ``dllm_family`` in its config.json, so its transformers
model_type (``llama``, ``qwen2``, ``qwen3``) maps back to the right family.
"""
from __future__ import annotations

from typing import Any, Optional

from stabledrl.common.trust.checkpoint_files import CheckpointError  # a model directory that cannot be loaded, and why
from stabledrl.common.models.base import DiffusionPolicy, FamilySpec
from stabledrl.common.models.diffusion_gemma import DiffusionGemmaPolicy
from stabledrl.common.models.full_precision_rope import full_precision_rope

FAMILIES: dict[str, FamilySpec] = {
    "llada": FamilySpec("llada", attention="full", shifted_logits=False, default_block_size=32),
    "dream": FamilySpec("dream", attention="full", shifted_logits=True, default_block_size=32),
    "sdar": FamilySpec("sdar", attention="block", shifted_logits=False, default_block_size=4),
    "diffusion_gemma": FamilySpec(
        "diffusion_gemma", attention="block", shifted_logits=False, default_block_size=256, noise="uniform"
    ),
}

# config.json "model_type" of the released checkpoints (compared lower-cased: Dream writes "Dream")
ORIGINAL_MODEL_TYPES: dict[str, str] = {
    "llada": "llada",
    "dream": "dream",
    "sdar": "sdar",
    "diffusion_gemma": "diffusion_gemma",
}

# model_type of the transformers classes each family runs as (what export_hf writes)
HF_MODEL_TYPES: dict[str, str] = {
    "llada": "llama",
    "dream": "qwen2",
    "sdar": "qwen3",
    "diffusion_gemma": "diffusion_gemma",
}

FAMILY_KEY = "dllm_family"  # written into exported config.json files


def checkpoint_block_size(family: str, raw_config: dict[str, Any], override: Optional[int] = None) -> int:
    """The policy's block: ``override`` (model.block_size), else the checkpoint's own key (SDAR /
    TraDo ``block_size``, DiffusionGemma ``canvas_length``), else the family's default."""
    return int(override or raw_config.get("block_size") or raw_config.get("canvas_length")
               or FAMILIES[family].default_block_size)


def detect_family(raw_config: dict[str, Any], override: Optional[str] = None) -> tuple[str, bool]:
    """(family, is_original_format) of a checkpoint from its config.json contents.

    ``override`` (ModelConfig.family) wins over detection but must agree with the on-disk format:
    an original LLaDA directory cannot be read as Dream.
    """
    model_type = str(raw_config.get("model_type", "")).lower()
    tagged = raw_config.get(FAMILY_KEY)
    original = {t: f for f, t in ORIGINAL_MODEL_TYPES.items()}
    if model_type in original and not tagged:
        family, is_original = original[model_type], True
    elif tagged in FAMILIES and model_type == HF_MODEL_TYPES[tagged]:
        family, is_original = tagged, tagged == "diffusion_gemma"
    elif override in FAMILIES and model_type == HF_MODEL_TYPES[override]:
        family, is_original = override, override == "diffusion_gemma"
    else:
        known = ", ".join(sorted(set(original) | {HF_MODEL_TYPES[f] + f" (with {FAMILY_KEY})" for f in FAMILIES}))
        raise CheckpointError(
            f"config.json has model_type {raw_config.get('model_type')!r}, which is no dLLM family this loader knows "
            f"(known: {known}); set model.family to read a plain transformers directory as one of {sorted(FAMILIES)}"
        )
    if override is not None and override != family:
        raise CheckpointError(f"model.family is {override!r} but the checkpoint is a {family!r} checkpoint")
    return family, is_original


def make_policy(
    family: str,
    model: Any,
    *,
    mask_token_id: int,
    eos_token_id: int,
    pad_token_id: int,
    block_size: Optional[int] = None,
) -> DiffusionPolicy:
    """Wrap a transformers model of ``family`` in its policy class (full-attention families are made
    bidirectional on every attention module as well as in the config, so no transformers release
    can fall back to a causal kernel when no mask is passed; LLaDA rotates at full precision)."""
    spec = FAMILIES[family]
    if family == "llada":  # LLaDA's code rotates q and k in fp32 (common/models/full_precision_rope.py)
        full_precision_rope(model)
    if spec.attention == "full":
        model.config.is_causal = False
        for module in model.modules():
            if isinstance(getattr(module, "is_causal", None), bool):
                module.is_causal = False
    cls = DiffusionGemmaPolicy if family == "diffusion_gemma" else DiffusionPolicy
    return cls(
        model,
        spec,
        mask_token_id=mask_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        block_size=block_size,
    )
