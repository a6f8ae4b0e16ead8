"""A run's exports are in each family's released layout (common/models/export.py): the config.json,
the weight names and shapes that the family's own model code loads, and for LoRA the merged model
and a PEFT adapter folder that PEFT puts onto the family's model of the base.

The expected figures in family_exports.json come from the families' own code, which is not part of
the project: tests/parity/family_export.py exported the same seeded tiny models (its ``case``),
loaded them with the releases' modeling files (Gen-Verse/dLLM-RL's models/{llada,dream,sdar}: the
config class on config.json, the model class taking the weights strictly, PEFT for the adapter
folder) and recorded what that code read, built and computed. There the project's logits and the
family code's were equal (max difference 0 in fp32 on a CPU). Regenerate with

    python tests/parity/family_export.py --code DIR --record tests/unit/common/family_exports.json

(DIR: a folder holding llada/, dream/, sdar/ with the families' model code). Here the project's
exports are checked against those figures without that code. DiffusionGemma's released layout is
transformers' own (its class ships with transformers), so its export is loaded by that class here."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

_spec = importlib.util.spec_from_file_location("family_export_parity",
                                               Path(__file__).resolve().parents[2] / "parity" / "family_export.py")
parity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(parity)

RECORDED = json.loads((Path(__file__).with_name("family_exports.json")).read_text())


@pytest.fixture(scope="module", params=parity.FAMILIES)
def exported(request, tmp_path_factory):
    torch.set_num_threads(1)
    family = request.param
    return family, parity.write_exports(family, tmp_path_factory.mktemp(family))


def shapes(file: Path) -> dict[str, list[int]]:
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as f:
        return {k: list(f.get_slice(k).get_shape()) for k in f.keys()}


def test_the_config_is_the_one_the_familys_code_read(exported):
    family, exports = exported
    for name in ("base", "final_model"):
        assert json.loads((exports[name] / "config.json").read_text()) == RECORDED[family]["config"]


def test_the_weights_have_the_names_and_shapes_of_the_familys_model(exported):
    family, exports = exported
    for name in ("base", "final_model"):
        assert shapes(exports[name] / "model.safetensors") == RECORDED[family]["weights"]


def test_the_adapter_folder_is_the_one_peft_put_onto_the_familys_model(exported):
    family, exports = exported
    assert shapes(exports["final_adapter"] / "adapter_model.safetensors") == RECORDED[family]["adapter"]
    assert parity.adapter_settings(exports["final_adapter"]) == RECORDED[family]["adapter_config"]


def test_the_project_computes_the_familys_logits_on_its_exports(exported):
    family, exports = exported
    ours = parity.project(exports, family)
    for name, logits in ours.items():
        expected = torch.tensor(RECORDED[family]["logits"][name])
        torch.testing.assert_close(logits[..., : parity.SLICE], expected, rtol=0, atol=2e-6)
    # the three differ: the adapters move the logits, and merged in fp32 the final model holds them
    assert not torch.allclose(ours["base"], ours["final_adapter"], atol=1e-3)
    torch.testing.assert_close(ours["final_model"], ours["final_adapter"], rtol=0, atol=1e-5)


def test_the_run_copies_the_familys_code_from_a_released_base(tmp_path):
    """A released base directory carries its family's code (modeling_*.py): the export takes it along,
    so ``AutoModel.from_pretrained(..., trust_remote_code=True)`` finds it as in the release."""
    from stabledrl.common.config.model import ModelConfig
    from stabledrl.common.models.export import export_policy
    from stabledrl.common.tokenizer import build_char_tokenizer

    policy, _ = parity.case("llada")
    base = export_policy(policy, build_char_tokenizer(), tmp_path / "base", ModelConfig(preset="tiny-llada"))
    assert not list(base.glob("*.py"))  # a preset has no code to copy
    (base / "modeling_llada.py").write_text("# the family's code\n")
    out = export_policy(policy, build_char_tokenizer(), tmp_path / "out", ModelConfig(path=base))
    assert (out / "modeling_llada.py").read_text() == "# the family's code\n"
    assert json.loads((out / "config.json").read_text())["auto_map"]["AutoModel"] == "modeling_llada.LLaDAModelLM"


def test_diffusion_gemmas_export_loads_with_its_transformers_class(tmp_path):
    from stabledrl.common.config.model import ModelConfig
    from stabledrl.common.models import build_tiny_policy, load_policy
    from stabledrl.common.models.diffusion_gemma import require_diffusion_gemma
    from stabledrl.common.models.export import export_policy
    from stabledrl.common.tokenizer import build_char_tokenizer

    policy = build_tiny_policy("diffusion_gemma", seed=1)
    out = export_policy(policy, build_char_tokenizer(), tmp_path, ModelConfig(preset="tiny-diffusion-gemma"))
    model, info = require_diffusion_gemma().DiffusionGemmaForBlockDiffusion.from_pretrained(
        out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    ours = dict(policy.model.named_parameters())
    assert all(torch.equal(p, ours[n]) for n, p in model.named_parameters())
    loaded, _ = load_policy(ModelConfig(path=out))
    assert loaded.spec.name == "diffusion_gemma"
