"""Check: a run's exports load with each family's own model code and compute the project's logits.

    python tests/parity/family_export.py --code DIR [--record tests/unit/common/family_exports.json]

DIR holds the families' released model code as their checkpoints ship it, one folder a family:
DIR/llada/{configuration_llada,modeling_llada}.py, DIR/dream/{configuration_dream,modeling_dream,
generation_utils}.py, DIR/sdar/{configuration_sdar,modeling_sdar}.py (Gen-Verse/dLLM-RL's
``models/`` folder holds all three). For each family a seeded tiny model with LoRA adapters
(``case``) is exported as a LoRA run exports it (common/models/export.py): the base in the family's
released format, the trained model merged in fp32 and rounded once (``final_model``), and the
adapters as a PEFT folder for the base (``final_adapter``). Then, with the family's code:

- its config class reads each config.json, its model class takes the weights strictly (no name
  missing or left over, every shape as the code builds it) and its forward gives logits, compared
  with the project's forward on the same directory (``load_policy``);
- ``peft.PeftModel.from_pretrained`` puts the adapter folder onto the family's model of the base,
  compared with the project's policy holding the same folder unmerged.

Exits 1 naming the first family and export whose logits differ by more than 1e-4 (fp32, CPU).
``--record`` writes what the family's code read, built and computed (the config.json it read, the
keys its config class takes, every weight's name and shape in its model, the adapter tensors PEFT
put onto it, a slice of each logits tensor) to the file tests/unit/common/test_family_exports.py
compares the project's exports against, without that code.

The releases were written for transformers 4.x; what they need from transformers 5 stays here
(``shims``): SDAR imports names transformers 5 dropped and flash-attn's fused RMSNorm (replaced by
the same arithmetic in torch: fp32 normalisation, weight, cast back). The model classes are built
directly and given their weights with ``load_state_dict(strict)``: transformers 5's
``from_pretrained`` trips on LLaDA's code (it lacks the attributes ``post_init`` sets). No code of
the families is part of the project: it is read from DIR.
"""
from __future__ import annotations

import argparse
import copy
import importlib
import json
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import torch

FAMILIES = ("llada", "dream", "sdar")
CODE = {  # family -> (config module, config class, model module, model class)
    "llada": ("configuration_llada", "LLaDAConfig", "modeling_llada", "LLaDAModelLM"),
    "dream": ("configuration_dream", "DreamConfig", "modeling_dream", "DreamModel"),
    "sdar": ("configuration_sdar", "SDARConfig", "modeling_sdar", "SDARForCausalLM"),
}
TARGETS = ["q_proj", "v_proj", "o_proj", "gate_proj", "down_proj", "lm_head"]
RANK, ALPHA = 4, 8.0
IDS = torch.tensor([[3, 17, 45, 2, 2, 60, 8, 91, 2, 33, 14, 70], [5, 5, 81, 22, 2, 2, 2, 9, 66, 40, 1, 0]])
SLICE = 16  # logits recorded per position: the first SLICE of the vocabulary


def case(family: str) -> tuple[Any, Any]:
    """(policy, adapters): a tiny fp32 model of ``family`` whose every weight is drawn from a
    generator of its own (independent of init schemes and of transformers' release), and LoRA
    adapters of rank 4 on ``TARGETS`` (B far from 0: a trained run's)."""
    from stabledrl.common.models import build_tiny_policy
    from stabledrl.common.models.adapter_folder import Adapters
    from stabledrl.common.models.lora import target_paths

    policy = build_tiny_policy(family, seed=0)
    with torch.no_grad():
        for i, (name, p) in enumerate(sorted(policy.model.named_parameters())):
            g = torch.Generator().manual_seed(1000 + i)
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1.0 + 0.1 * noise if p.dim() == 1 else noise * (1.0 if "embed" in name else 0.1))
    pairs = {}
    for i, path in enumerate(target_paths(policy.model, TARGETS)):
        g = torch.Generator().manual_seed(2000 + i)
        m = policy.model.get_submodule(path)
        pairs[path] = (torch.randn(RANK, m.in_features, generator=g) * 0.1,
                       torch.randn(m.out_features, RANK, generator=g) * 0.1)
    return policy, Adapters(RANK, ALPHA, pairs)


def merged(policy: Any, adapters: Any) -> Any:
    """The policy a LoRA run exports: every adapted weight W + s·B·A, in fp32, rounded once."""
    from stabledrl.common.transport.adapters import merged_weight

    out = copy.deepcopy(policy)
    with torch.no_grad():
        for path, (a, b) in adapters.pairs.items():
            weight = out.model.get_submodule(path).weight
            weight.copy_(merged_weight(weight, a, b, adapters.scale))
    return out


def write_exports(family: str, directory: Path) -> dict[str, Path]:
    """The base, the run's final_model and final_adapter of ``case(family)`` under ``directory``."""
    from stabledrl.common.config.model import ModelConfig
    from stabledrl.common.models.export import export_adapters, export_policy
    from stabledrl.common.tokenizer import build_char_tokenizer

    policy, adapters = case(family)
    tokenizer = build_char_tokenizer()
    preset = ModelConfig(preset=f"tiny-{family}")
    base = export_policy(policy, tokenizer, directory / "base", preset)
    final = export_policy(merged(policy, adapters), tokenizer, directory / "final_model", preset)
    folder = export_adapters(adapters, directory / "final_adapter", ModelConfig(path=base), family)
    return {"base": base, "final_model": final, "final_adapter": folder}


def mask(family: str) -> torch.Tensor:
    """[B, 1, L, L] bool: what each position attends to (SDAR: blocks of its block size)."""
    from stabledrl.common.attention import block_causal_mask, full_mask

    valid = torch.ones_like(IDS, dtype=torch.bool)
    if family == "sdar":
        return block_causal_mask((torch.arange(IDS.shape[1]) // 4).expand_as(IDS), valid)
    return full_mask(valid)


def project_logits(policy: Any, family: str) -> torch.Tensor:
    """The project's forward (DiffusionPolicy) of ``policy`` on IDS, row j predicting token j (Dream:
    from position 1 on)."""
    with torch.no_grad():
        return policy(IDS, attention_mask=mask(family), logits_from=1 if family == "dream" else None).logits.float()


def project(exports: dict[str, Path], family: str) -> dict[str, torch.Tensor]:
    """The project's logits on the exports: base, final_model, base + final_adapter (unmerged)."""
    from stabledrl.common.config.model import ModelConfig
    from stabledrl.common.models import load_policy
    from stabledrl.common.models.adapter_folder import load_with_adapter

    return {"base": project_logits(load_policy(ModelConfig(path=exports["base"]))[0], family),
            "final_model": project_logits(load_policy(ModelConfig(path=exports["final_model"]))[0], family),
            "final_adapter": project_logits(load_with_adapter(ModelConfig(path=exports["base"]),
                                                              exports["final_adapter"])[0], family)}


# ------------------------------------------------------------------ the families' own code
def shims() -> None:
    """What the releases import from transformers 4.x and flash-attn, for transformers 5 on a CPU."""
    import transformers.cache_utils as cache_utils
    import transformers.utils as hf_utils

    if not hasattr(cache_utils, "SlidingWindowCache"):
        cache_utils.SlidingWindowCache = type("SlidingWindowCache", (cache_utils.DynamicCache,), {})
    if not hasattr(hf_utils, "LossKwargs"):
        from typing import TypedDict

        hf_utils.LossKwargs = TypedDict("LossKwargs", {}, total=False)
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    def default_rope(config=None, device=None, seq_len=None, **kwargs):  # 4.x's "default": plain RoPE
        if kwargs.get("dim"):
            base, dim = kwargs["base"], kwargs["dim"]
        else:
            base = getattr(config, "rope_theta", None) or config.rope_parameters["rope_theta"]
            head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
            dim = int(head_dim * getattr(config, "partial_rotary_factor", 1.0))
        exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim
        return 1.0 / (base**exponents), 1.0

    ROPE_INIT_FUNCTIONS.setdefault("default", default_rope)
    if "transformers.modeling_attn_mask_utils" not in sys.modules:
        try:
            importlib.import_module("transformers.modeling_attn_mask_utils")
        except ImportError:
            module = types.ModuleType("transformers.modeling_attn_mask_utils")
            module.AttentionMaskConverter = type("AttentionMaskConverter", (), {})
            sys.modules[module.__name__] = module

    def rms_norm_fn(x, weight, bias=None, eps=1e-6, **_):  # flash-attn's fused kernel: fp32 inside
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps) * weight.float()
        return (y if bias is None else y + bias.float()).to(x.dtype)

    for name in ("flash_attn", "flash_attn.ops", "flash_attn.ops.triton", "flash_attn.ops.triton.layer_norm"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["flash_attn.ops.triton.layer_norm"].rms_norm_fn = rms_norm_fn


def family_classes(code: Path, family: str) -> tuple[type, type]:
    """(config class, model class) from DIR/family, imported as a package of its own."""
    import importlib.util

    shims()
    package = f"released_{family}"
    if package not in sys.modules:
        spec = importlib.util.spec_from_file_location(package, code / family / "__init__.py",
                                                      submodule_search_locations=[str(code / family)])
        sys.modules[package] = importlib.util.module_from_spec(spec)  # its __init__ is not run
    config_module, config_class, model_module, model_class = CODE[family]
    return (getattr(importlib.import_module(f"{package}.{config_module}"), config_class),
            getattr(importlib.import_module(f"{package}.{model_module}"), model_class))


def family_model(code: Path, family: str, directory: Path) -> Any:
    """The family's model of an exported directory: its config class on config.json, its model class
    holding exactly the directory's weights."""
    from safetensors.torch import load_file

    config_cls, model_cls = family_classes(code, family)
    raw = json.loads((directory / "config.json").read_text())
    config = config_cls(**{k: v for k, v in raw.items() if k not in ("auto_map", "architectures")})
    for key, value in (("use_cache", False), ("use_return_dict", True), ("output_attentions", False),
                       ("output_hidden_states", False)):  # attributes 4.x configs had and 5's dropped
        if not hasattr(config, key):
            object.__setattr__(config, key, value)
    model = model_cls(config, init_params=False) if family == "llada" else model_cls(config)
    state = load_file(str(directory / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    persistent = set(model.state_dict())
    missing = [k for k in missing if k in persistent]
    if missing or unexpected:
        raise SystemExit(f"{family}: the family's code does not take {directory}'s weights: missing {missing}, "
                         f"unexpected {unexpected}")
    return model.float().eval()


def family_logits(model: Any, family: str) -> torch.Tensor:
    """The family's forward on IDS, aligned as ``project_logits``."""
    with torch.no_grad():
        if family == "sdar":
            return model(input_ids=IDS, attention_mask=mask(family)).logits.float()
        logits = model(input_ids=IDS).logits.float()
    return logits[:, :-1] if family == "dream" else logits


def family(code: Path, exports: dict[str, Path], name: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(the family's logits on the exports, what its code built: weight shapes and config keys)."""
    import inspect

    from peft import PeftModel

    from safetensors import safe_open

    base = family_model(code, name, exports["base"])
    with safe_open(str(exports["final_adapter"] / "adapter_model.safetensors"), framework="pt") as f:
        adapter = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    built = {"weights": {k: list(v.shape) for k, v in base.state_dict().items()},  # what the family's model holds
             "config_class_keys": sorted(inspect.signature(family_classes(code, name)[0].__init__).parameters),
             "config": json.loads((exports["base"] / "config.json").read_text()),  # what its code read
             "adapter": adapter, "adapter_config": adapter_settings(exports["final_adapter"])}
    logits = {"base": family_logits(base, name),
              "final_model": family_logits(family_model(code, name, exports["final_model"]), name)}
    adapted = PeftModel.from_pretrained(family_model(code, name, exports["base"]), str(exports["final_adapter"]),
                                        autocast_adapter_dtype=False).eval()
    logits["final_adapter"] = family_logits(adapted, name)
    return logits, built


def adapter_settings(folder: Path) -> dict[str, Any]:
    """What of a PEFT folder's adapter_config.json decides what PEFT builds (not where the base lies)."""
    cfg = json.loads((folder / "adapter_config.json").read_text())
    return {"peft_type": cfg["peft_type"], "r": cfg["r"], "lora_alpha": cfg["lora_alpha"],
            "target_modules": sorted(cfg["target_modules"]), "bias": cfg["bias"], "use_dora": cfg["use_dora"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--code", required=True, type=Path, help="a directory holding llada/, dream/, sdar/ with each "
                    "family's released model code")
    ap.add_argument("--record", type=Path, default=None, help="write the family's figures here (JSON)")
    ap.add_argument("--families", default=",".join(FAMILIES))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    names = args.families.split(",")
    record, failed = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        exports = {name: write_exports(name, Path(tmp) / name) for name in names}
        ours = {name: project(exports[name], name) for name in names}  # before any shim is in place
        theirs = {name: family(args.code, exports[name], name) for name in names}
    for name in names:
        for key in ours[name]:
            diff = (ours[name][key] - theirs[name][0][key]).abs().max().item()
            print(f"{name} {key}: max |project - family code| = {diff:.3g}")
            if diff > 1e-4:
                failed.append(f"{name} {key}")
        logits, built = theirs[name]
        rounded = {k: [[[round(x, 6) for x in row] for row in rows] for rows in t[..., :SLICE].tolist()]
                   for k, t in logits.items()}
        record[name] = {**built, "logits": rounded}
    if args.record is not None:
        args.record.write_text(json.dumps(record, indent=None, separators=(",", ":")) + "\n")
        print(f"recorded: {args.record}")
    if failed:
        print(f"DIFFERENT: {', '.join(failed)}")
        return 1
    print("every export loads with its family's code and computes the project's logits")
    return 0


if __name__ == "__main__":
    sys.exit(main())
