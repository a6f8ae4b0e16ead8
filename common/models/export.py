"""Writing a model out: a family's released on-disk format, a plain transformers directory, presets.

- ``save_original_checkpoint`` writes what the family's authors publish (LLaDA's
  ``model.transformer.*`` names and ``d_model``-style config, Dream's ``model_type: Dream``, SDAR's
  ``model_type: sdar``; DiffusionGemma's native transformers layout), so tests prove the loader on the
  same bytes a real download has, and trained weights can go back to the authors' tooling.
- ``export_policy`` is a run's export (run.export_final): the released format, with the family's
  code files copied beside it from ``model.path`` where it has them; ``export_adapters`` a LoRA
  run's adapters as a PEFT folder for that base (common/models/adapter_folder.py). docs/exports.md
  says which tool loads which.
- ``export_hf`` writes a standard transformers directory (LlamaForCausalLM / Qwen2ForCausalLM /
  Qwen3ForCausalLM / DiffusionGemmaForBlockDiffusion) that ``from_pretrained`` loads with no custom
  code; ``dllm_family``, ``mask_token_id`` and ``block_size`` ride along in its config.json.
- ``write_preset`` materialises a tiny preset (the CPU quickstart warm-starts from it).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, Optional, Union

import torch

from stabledrl.common.config.model import ModelConfig
from stabledrl.common.models.base import DiffusionPolicy
from stabledrl.common.models.convert import hf_to_original
from stabledrl.common.models.adapter_folder import Adapters, write_adapter_folder
from stabledrl.common.models.families import FAMILY_KEY, CheckpointError, detect_family
from stabledrl.common.models.model_dir import read_json_file, resolve_model_dir
from stabledrl.common.models.loading import load_policy


def save_original_checkpoint(
    policy: DiffusionPolicy, tokenizer: Any, directory: Union[str, Path], family: Optional[str] = None
) -> Path:
    """Write ``policy`` in ``family``'s released format (config.json keys, parameter names,
    model.safetensors) plus the tokenizer files; returns the directory."""
    family = family or policy.spec.name
    if family != policy.spec.name:
        raise CheckpointError(f"a {policy.spec.name!r} policy cannot be written as a {family!r} checkpoint")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if family == "diffusion_gemma":  # its released format is transformers-native
        policy.model.save_pretrained(directory)
    else:
        state = {k: v.detach().to("cpu") for k, v in policy.model.state_dict().items()}
        raw, original = hf_to_original(family, policy.model.config, state)
        raw.update(_token_fields(policy, tokenizer, family))
        raw["torch_dtype"] = str(next(policy.parameters()).dtype).removeprefix("torch.")
        _save_safetensors(original, directory / "model.safetensors")
        (directory / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    tokenizer.save_pretrained(directory)
    return directory


def export_policy(policy: DiffusionPolicy, tokenizer: Any, directory: Union[str, Path], base: ModelConfig) -> Path:
    """Write ``policy`` in its family's released format (``save_original_checkpoint``) and, where the
    base ``model.path`` is a released directory with its family's code (``modeling_llada.py`` and the
    like, which ``AutoModel.from_pretrained(..., trust_remote_code=True)`` imports), copy that code
    beside it, so the export loads as the release does. Nothing here runs that code."""
    import shutil

    directory = save_original_checkpoint(policy, tokenizer, directory)
    source = base_directory(base)
    if source is not None and policy.spec.name != "diffusion_gemma" and released_format(base):
        for code in sorted(source.glob("*.py")):
            shutil.copyfile(code, directory / code.name)
    return directory


def export_adapters(adapters: Adapters, directory: Union[str, Path], base: ModelConfig, family: str) -> Path:
    """A LoRA run's adapters as a PEFT folder for its base ``model.path``, in the module paths of the
    code that loads that base (its family's for a released directory, transformers' otherwise)."""
    where = None if base.preset is not None else str(base.path)
    return write_adapter_folder(adapters, directory, family=family, released=released_format(base), base=where)


def base_directory(base: ModelConfig) -> Optional[Path]:
    """The local directory of ``model.path`` (None for a preset)."""
    return None if base.preset is not None or base.path is None else resolve_model_dir(base.path, base.revision)


def released_format(base: ModelConfig) -> bool:
    """Whether ``model.path`` holds a checkpoint in its family's released format (a preset does not:
    it is the transformers class; neither does a directory ``export_hf`` wrote)."""
    source = base_directory(base)
    if source is None:
        return False
    return detect_family(read_json_file(source / "config.json"), base.family)[1]


def _token_fields(policy: DiffusionPolicy, tokenizer: Any, family: str) -> dict[str, Any]:
    """Token ids the released config.json records. LLaDA and Dream store mask_token_id there; SDAR's
    release takes it from the tokenizer, so it is written only when the tokenizer would disagree."""
    fields: dict[str, Any] = {"eos_token_id": policy.eos_token_id, "pad_token_id": policy.pad_token_id}
    if family in ("llada", "dream") or tokenizer.mask_token_id != policy.mask_token_id:
        fields["mask_token_id"] = policy.mask_token_id
    if policy.block_size != policy.spec.default_block_size:
        fields["block_size"] = policy.block_size
    return fields


def _save_safetensors(state: dict[str, torch.Tensor], file: Path) -> None:
    from safetensors.torch import save_file

    seen: set[int] = set()
    out = {}
    for key, tensor in state.items():
        tensor = tensor.contiguous()
        if tensor.data_ptr() in seen:  # safetensors refuses shared storage: write a copy
            tensor = tensor.clone()
        seen.add(tensor.data_ptr())
        out[key] = tensor
    save_file(out, str(file), metadata={"format": "pt"})


def export_hf(policy: DiffusionPolicy, tokenizer: Any, directory: Union[str, Path]) -> Path:
    """Write a standard transformers directory of ``policy`` (``from_pretrained`` loads it, no custom
    code) with the tokenizer; ``load_policy`` reads it back as the same family."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = policy.model.config
    if policy.spec.name != "diffusion_gemma":  # its strict config takes no extra keys; model_type says it all
        setattr(config, FAMILY_KEY, policy.spec.name)
        config.mask_token_id = policy.mask_token_id
        config.block_size = policy.block_size
    policy.model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def write_preset(cfg: ModelConfig, directory: Union[str, Path], fmt: Literal["original", "hf"] = "original") -> Path:
    """Materialise the tiny preset of ``cfg`` (``cfg.preset`` set) to ``directory``; afterwards
    ``ModelConfig(path=directory)`` loads the same weights."""
    if cfg.preset is None:
        raise ValueError("write_preset needs a ModelConfig with preset set")
    policy, tokenizer = load_policy(cfg)
    writer = save_original_checkpoint if fmt == "original" else export_hf
    return writer(policy, tokenizer, directory)
