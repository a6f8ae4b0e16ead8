"""Evaluating a LoRA run: from its DeepSpeed checkpoint (``stabledrl eval --checkpoint RUN_DIR``: the
base model and the checkpoint's adapters, held unmerged) and from a PEFT adapter folder
(``--adapter``, what the run exports as output_dir/final_adapter), and that folder's round trip
through ``peft.PeftModel.from_pretrained`` onto the base."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from stabledrl.common.config.base import validate
from stabledrl.common.config.job import JobConfig
from stabledrl.common.config.model import ModelConfig
from stabledrl.common.models import build_tiny_policy, export_hf, load_policy
from stabledrl.common.models.adapter_folder import (
    Adapters, hold, policy_adapters, read_adapter_folder, write_adapter_folder,
)
from stabledrl.common.models.lora import target_paths
from stabledrl.common.tokenizer import build_char_tokenizer
from stabledrl.evaluation.offline import load_eval_policy

ROOT = Path(__file__).resolve().parents[3]
PROBE = torch.arange(4, 20)[None]
LORA = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}

# one LoRA update of a bf16 learner (one gloo rank, ZeRO-3, the project's LearnerEngine), its
# checkpoint, and what the learner computes with after it: its adapters and its logits on PROBE
TRAIN = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import torch
    from stabledrl.common.config.learner import DeepSpeedConfig, LearnerConfig, LoraConfig, OptimizerConfig
    from stabledrl.common.models.presets import build_tiny_policy
    from stabledrl.coordinator.runtime.checkpoint import FORMAT, write_state
    from stabledrl.learner.engine import LearnerEngine
    from stabledrl.learner.group import init_learner_group, reserve_port

    run = Path(sys.argv[1])
    torch.set_num_threads(1)
    init_learner_group("127.0.0.1", reserve_port(), 0, 1, backend="gloo", timeout_s=60)
    cfg = LearnerConfig(optimizer=OptimizerConfig(lr=1e-2, eps=1e-3), lora=LoraConfig(**{lora}),
                        deepspeed=DeepSpeedConfig(zero_stage=3, dtype="bf16", param_persistence_threshold=0))
    engine = LearnerEngine(build_tiny_policy("llada", seed=0, dtype=torch.bfloat16), cfg)

    def loss_fn(model, ids):
        return torch.nn.functional.cross_entropy(model(ids).logits.float().flatten(0, 1), ids.flatten()), {{}}

    engine.train_step([torch.randint(4, 97, (2, 8), generator=torch.Generator().manual_seed(0))], loss_fn)
    tag = engine.save_checkpoint(run / "checkpoints", {{"step": 1}}, "step1")
    (run / "checkpoints" / "latest").write_text(tag)
    write_state(run / "checkpoints" / tag, {{"format": FORMAT, "step": 1, "config": {{}}, "parameter_shapes": {{}}}})
    with torch.no_grad():
        logits = engine.module(torch.arange(4, 20)[None]).logits
    torch.save({{"adapters": engine.state_dict_for_push(), "logits": logits}}, run / "learner.pt")
    """
)


def job(run: Path) -> JobConfig:
    return validate(JobConfig, {
        "model": {"preset": "tiny-llada", "dtype": "bfloat16"},
        "task": {"name": "arithmetic", "held_out": 4, "source": {"kind": "generated", "n": 16}},
        "sampler": {"gen_length": 4, "block_length": 4, "steps": 4},
        "estimator": {"name": "mean_field"},
        "loss": {"name": "grpo"},
        "learner": {"num_ranks": 1, "lora": LORA, "deepspeed": {"zero_stage": 3, "dtype": "bf16"}},
        "run": {"output_dir": str(run)},
    })


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("lora_run")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    proc = subprocess.run([sys.executable, "-c", TRAIN.format(lora=LORA), str(run)], env=env, capture_output=True,
                          text=True, timeout=300, cwd=run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run, torch.load(run / "learner.pt")


def logits(policy) -> torch.Tensor:
    with torch.no_grad():
        return policy(PROBE).logits


@pytest.mark.e2e  # a LoRA run trained by a DeepSpeed engine in a process of its own (lora_run)
def test_a_lora_checkpoint_evaluates_as_the_learner_computed(lora_run):
    run, learner = lora_run
    policy, _ = load_eval_policy(job(run), checkpoint=run, device="cpu")
    held = {f"model.{p}{s}": t for p, pair in policy_adapters(policy).pairs.items()
            for s, t in zip((".lora_A", ".lora_B"), pair)}
    assert held.keys() == learner["adapters"].keys()  # every adapted module, nothing else
    assert all(torch.equal(held[n], t) for n, t in learner["adapters"].items())  # the fp32 masters, as bf16
    assert any(t.abs().max() > 0 for n, t in held.items() if n.endswith("lora_B"))  # trained: B left 0
    torch.testing.assert_close(logits(policy), learner["logits"], rtol=0, atol=0)
    # an fp32 policy holds them as the bf16 learner computed with them, not as the fp32 masters
    cfg = job(run)
    fp32 = cfg.model_copy(update={"model": cfg.model.model_copy(update={"dtype": "float32"})})
    pairs = policy_adapters(load_eval_policy(fp32, checkpoint=run, device="cpu")[0]).pairs
    assert all(torch.equal(pairs[n.removeprefix("model.").removesuffix(".lora_A")][0], t.float())
               for n, t in learner["adapters"].items() if n.endswith(".lora_A"))


@pytest.mark.e2e  # a LoRA run trained by a DeepSpeed engine in a process of its own (lora_run)
def test_the_cli_evaluates_a_lora_run_directory(lora_run, capsys):
    from stabledrl.cli.main import main

    run, _ = lora_run
    config = run / "eval.yaml"
    config.write_text(json.dumps(job(run).model_dump(mode="json")))
    assert main(["eval", "--config", str(config), "--checkpoint", str(run), "--num-prompts", "2"]) == 0
    out = capsys.readouterr().out
    assert f"checkpoint {run}" in out and "pass@1" in out


@pytest.mark.e2e  # a LoRA run trained by a DeepSpeed engine in a process of its own (lora_run)
def test_a_checkpoint_of_other_weights_than_the_configs_lora_is_refused(lora_run):
    from stabledrl.common.trust.checkpoint_files import CheckpointError

    run, _ = lora_run
    cfg = job(run)
    plain = cfg.model_copy(update={"learner": cfg.learner.model_copy(update={"lora": None})})
    with pytest.raises(CheckpointError, match="does not fit the config's model"):
        load_eval_policy(plain, checkpoint=run, device="cpu")


@pytest.mark.e2e  # a LoRA run trained by a DeepSpeed engine in a process of its own (lora_run)
def test_the_protocol_workers_hold_a_lora_checkpoints_adapters(lora_run, tmp_path):
    from stabledrl.common.models.adapter_folder import load_with_adapter
    from stabledrl.evaluation.protocol_command import policy_model

    run, learner = lora_run
    cfg = job(run)
    model, described, folder = policy_model(cfg, tmp_path, model_dir=None, checkpoint=str(run))
    assert model == cfg.model and folder == (tmp_path / "policy_adapter").resolve() and "checkpoint" in described
    policy, _ = load_with_adapter(model, folder)
    torch.testing.assert_close(logits(policy), learner["logits"], rtol=0, atol=0)


@pytest.mark.parametrize("family", ["llada", "dream", "sdar"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_adapter_folder_loads_onto_the_base_with_peft(family, dtype, tmp_path):
    """The base is a transformers directory (export_hf); PEFT puts the folder onto the model the
    project loads from it and computes the same logits as the policy holding the adapters."""
    from peft import PeftModel

    base = build_tiny_policy(family, seed=1, dtype=dtype)
    export_hf(base, build_char_tokenizer(), tmp_path / "base")
    g = torch.Generator().manual_seed(2)
    pairs = {}
    for path in target_paths(base.model, ["q_proj", "o_proj", "gate_proj", "lm_head"]):
        m = base.model.get_submodule(path)
        pairs[path] = ((torch.randn(4, m.in_features, generator=g) * 0.1).to(dtype),
                       (torch.randn(m.out_features, 4, generator=g) * 0.1).to(dtype))
    adapters = Adapters(4, 8.0, pairs)
    folder = write_adapter_folder(adapters, tmp_path / "adapter", family=family, released=False,
                                  base=str(tmp_path / "base"))
    ours = hold(load_policy(ModelConfig(path=tmp_path / "base"), dtype=dtype)[0], adapters)
    plain = load_policy(ModelConfig(path=tmp_path / "base"), dtype=dtype)[0].model
    theirs = PeftModel.from_pretrained(plain, str(folder), autocast_adapter_dtype=False).eval()
    with torch.no_grad():  # the transformers model's own logits (Dream's unshifted)
        torch.testing.assert_close(ours.model(input_ids=PROBE).logits, theirs(input_ids=PROBE).logits, rtol=0,
                                   atol=0)
    assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] == str(tmp_path / "base")
    back = read_adapter_folder(folder, family)  # and the project reads it back (eval --adapter)
    assert back.pairs.keys() == pairs.keys() and all(torch.equal(back.pairs[p][i], pairs[p][i]) for p in pairs
                                                     for i in (0, 1))


def test_a_llada_folder_for_a_released_base_uses_llada_module_paths(tmp_path):
    base = build_tiny_policy("llada", seed=1)
    pairs = {p: (torch.ones(2, base.model.get_submodule(p).in_features),
                 torch.ones(base.model.get_submodule(p).out_features, 2))
             for p in target_paths(base.model, ["o_proj", "gate_proj", "down_proj", "lm_head"])}
    folder = write_adapter_folder(Adapters(2, 2.0, pairs), tmp_path, family="llada", released=True)
    from safetensors import safe_open

    with safe_open(str(folder / "adapter_model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
    assert "base_model.model.model.transformer.blocks.1.attn_out.lora_A.weight" in keys
    assert "base_model.model.model.transformer.blocks.0.ff_proj.lora_B.weight" in keys  # the gate
    assert "base_model.model.model.transformer.blocks.0.ff_out.lora_B.weight" in keys  # the down projection
    assert "base_model.model.model.transformer.ff_out.lora_A.weight" in keys  # the output head
    assert not any(".layers." in k or "lm_head" in k for k in keys)
    assert read_adapter_folder(folder, "llada").pairs.keys() == pairs.keys()


def test_eval_with_an_adapter_folder(tmp_path, capsys):
    from stabledrl.cli.main import main

    cfg = job(tmp_path / "run")
    policy, _ = load_policy(cfg.model)
    pairs = {p: (torch.full((4, policy.model.get_submodule(p).in_features), 0.01),
                 torch.full((policy.model.get_submodule(p).out_features, 4), 0.01))
             for p in target_paths(policy.model, LORA["target_modules"])}
    write_adapter_folder(Adapters(4, 8.0, pairs), tmp_path / "adapter", family="llada", released=False)
    config = tmp_path / "eval.yaml"
    config.write_text(json.dumps(cfg.model_dump(mode="json")))
    assert main(["eval", "--config", str(config), "--adapter", str(tmp_path / "adapter"), "--num-prompts", "2"]) == 0
    assert f"adapter {tmp_path / 'adapter'} on model preset tiny-llada" in capsys.readouterr().out
    assert main(["eval", "--config", str(config), "--adapter", str(tmp_path / "adapter"), "--checkpoint",
                 str(tmp_path)]) == 2
    policy, _ = load_eval_policy(cfg, adapter=tmp_path / "adapter", device="cpu")
    assert policy_adapters(policy).pairs.keys() == pairs.keys()


def test_diffusion_gemmas_adapter_folder_loads_onto_its_transformers_class_with_peft(tmp_path):
    """DiffusionGemma's released layout is transformers' own: PEFT puts the folder onto the class the
    base loads as (in place), and the project's policy over it scores as the one holding the adapters."""
    from peft import PeftModel

    base = build_tiny_policy("diffusion_gemma", seed=1)
    export_hf(base, build_char_tokenizer(), tmp_path / "base")
    g = torch.Generator().manual_seed(2)
    pairs = {p: (torch.randn(4, base.model.get_submodule(p).in_features, generator=g) * 0.1,
                 torch.randn(base.model.get_submodule(p).out_features, 4, generator=g) * 0.1)
             for p in target_paths(base.model, ["q_proj", "o_proj", "gate_proj"])}
    adapters = Adapters(4, 8.0, pairs)
    folder = write_adapter_folder(adapters, tmp_path / "adapter", family="diffusion_gemma", released=True)
    ours = hold(load_policy(ModelConfig(path=tmp_path / "base"))[0], adapters)
    theirs = load_policy(ModelConfig(path=tmp_path / "base"))[0]
    PeftModel.from_pretrained(theirs.model, str(folder)).eval()  # injects peft's layers into theirs.model
    x = torch.randint(4, 97, (1, 5 + base.block_size), generator=g)  # a prompt, then one canvas
    with torch.no_grad():
        plain = load_policy(ModelConfig(path=tmp_path / "base"))[0](x, logits_from=5).logits
        torch.testing.assert_close(ours(x, logits_from=5).logits, theirs(x, logits_from=5).logits, rtol=1e-5,
                                   atol=1e-5)
    assert not torch.allclose(ours(x, logits_from=5).logits, plain, atol=1e-3)
