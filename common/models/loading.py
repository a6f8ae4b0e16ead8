"""``load_policy``: a ModelConfig -> (DiffusionPolicy, tokenizer), from a checkpoint directory or a preset.

``model.path`` is a local directory or a hub id resolved from the local Hugging Face cache
(``stabledrl.common.models.model_dir``). Safety and reproducibility rules: nothing is downloaded
(``local_files_only``), no code shipped with
a checkpoint runs (``trust_remote_code=False``; released LLaDA / Dream / SDAR directories carry
their own modeling code, which is replaced by the conversions in ``convert.py``), and weights are read
only with safetensors or ``torch.load(weights_only=True)`` after ``stabledrl.common.trust.checkpoint_files`` has
checked every ``pytorch_model*.bin`` of the directory (refused, naming the file, if its pickle names
anything but tensors).

Token ids come from the checkpoint's config.json first (LLaDA and Dream record ``mask_token_id``),
then from the tokenizer (SDAR / TraDo's ``<|MASK|>``, Gemma's ``<mask>``); a directory with no mask
token at all is refused, because every sampler and estimator needs one.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional, Union

import torch

from stabledrl.common.trust.checkpoint_files import check_weight_files, load_torch
from stabledrl.common.config.model import ModelConfig, PresetShape
from stabledrl.common.models.base import DiffusionPolicy
from stabledrl.common.models.convert import State, original_to_hf
from stabledrl.common.models.families import (
    FAMILIES, CheckpointError, checkpoint_block_size, detect_family, make_policy,
)
from stabledrl.common.models.flex_staircase import use_flex_staircase
from stabledrl.common.models.model_dir import read_json_file, resolve_model_dir
from stabledrl.common.models.presets import PRESETS, build_tiny_policy
from stabledrl.common.models.tokenizer_files import load_tokenizer
from stabledrl.common.tokenizer import build_char_tokenizer
from stabledrl.common.models.diffusion_gemma import require_diffusion_gemma

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
CAUSAL_LM_CLASSES = {"llada": "LlamaForCausalLM", "dream": "Qwen2ForCausalLM", "sdar": "Qwen3ForCausalLM"}
MASK_TOKEN_NAMES = ("<|mdm_mask|>", "<|MASK|>", "<|mask|>", "<mask>", "[MASK]")


def load_policy(
    cfg: ModelConfig,
    device: Optional[Union[str, torch.device]] = None,
    dtype: Optional[Union[str, torch.dtype]] = None,
) -> tuple[DiffusionPolicy, Any]:
    """(policy in eval mode, tokenizer) for ``cfg``; ``dtype`` overrides ``cfg.dtype``."""
    torch_dtype = DTYPES[dtype] if isinstance(dtype, str) else (dtype or DTYPES[cfg.dtype])
    if cfg.preset is not None:
        policy, tokenizer = _load_preset(cfg, torch_dtype)
    else:
        with quiet_progress():
            policy, tokenizer = _load_directory(cfg, torch_dtype)
    if cfg.staircase_attention == "flex" and policy.is_block_diffusion:
        if policy.spec.name == "diffusion_gemma":
            raise CheckpointError("model.staircase_attention flex is not offered for diffusion_gemma; use sdpa")
        use_flex_staircase(policy)
    if cfg.gradient_checkpointing:
        policy.model.config.use_cache = False
        _enable_checkpointing(policy.model)
        if cfg.checkpointed_layers is not None:
            checkpoint_first_layers(policy.model, cfg.checkpointed_layers)
    if device is not None:
        policy.to(device)
    return policy.eval(), tokenizer


@contextmanager
def quiet_progress() -> Iterator[None]:
    """transformers without its per-shard progress bar (every actor loads the model: one bar each
    in the job's log)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _enable_checkpointing(model: torch.nn.Module) -> None:
    # transformers >= 5.2x names it activation_checkpointing_enable (the old name warns); accept both
    options = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=options)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)


def checkpoint_first_layers(model: torch.nn.Module, n: int) -> int:
    """Activation checkpointing in the first ``n`` decoder layers of ``model`` only (checkpointing
    already enabled): the later layers keep their activations for the backward instead of
    recomputing them. Returns the number of decoder layers; more than there are is refused."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise CheckpointError(f"model.checkpointed_layers: {type(model).__name__} has no decoder layers that "
                              "checkpoint one by one; leave it unset")
    if n > len(layers):
        raise CheckpointError(f"model.checkpointed_layers = {n}, but the model has {len(layers)} decoder layers")
    for i, layer in enumerate(layers):
        layer.gradient_checkpointing = i < n
    return len(layers)


def _load_preset(cfg: ModelConfig, dtype: torch.dtype) -> tuple[DiffusionPolicy, Any]:
    family = PRESETS[cfg.preset]
    _check_attention(family, cfg.attn_implementation)
    tokenizer = build_char_tokenizer()
    shape = (cfg.preset_shape or _default_shape()).model_dump()
    policy = build_tiny_policy(
        family,
        vocab_size=len(tokenizer),
        mask_token_id=tokenizer.mask_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        block_size=cfg.block_size,
        seed=shape.pop("seed"),
        dtype=dtype,
        attn_implementation=cfg.attn_implementation,
        **shape,
    )
    return policy, tokenizer


def _default_shape() -> Any:
    return PresetShape()


def check_model_files(cfg: ModelConfig) -> None:
    """The driver's check of ``cfg.path``'s pickle-based weight files before any actor loads them
    (CheckpointError naming the file): a refusal here stops the job at once, not in each worker
    after its restarts. A preset has no files."""
    if cfg.preset is None and cfg.path is not None:
        check_weight_files(resolve_model_dir(cfg.path, cfg.revision))


def load_model_tokenizer(cfg: ModelConfig) -> Any:
    """The tokenizer ``load_policy(cfg)`` returns, without the weights (the driver counts prompt
    tokens with it before any actor starts)."""
    if cfg.preset is not None:
        return build_char_tokenizer()
    return load_tokenizer(resolve_model_dir(cfg.path, cfg.revision))


def _load_directory(cfg: ModelConfig, dtype: torch.dtype) -> tuple[DiffusionPolicy, Any]:
    path = resolve_model_dir(cfg.path, cfg.revision)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise CheckpointError(
            f"{path} has no config.json; a checkpoint directory needs config.json, weights and tokenizer files"
        )
    raw = read_json_file(config_file)
    check_weight_files(path)  # pytorch_model*.bin holding more than tensors is refused, naming the file
    family, is_original = detect_family(raw, cfg.family)
    _check_attention(family, cfg.attn_implementation)
    tokenizer = load_tokenizer(path)
    if family == "diffusion_gemma":
        model = _from_pretrained_native(path, dtype, cfg.attn_implementation)
    elif is_original:
        config, state = original_to_hf(family, raw, read_state_dict(path))
        model = _instantiate(family, config, state, dtype, cfg.attn_implementation)
    else:
        model = _from_pretrained_exported(family, path, dtype, cfg.attn_implementation)
    mask_id, eos_id, pad_id = resolve_token_ids(raw, tokenizer)
    block = checkpoint_block_size(family, raw, cfg.block_size)
    policy = make_policy(
        family, model, mask_token_id=mask_id, eos_token_id=eos_id, pad_token_id=pad_id, block_size=block
    )
    return policy, tokenizer


def _check_attention(family: str, attn_implementation: str) -> None:
    if attn_implementation == "flash_attention_2" and FAMILIES[family].attention == "block":
        raise CheckpointError(
            "attn_implementation flash_attention_2 cannot take the block-causal 4-D masks "
            f"the {family!r} family needs; use sdpa or flex_attention"
        )


def read_state_dict(path: Path) -> State:
    """Every tensor of the checkpoint (safetensors shards, else pytorch_model*.bin with weights_only)."""
    from safetensors.torch import load_file

    shards = _weight_files(path, "model.safetensors.index.json", "*.safetensors")
    if shards:
        state: State = {}
        for shard in shards:
            try:
                state.update(load_file(str(shard)))
            except Exception as e:  # SafetensorError: a truncated download or a file that is not safetensors
                raise CheckpointError(f"{shard} cannot be read as safetensors ({e}); the file is truncated or "
                                      "corrupt: copy or download it again") from None
        return state
    bins = _weight_files(path, "pytorch_model.bin.index.json", "pytorch_model*.bin")
    if not bins:
        raise CheckpointError(f"{path} holds no weights (*.safetensors or pytorch_model*.bin)")
    state = {}
    for shard in bins:
        state.update(load_torch(shard, map_location="cpu", mmap=True))
    return state


def _weight_files(path: Path, index_name: str, pattern: str) -> list[Path]:
    index = path / index_name
    if index.is_file():
        names = sorted(set((read_json_file(index).get("weight_map") or {}).values()))
        missing = [n for n in names if not (path / n).is_file()]
        if missing:
            raise CheckpointError(f"{index} lists shards that are missing: {missing}")
        return [path / n for n in names]
    return sorted(path.glob(pattern))


def _instantiate(
    family: str, config: Any, state: State, dtype: torch.dtype, attn_implementation: str
) -> torch.nn.Module:
    """The transformers model of ``config`` holding exactly ``state`` (missing, unexpected or
    mis-shaped tensors are errors, not silently re-initialised weights)."""
    import transformers

    cls = getattr(transformers, CAUSAL_LM_CLASSES[family])
    model, info = cls.from_pretrained(
        None,
        config=config,
        state_dict=state,
        dtype=dtype,
        attn_implementation=attn_implementation,
        output_loading_info=True,
    )
    _check_loading_info(info, f"{type(config).__name__} conversion")
    return model.eval()


def _from_pretrained_exported(family: str, path: Path, dtype: torch.dtype, attn_implementation: str) -> torch.nn.Module:
    import transformers

    with readable_weights(path):
        model, info = getattr(transformers, CAUSAL_LM_CLASSES[family]).from_pretrained(
            path, local_files_only=True, trust_remote_code=False, dtype=dtype,
            attn_implementation=attn_implementation, output_loading_info=True,
        )  # fmt: skip
    _check_loading_info(info, str(path))
    return model.eval()


def _from_pretrained_native(path: Path, dtype: torch.dtype, attn_implementation: str) -> torch.nn.Module:
    cls = require_diffusion_gemma().DiffusionGemmaForBlockDiffusion
    with readable_weights(path):
        model, info = cls.from_pretrained(
            path, local_files_only=True, trust_remote_code=False, dtype=dtype,
            attn_implementation=attn_implementation, output_loading_info=True,
        )  # fmt: skip
    _check_loading_info(info, str(path))
    return model.eval()


@contextmanager
def readable_weights(path: Path) -> Iterator[None]:
    """Turn a safetensors read failure inside transformers into a CheckpointError naming the file."""
    from safetensors import SafetensorError, safe_open

    try:
        yield
    except SafetensorError as e:
        broken = []
        for shard in sorted(path.glob("*.safetensors")):
            try:
                with safe_open(str(shard), framework="pt"):
                    pass
            except SafetensorError:
                broken.append(str(shard))
        where = ", ".join(broken) or f"a *.safetensors file of {path}"
        raise CheckpointError(f"{where} cannot be read as safetensors ({e}); the file is truncated or corrupt: "
                              "copy or download it again") from None


def _check_loading_info(info: dict[str, Any], source: str) -> None:
    problems = {k: sorted(info.get(k) or [])[:8] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    problems = {k: v for k, v in problems.items() if v}
    if problems:
        raise CheckpointError(f"weights of {source} do not match the model: {problems}")


def resolve_token_ids(raw: dict[str, Any], tokenizer: Any) -> tuple[int, int, int]:
    """(mask, eos, pad) ids: the checkpoint's config.json (or its text_config), then the tokenizer."""
    text = raw.get("text_config") or {}

    def from_config(key: str) -> Optional[int]:
        value = raw.get(key)
        value = text.get(key) if value is None else value
        value = value[0] if isinstance(value, (list, tuple)) and value else value
        return None if value is None else int(value)

    mask = from_config("mask_token_id")
    if mask is None:
        mask = tokenizer.mask_token_id
    if mask is None:
        vocab = tokenizer.get_vocab()
        mask = next((vocab[name] for name in MASK_TOKEN_NAMES if name in vocab), None)
    if mask is None:
        raise CheckpointError(
            "no mask token: config.json has no mask_token_id and the tokenizer has no mask token "
            f"(looked for {', '.join(MASK_TOKEN_NAMES)}); add mask_token_id to config.json"
        )
    eos = from_config("eos_token_id")
    eos = tokenizer.eos_token_id if eos is None else eos
    if eos is None:
        raise CheckpointError("no eos token id in config.json or the tokenizer")
    pad = from_config("pad_token_id")
    pad = tokenizer.pad_token_id if pad is None else pad
    return int(mask), int(eos), int(eos if pad is None else pad)
