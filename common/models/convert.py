"""Released on-disk formats <-> the transformers classes each family runs as (no remote code).

LLaDA ships OLMo-style code (``LLaDAModelLM``): ``model.transformer.{wte, blocks.N.*, ln_f, ff_out}``
and config keys ``d_model, n_heads, n_kv_heads, n_layers, mlp_hidden_size, ...``. Its block is a
Llama block: RMSNorm (fp32, eps ``rms_norm_eps``) -> q/k/v -> RoPE (rotate-half, ``rope_theta``) ->
``attn_out``; RMSNorm -> SwiGLU ``ff_out(silu(ff_proj(x)) * up_proj(x))``. So ``ff_proj`` is the
*gate* and ``up_proj`` the up projection; no biases, untied output head ``ff_out`` (``weight_tying``).
It maps onto ``LlamaForCausalLM`` with ``is_causal=False``; settings with no Llama equivalent
(alibi, q/k layer norm, logit scaling, bias-only-on-qkv, ...) are refused, never approximated.

Dream (``DreamModel``) and SDAR/TraDo (``SDARForCausalLM``) already use Qwen2 / Qwen3 parameter
names; only their config's ``model_type`` and a few keys differ.
"""
from __future__ import annotations

import re
from typing import Any

import torch
from transformers import LlamaConfig, PretrainedConfig, Qwen2Config, Qwen3Config

from stabledrl.common.llada_names import LLADA_BLOCK
from stabledrl.common.models.families import FAMILY_KEY, CheckpointError

State = dict[str, torch.Tensor]

# --------------------------------------------------------------------------------------------- LLaDA
# keys whose released value is the only one a Llama block reproduces exactly (absent = default)
_LLADA_REQUIRED: dict[str, Any] = {
    "alibi": False,
    "rope": True,
    "attention_layer_norm": False,
    "layer_norm_type": "rms",
    "layer_norm_with_affine": True,
    "block_type": "llama",
    "activation_type": "silu",
    "input_emb_norm": False,
    "scale_logits": False,
    "include_bias": False,
    "include_qkv_bias": False,
    "block_group_size": 1,
    "clip_qkv": None,
}
_LLADA_TOP = {
    "model.transformer.wte.weight": "model.embed_tokens.weight",
    "model.transformer.ln_f.weight": "model.norm.weight",
    "model.transformer.ff_out.weight": "lm_head.weight",
}
_LLADA_BLOCK_KEY = re.compile(r"^model\.transformer\.blocks\.(\d+)\.(\w+)\.weight$")
_HF_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.(.+)\.weight$")


def llada_released_path(path: str) -> str:
    """A Linear's path in the Llama model LLaDA runs as here -> its path in LLaDA's own code
    (``model.layers.3.self_attn.o_proj`` -> ``model.transformer.blocks.3.attn_out``, ``lm_head`` ->
    ``model.transformer.ff_out``): where PEFT puts the module's adapters on LLaDA's code."""
    key = f"{path}.weight"
    top = {v: k for k, v in _LLADA_TOP.items()}
    layer = _HF_LAYER_KEY.match(key)
    block = {v: k for k, v in LLADA_BLOCK.items()}
    if key in top:
        return top[key].removesuffix(".weight")
    if layer and layer.group(2) in block:
        return f"model.transformer.blocks.{layer.group(1)}.{block[layer.group(2)]}"
    raise CheckpointError(f"{path} has no LLaDA counterpart")


def llada_project_path(path: str) -> str:
    """The inverse of ``llada_released_path``."""
    key = f"{path}.weight"
    block = _LLADA_BLOCK_KEY.match(key)
    if key in _LLADA_TOP:
        return _LLADA_TOP[key].removesuffix(".weight")
    if block and block.group(2) in LLADA_BLOCK:
        return f"model.layers.{block.group(1)}.{LLADA_BLOCK[block.group(2)]}"
    raise CheckpointError(f"{path} is no module of LLaDA's code this project maps")


def _rope(raw: dict[str, Any], default_theta: float) -> dict[str, Any]:
    scaling = raw.get("rope_scaling") or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    return {**scaling, "rope_type": rope_type, "rope_theta": float(raw.get("rope_theta", default_theta))}


def _first(token_id: Any) -> Any:
    return token_id[0] if isinstance(token_id, (list, tuple)) and token_id else token_id


def llada_config(raw: dict[str, Any]) -> LlamaConfig:
    """LLaDA config.json -> LlamaConfig(is_causal=False) computing the same function."""
    bad = {k: raw[k] for k, v in _LLADA_REQUIRED.items() if k in raw and raw[k] != v}
    if raw.get("bias_for_layer_norm"):
        bad["bias_for_layer_norm"] = raw["bias_for_layer_norm"]
    if bad:
        raise CheckpointError(f"LLaDA settings with no exact Llama equivalent: {bad} (supported: {_LLADA_REQUIRED})")
    heads = int(raw["n_heads"])
    kv_heads = 1 if raw.get("multi_query_attention") else int(raw.get("n_kv_heads") or heads)
    hidden = int(raw["d_model"])
    return LlamaConfig(
        vocab_size=int(raw.get("embedding_size") or raw["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(raw.get("mlp_hidden_size") or raw.get("mlp_ratio", 4) * hidden),
        num_hidden_layers=int(raw["n_layers"]),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        hidden_act="silu",
        max_position_embeddings=int(raw.get("max_sequence_length", 4096)),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
        rope_parameters=_rope(raw, 10000.0),
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=bool(raw.get("weight_tying", False)),
        pad_token_id=_first(raw.get("pad_token_id")),
        eos_token_id=_first(raw.get("eos_token_id")),
        bos_token_id=_first(raw.get("bos_token_id")),
        is_causal=False,
    )


def llada_state(state: State) -> State:
    out: State = {}
    unknown = []
    for key, tensor in state.items():
        block = _LLADA_BLOCK_KEY.match(key)
        if key in _LLADA_TOP:
            out[_LLADA_TOP[key]] = tensor
        elif block and block.group(2) in LLADA_BLOCK:
            out[f"model.layers.{block.group(1)}.{LLADA_BLOCK[block.group(2)]}.weight"] = tensor
        else:
            unknown.append(key)
    if unknown:
        raise CheckpointError(f"LLaDA checkpoint has parameters with no Llama counterpart: {unknown[:8]}")
    return out


def llada_original(config: PretrainedConfig, state: State) -> tuple[dict[str, Any], State]:
    """The inverse: LlamaConfig + state -> (LLaDA config.json dict, LLaDA parameter names)."""
    block_names = {v: k for k, v in LLADA_BLOCK.items()}
    top_names = {v: k for k, v in _LLADA_TOP.items()}
    out: State = {}
    for key, tensor in state.items():
        layer = _HF_LAYER_KEY.match(key)
        if key in top_names:
            if not (key == "lm_head.weight" and config.tie_word_embeddings):
                out[top_names[key]] = tensor
        elif layer and layer.group(2) in block_names:
            out[f"model.transformer.blocks.{layer.group(1)}.{block_names[layer.group(2)]}.weight"] = tensor
        else:
            raise CheckpointError(f"{key} has no LLaDA counterpart")
    rope = config.rope_parameters or {}
    raw = {
        "architectures": ["LLaDAModelLM"],
        "auto_map": {
            "AutoConfig": "configuration_llada.LLaDAConfig",
            "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
            "AutoModel": "modeling_llada.LLaDAModelLM",
        },
        "model_type": "llada",
        **_LLADA_REQUIRED,
        # the released config's zeros: LLaDA's code defaults all three dropouts to 0.1 where a key is missing
        "attention_dropout": 0.0,
        "residual_dropout": 0.0,
        "embedding_dropout": 0.0,
        "bias_for_layer_norm": False,
        "d_model": config.hidden_size,
        "n_heads": config.num_attention_heads,
        "n_kv_heads": config.num_key_value_heads,
        "n_layers": config.num_hidden_layers,
        "mlp_hidden_size": config.intermediate_size,
        "mlp_ratio": max(1, config.intermediate_size // config.hidden_size),
        "embedding_size": config.vocab_size,
        "vocab_size": config.vocab_size,
        "max_sequence_length": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": float(rope.get("rope_theta", 10000.0)),
        "rope_full_precision": True,
        "weight_tying": bool(config.tie_word_embeddings),
        "multi_query_attention": None,
        "use_cache": False,
    }
    return raw, out


# ------------------------------------------------------------------------------- Dream, SDAR/TraDo
_QWEN_KEYS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "hidden_act", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
    "attention_dropout",
)  # fmt: skip


def dream_config(raw: dict[str, Any]) -> Qwen2Config:
    """Dream config.json (model_type "Dream") -> Qwen2Config(is_causal=False)."""
    if raw.get("use_sliding_window"):
        raise CheckpointError("Dream checkpoints with use_sliding_window=true are not supported")
    kept = {k: raw[k] for k in _QWEN_KEYS if k in raw}
    return Qwen2Config(
        **kept,
        rope_parameters=_rope(raw, 10000.0),
        use_sliding_window=False,
        pad_token_id=_first(raw.get("pad_token_id")),
        eos_token_id=_first(raw.get("eos_token_id")),
        bos_token_id=_first(raw.get("bos_token_id")),
        is_causal=False,
    )


def sdar_config(raw: dict[str, Any]) -> Qwen3Config:
    """SDAR / TraDo config.json (model_type "sdar") -> Qwen3Config; block-causal attention comes from
    the 4-D masks the callers build (common/attention.py), not from the config."""
    if raw.get("use_sliding_window"):
        raise CheckpointError("SDAR checkpoints with use_sliding_window=true are not supported")
    kept = {k: raw[k] for k in _QWEN_KEYS if k in raw}
    head_dim = raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"]
    return Qwen3Config(
        **kept,
        head_dim=int(head_dim),
        attention_bias=bool(raw.get("attention_bias", False)),
        rope_parameters=_rope(raw, 10000.0),
        use_sliding_window=False,
        pad_token_id=_first(raw.get("pad_token_id")),
        eos_token_id=_first(raw.get("eos_token_id")),
        bos_token_id=_first(raw.get("bos_token_id")),
    )


def _qwen_original(config: PretrainedConfig, model_type: str, auto_map: dict[str, str], arch: str) -> dict[str, Any]:
    raw: dict[str, Any] = {"architectures": [arch], "auto_map": auto_map, "model_type": model_type}
    raw.update({k: getattr(config, k) for k in _QWEN_KEYS})
    rope = config.rope_parameters or {}
    raw["rope_theta"] = float(rope.get("rope_theta", 10000.0))
    raw["rope_scaling"] = None
    raw["use_sliding_window"] = False
    raw["sliding_window"] = None
    raw["max_window_layers"] = config.num_hidden_layers
    return raw


def dream_original(config: PretrainedConfig, state: State) -> tuple[dict[str, Any], State]:
    auto_map = {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"}
    return _qwen_original(config, "Dream", auto_map, "DreamModel"), _untie(config, state)


def sdar_original(config: PretrainedConfig, state: State) -> tuple[dict[str, Any], State]:
    auto_map = {
        "AutoConfig": "configuration_sdar.SDARConfig",
        "AutoModel": "modeling_sdar.SDARModel",
        "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM",
    }
    raw = _qwen_original(config, "sdar", auto_map, "SDARForCausalLM")
    raw["head_dim"] = config.head_dim
    raw["attention_bias"] = bool(config.attention_bias)
    # SDAR's forward reads this key, which its config class does not default: without it the release's
    # code cannot run the export. False is what the release's own training scripts set
    raw["fuse_cross_entropy"] = False
    return raw, _untie(config, state)


def _untie(config: PretrainedConfig, state: State) -> State:
    if config.tie_word_embeddings:
        return {k: v for k, v in state.items() if k != "lm_head.weight"}
    return dict(state)


# ------------------------------------------------------------------------------------ dispatch
_TO_HF = {"llada": (llada_config, llada_state), "dream": (dream_config, dict), "sdar": (sdar_config, dict)}
_TO_ORIGINAL = {"llada": llada_original, "dream": dream_original, "sdar": sdar_original}


def original_to_hf(family: str, raw: dict[str, Any], state: State) -> tuple[PretrainedConfig, State]:
    """(transformers config, state dict with transformers names) of a released-format checkpoint."""
    make_config, rename = _TO_HF[family]
    config = make_config(raw)
    setattr(config, FAMILY_KEY, family)
    for key in ("mask_token_id", "block_size"):
        if raw.get(key) is not None:
            setattr(config, key, raw[key])
    return config, rename(state)


def hf_to_original(family: str, config: PretrainedConfig, state: State) -> tuple[dict[str, Any], State]:
    """(config.json dict, state dict) in the family's released format; token ids are added by the caller."""
    if family not in _TO_ORIGINAL:
        raise ValueError(f"{family!r} has no separate released format; its checkpoints are transformers-native")
    return _TO_ORIGINAL[family](config, state)
