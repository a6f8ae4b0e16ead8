"""LoRA adapters as a PEFT adapter folder, and back onto a policy (held unmerged: common/models/lora.py).

    adapter_config.json        peft's LoraConfig: r, lora_alpha, target_modules (each module's full path)
    adapter_model.safetensors  base_model.model.<module>.lora_A.weight [r, in], ....lora_B.weight [out, r]

``peft.PeftModel.from_pretrained(base, folder)`` puts the adapters onto the base model as the base's
own code builds it, so module paths follow the base's layout: LLaDA's code for a LLaDA checkpoint
in its released format (``model.transformer.blocks.N.q_proj``; the head ``model.transformer.ff_out``),
transformers' classes otherwise (``model.layers.N.self_attn.q_proj``: the releases of Dream,
SDAR/TraDo and DiffusionGemma use those names, and so does a directory ``export_hf`` wrote).
``read_adapter_folder`` takes either layout back, so PEFT folders written on LLaDA's own code (d1's
checkpoints) load too. The tensors are the ones the policy computes with (a LoRA run's: the
training dtype), so base + folder is the trained policy itself, where the merged export rounds.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import torch

from stabledrl.common.models.convert import llada_project_path, llada_released_path
from stabledrl.common.models.families import CheckpointError
from stabledrl.common.models.lora import adapted_paths, attach_adapters, load_adapters
from stabledrl.common.models.model_dir import read_json_file
from stabledrl.common.models.loading import load_policy

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
PREFIX = "base_model.model."  # PeftModel's path to the base model
SUFFIXES = {".lora_A.weight": 0, ".lora_B.weight": 1}
# adapter_config.json settings whose non-default value computes something LoraLinear does not
UNSUPPORTED = {"use_dora": False, "use_rslora": False, "fan_in_fan_out": False, "bias": "none",
               "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {}, "layer_replication": None}


@dataclass
class Adapters:
    """LoRA adapters by module path in the transformers model (``policy.model``): (A, B) each."""

    rank: int
    alpha: float
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]]

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def policy_adapters(policy: Any) -> Adapters:
    """The unmerged adapters ``policy`` holds (its ``LoraLinear`` modules)."""
    paths = adapted_paths(policy.model)
    if not paths:
        raise ValueError("the policy holds no LoRA adapters")
    modules = [policy.model.get_submodule(p) for p in paths]
    return Adapters(modules[0].rank, modules[0].scale * modules[0].rank,
                    {p: (m.lora_A.detach(), m.lora_B.detach()) for p, m in zip(paths, modules)})


def hold(policy: Any, adapters: Adapters) -> Any:
    """``policy`` with ``adapters`` held unmerged (in place); returns it."""
    attach_adapters(policy.model, list(adapters.pairs), adapters.rank, adapters.scale)
    load_adapters(policy.model, adapters.pairs)
    return policy


def write_adapter_folder(adapters: Adapters, directory: Union[str, Path], *, family: str, released: bool,
                         base: Optional[str] = None) -> Path:
    """Write ``adapters`` as a PEFT folder for the base ``base`` (model.path) of ``family``, in its
    released layout's module paths (``released``: only LLaDA's differ) or transformers'."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    rename = llada_released_path if released and family == "llada" else (lambda p: p)
    paths = {p: rename(p) for p in adapters.pairs}
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    LoraConfig(r=adapters.rank, lora_alpha=adapters.alpha, target_modules=sorted(paths.values()), bias="none",
               base_model_name_or_path=base, inference_mode=True).save_pretrained(str(directory))
    tensors = {f"{PREFIX}{paths[p]}{suffix}": pair[i].detach().to("cpu").contiguous()
               for p, pair in adapters.pairs.items() for suffix, i in SUFFIXES.items()}
    save_file(tensors, str(directory / WEIGHTS), metadata={"format": "pt"})
    return directory


def read_adapter_folder(directory: Union[str, Path], family: str) -> Adapters:
    """The adapters of a PEFT LoRA folder (either layout, see the module docstring) by their paths in
    the transformers model ``family`` runs as. Settings LoRA's plain expression does not cover
    (DoRA, rsLoRA, per-module ranks, ...) are refused, naming them."""
    from safetensors import safe_open

    directory = Path(directory)
    if not (directory / CONFIG).is_file() or not (directory / WEIGHTS).is_file():
        raise CheckpointError(f"{directory} is no PEFT adapter folder (it needs {CONFIG} and {WEIGHTS})")
    cfg = read_json_file(directory / CONFIG, what="adapter")
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
        raise CheckpointError(f"{directory / CONFIG}: peft_type {cfg.get('peft_type')!r}; only LORA adapters load")
    odd = {k: cfg[k] for k, default in UNSUPPORTED.items() if cfg.get(k) not in (default, None, {}, False, "none")}
    if odd:
        raise CheckpointError(f"{directory / CONFIG}: {odd} are LoRA variants this loader does not compute; "
                              f"supported: {UNSUPPORTED}")
    halves: dict[str, list[Optional[torch.Tensor]]] = {}
    with safe_open(str(directory / WEIGHTS), framework="pt") as f:
        for key in f.keys():
            suffix = next((s for s in SUFFIXES if key.endswith(s)), None)
            if suffix is None or not key.startswith(PREFIX):
                raise CheckpointError(f"{directory / WEIGHTS}: {key!r} is no LoRA Linear adapter (A or B)")
            path = key[len(PREFIX):-len(suffix)]
            halves.setdefault(path, [None, None])[SUFFIXES[suffix]] = f.get_tensor(key)
    if not halves:
        raise CheckpointError(f"{directory / WEIGHTS} holds no adapters")
    unpaired = sorted(p for p, pair in halves.items() if any(t is None for t in pair))
    if unpaired:
        raise CheckpointError(f"{directory / WEIGHTS}: {unpaired[:3]} have A or B only")
    released = any(p.startswith("model.transformer.") for p in halves)
    if released and family != "llada":
        raise CheckpointError(f"{directory}: module paths of LLaDA's code, for a {family!r} model")
    rename = llada_project_path if released else (lambda p: p)
    rank = int(cfg.get("r") or next(iter(halves.values()))[0].shape[0])
    return Adapters(rank, float(cfg.get("lora_alpha", rank)), {rename(p): (a, b) for p, (a, b) in halves.items()})



def load_with_adapter(model: Any, adapter: Union[str, Path]) -> tuple[Any, Any]:
    """(policy, tokenizer) of the model section ``model`` with the PEFT folder ``adapter`` held
    unmerged: an evaluation worker's loader (rollout/eval_worker.py)."""
    policy, tokenizer = load_policy(model)
    return hold(policy, read_adapter_folder(adapter, policy.spec.name)), tokenizer
