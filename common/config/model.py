"""The model section: which dLLM to load and how (``stabledrl.common.models.load_policy`` reads it).

    model: {path: /ckpt/LLaDA-8B-Instruct, dtype: bfloat16}
    model: {preset: tiny-sdar, dtype: float32, preset_shape: {hidden_size: 32}}

Exactly one of ``path`` (a local directory: config.json + *.safetensors + tokenizer files, in the
family's released format or written by ``export_hf``; or a hub id such as
``GSAI-ML/LLaDA-8B-Instruct`` found in the local Hugging Face cache) and ``preset`` (a tiny random
model with the character tokenizer) is set. Nothing is downloaded and no checkpoint code is ever
executed.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import Field, PositiveInt, field_validator, model_validator

from stabledrl.common.config.base import StrictModel

Family = Literal["llada", "dream", "sdar", "diffusion_gemma"]
Preset = Literal["tiny-llada", "tiny-dream", "tiny-sdar", "tiny-diffusion-gemma"]
AttnImplementation = Literal["sdpa", "flash_attention_2", "flex_attention"]


class PresetShape(StrictModel):
    """Shape of a tiny preset (the defaults run a forward in milliseconds on a CPU)."""

    hidden_size: PositiveInt = Field(64, description="width of the residual stream")
    intermediate_size: PositiveInt = Field(128, description="width of the SwiGLU MLP")
    num_hidden_layers: PositiveInt = Field(
        2, description="transformer blocks (DiffusionGemma: >= 2 to have both layer kinds)"
    )
    num_attention_heads: PositiveInt = Field(4, description="query heads; must divide hidden_size")
    num_key_value_heads: PositiveInt = Field(
        2, description="key/value heads (grouped-query attention); must divide num_attention_heads"
    )
    seed: int = Field(0, ge=0, description="torch seed of the random initialisation")

    @model_validator(mode="after")
    def _divisible(self) -> "PresetShape":
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must divide hidden_size ({self.hidden_size})"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_key_value_heads ({self.num_key_value_heads}) must divide "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        return self


class ModelConfig(StrictModel):
    """Which model to load, in which precision and with which attention kernel."""

    path: Optional[Path] = Field(
        None,
        description="checkpoint: a local directory (config.json + *.safetensors + tokenizer), or a Hugging Face hub id "
        "('GSAI-ML/LLaDA-8B-Instruct') resolved from the local hub cache (HF_HUB_CACHE / HF_HOME); nothing is "
        "downloaded, a hub id missing from the cache is refused with the command that fetches it",
    )
    revision: Optional[str] = Field(
        None, description="hub revision (branch, tag or commit) of a hub-id model.path; None = the cached main"
    )
    preset: Optional[Preset] = Field(None, description="a tiny random-initialised model of one family, char tokenizer")
    family: Optional[Family] = Field(
        None,
        description="override of the family detected from config.json's model_type; needed only to read a plain "
        "transformers directory (model_type llama / qwen2 / qwen3) that export_hf did not tag",
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="parameter dtype; the released recipes train full-parameter bfloat16 on GPUs"
    )
    attn_implementation: AttnImplementation = Field(
        "sdpa",
        description="transformers attention kernel. sdpa takes our 4-D boolean masks as they are; flex_attention "
        "(CUDA) gets them as a BlockMask; flash_attention_2 can apply no 4-D mask, so it is refused for "
        "block-diffusion families and for any masked forward. 'eager' is not offered: it ignores custom 4-D masks",
    )
    staircase_attention: Literal["sdpa", "flex"] = Field(
        "sdpa",
        description="kernel of the block-diffusion staircase forward (the learner's and scorer's one-pass "
        "likelihood of SDAR / TraDo). sdpa: the dense [B, 1, L, L] boolean mask (no flash kernel); flex: a flex "
        "BlockMask built from the layout's mask_mod (empty tiles skipped, flex_attention compiled on CUDA; "
        "common/models/flex_staircase.py). Every other forward stays on sdpa. Needs attn_implementation sdpa; "
        "no effect on full-attention families; not offered for diffusion_gemma",
    )
    block_size: Optional[PositiveInt] = Field(
        None,
        description="generation / diffusion block; None = the checkpoint's (block_size or canvas_length in "
        "config.json) or the family default (LLaDA, Dream 32; SDAR/TraDo 4; DiffusionGemma 256)",
    )
    gradient_checkpointing: bool = Field(False, description="recompute activations in backward (learner memory saver)")
    checkpointed_layers: Optional[int] = Field(
        None, ge=0, description="with gradient_checkpointing: only the first N decoder layers recompute their "
        "activations, the others keep them (less recompute for more memory: at LLaDA-8B's width about 0.4 GiB a "
        "layer for 6 rows of 400 tokens); None: every layer")
    preset_shape: Optional[PresetShape] = Field(None, description="shape of the tiny preset (presets only)")

    @field_validator("attn_implementation", mode="before")
    @classmethod
    def _no_eager(cls, value: Any) -> Any:
        if value == "eager":
            raise ValueError(
                "'eager' attention ignores custom 4-D attention masks (padding, block-causal and staircase layouts "
                "would silently leak); use 'sdpa'"
            )
        return value

    @model_validator(mode="after")
    def _one_source(self) -> "ModelConfig":
        if (self.path is None) == (self.preset is None):
            raise ValueError("set exactly one of model.path (a checkpoint directory) and model.preset (a tiny model)")
        if self.revision is not None and self.path is None:
            raise ValueError("model.revision applies to a hub-id model.path only")
        if self.preset_shape is not None and self.preset is None:
            raise ValueError("model.preset_shape applies to presets only; a checkpoint brings its own shape")
        if self.staircase_attention == "flex" and self.attn_implementation != "sdpa":
            raise ValueError(
                f"model.staircase_attention flex runs beside sdpa; set model.attn_implementation sdpa "
                f"(got {self.attn_implementation!r})"
            )
        if self.checkpointed_layers is not None and not self.gradient_checkpointing:
            raise ValueError("model.checkpointed_layers limits model.gradient_checkpointing to the first layers; "
                             "set model.gradient_checkpointing true or leave checkpointed_layers unset")
        preset_family = None if self.preset is None else self.preset.removeprefix("tiny-").replace("-", "_")
        if self.family is not None and preset_family not in (None, self.family):
            raise ValueError(f"model.family {self.family!r} contradicts model.preset {self.preset!r}")
        return self
