"""The optimisation options of ``learner.optimizer`` and ``learner.lora`` without DeepSpeed: the lr
schedules against their formulas, which parameters decay, which ones LoRA trains, and the config
rules (tests/e2e/test_learner_options.py runs them through the learner engine)."""
from __future__ import annotations

import math

import pytest
import torch

from stabledrl.common.config.base import ConfigError, validate
from stabledrl.common.config.job import load_job_config
from stabledrl.common.config.learner import LearnerConfig, LoraConfig, OptimizerConfig
from stabledrl.common.models.presets import build_tiny_policy
from stabledrl.learner.zero import build_optimizer, decay_groups, lr_at

QUICKSTART = "deploy/configs/quickstart.yaml"
LR, FLOOR, WARMUP, TOTAL = 1e-3, 1e-4, 4, 24  # decay over updates 4..23, reaching the floor at 24


def schedule(name: str, floor: float = 0.0) -> OptimizerConfig:
    return OptimizerConfig(lr=LR, warmup_steps=WARMUP, schedule=name, lr_floor=floor, total_updates=TOTAL)


# update k -> lr / LR, by hand: warm-up (k+1)/4; decay progress p = (k - 4) / 20
WARMUP_VALUES = {0: 0.25, 1: 0.5, 3: 1.0}
DECAY_VALUES = {
    "constant": {4: 1.0, 9: 1.0, 14: 1.0, 23: 1.0, 24: 1.0, 40: 1.0},
    "linear": {4: 1.0, 9: 0.75, 14: 0.5, 23: 0.05, 24: 0.0, 40: 0.0},
    # (1 + cos(π p)) / 2 at p = 0, 1/4, 1/2, 19/20, 1
    "cosine": {4: 1.0, 9: 0.8535533905932737, 14: 0.5, 23: 0.006155829702431115, 24: 0.0, 40: 0.0},
}


@pytest.mark.parametrize("name", ["constant", "linear", "cosine"])
def test_lr_at_start_warmup_end_middle_and_end_equals_the_formula(name):
    opt = schedule(name)
    for k, ratio in {**WARMUP_VALUES, **DECAY_VALUES[name]}.items():
        assert lr_at(opt, k) == pytest.approx(LR * ratio, rel=1e-12, abs=1e-18), f"update {k}"


@pytest.mark.parametrize("name", ["linear", "cosine"])
def test_a_floor_rescales_the_decay_between_lr_and_the_floor(name):
    opt = schedule(name, floor=FLOOR)
    for k, ratio in {**WARMUP_VALUES, **DECAY_VALUES[name]}.items():
        expected = LR * ratio if k < WARMUP else FLOOR + (LR - FLOOR) * ratio
        assert lr_at(opt, k) == pytest.approx(expected, rel=1e-12), f"update {k}"
    assert lr_at(opt, 10_000) == pytest.approx(FLOOR)


def test_no_warmup_starts_at_the_peak_and_a_decay_needs_its_length():
    assert lr_at(OptimizerConfig(lr=LR, schedule="linear", total_updates=10), 0) == LR
    assert lr_at(OptimizerConfig(lr=LR, schedule="cosine", total_updates=10), 5) == pytest.approx(LR * 0.5)
    with pytest.raises(ValueError, match="total_updates"):
        lr_at(OptimizerConfig(lr=LR, schedule="linear"), 0)


def test_the_job_config_spans_the_schedule_over_the_whole_run():
    cfg = load_job_config(QUICKSTART, ["learner.optimizer.schedule=linear", "run.steps=30",
                                       "algorithm.inner_iterations=2"])
    assert cfg.learner.optimizer.total_updates == 60
    cfg = load_job_config(QUICKSTART, ["learner.optimizer.schedule=cosine", "learner.optimizer.total_updates=7"])
    assert cfg.learner.optimizer.total_updates == 7
    assert load_job_config(QUICKSTART).learner.optimizer.total_updates is None  # constant: no length needed
    assert load_job_config(QUICKSTART).learner.optimizer.schedule == "constant"  # today's behaviour by default


@pytest.mark.parametrize("overrides, field", [
    (["learner.optimizer.schedule=linear", "run.steps=2", "algorithm.inner_iterations=1",
      "learner.optimizer.warmup_steps=2"], "learner.optimizer.warmup_steps"),
    (["learner.optimizer.schedule=cosine", "learner.optimizer.total_updates=3", "learner.optimizer.warmup_steps=3"],
     "learner.optimizer.total_updates"),
    (["learner.optimizer.lr_floor=1.0"], "learner.optimizer.lr_floor"),
    (["learner.optimizer.schedule=exponential"], "learner.optimizer.schedule"),
    (["learner.optimizer.weight_decay_scope=norms"], "learner.optimizer.weight_decay_scope"),
    (["learner.lora.rank=0"], "learner.lora.rank"),
    (["learner.lora.dropout=1.0"], "learner.lora.dropout"),
    (["learner.lora.target_modules=[]"], "learner.lora.target_modules"),
    (["learner.lora.r=8"], "learner.lora.r"),
])
def test_a_bad_option_fails_naming_its_field(overrides, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_job_config(QUICKSTART, overrides)


def test_lora_is_off_by_default_and_on_with_d1s_rank_and_alpha():
    assert LearnerConfig().lora is None
    cfg = load_job_config(QUICKSTART, ["learner.lora={}"])
    assert (cfg.learner.lora.rank, cfg.learner.lora.alpha) == (128, 64.0)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_weight_decay_scope_decides_the_groups(family):
    policy = build_tiny_policy(family)
    named = dict(policy.named_parameters())
    decay, no_decay = decay_groups(policy, "matrices")
    ids = lambda params: {id(p) for p in params}  # noqa: E731
    matrices = {id(p) for n, p in named.items() if p.dim() >= 2}
    assert ids(decay) == matrices and ids(no_decay) == {id(p) for p in named.values()} - matrices
    one_d = {n for n, p in named.items() if id(p) in ids(no_decay)}
    assert any(n.endswith("norm.weight") for n in one_d)
    if family == "dream":  # Qwen2's q/k/v biases
        assert any(n.endswith("q_proj.bias") for n in one_d)
    decay, no_decay = decay_groups(policy, "all")
    assert ids(decay) == {id(p) for p in named.values()} and not no_decay

    for scope, decayed in (("matrices", matrices), ("all", {id(p) for p in named.values()})):
        optimizer = build_optimizer(policy, OptimizerConfig(weight_decay=0.1, weight_decay_scope=scope))
        by_decay = {g["weight_decay"]: ids(g["params"]) for g in optimizer.param_groups}
        assert by_decay[0.1] == decayed and by_decay.get(0.0, set()) == {id(p) for p in named.values()} - decayed


@pytest.mark.parametrize("family", ["llada", "dream", "sdar", "diffusion_gemma"])
def test_lora_trains_only_the_adapters_of_the_target_modules(family):
    from stabledrl.learner.lora import add_adapters

    policy = build_tiny_policy(family)
    logits = policy(torch.arange(3, 11)[None], logits_from=4).logits
    targets = ("q_proj", "v_proj", "down_proj")
    expected = sorted(n for n, m in policy.named_modules() if isinstance(m, torch.nn.Linear) and n.endswith(targets))
    adapted = add_adapters(policy, LoraConfig(rank=4, alpha=8, target_modules=list(targets)))
    trained = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained)
    assert sorted(a.path for a in adapted) == expected and len(expected) >= 3 * 2  # every layer's, of 2 or more
    assert len(trained) == 2 * len(adapted) and all(a.scale == 2.0 for a in adapted)
    # B = 0: the adapted policy computes what the plain one did
    assert torch.equal(policy(torch.arange(3, 11)[None], logits_from=4).logits, logits)
    for scope in ("matrices", "all"):  # A and B are matrices: both scopes decay exactly them
        decay, no_decay = decay_groups(policy, scope)
        assert {id(p) for p in decay} == {id(p) for n, p in policy.named_parameters() if n in trained} and not no_decay


def test_lora_adapters_start_equal_on_every_rank_and_unknown_targets_are_named():
    from stabledrl.learner.lora import add_adapters

    a, b = build_tiny_policy("llada"), build_tiny_policy("llada")
    torch.manual_seed(1)
    first = add_adapters(a, LoraConfig(rank=4))
    torch.manual_seed(2)  # another global RNG state: the adapters must not depend on it
    second = add_adapters(b, LoraConfig(rank=4))
    assert all(torch.equal(x.lora_A, y.lora_A) for x, y in zip(first, second))
    with pytest.raises(ValueError, match=r"learner\.lora\.target_modules: \['qkv'\]"):
        add_adapters(build_tiny_policy("llada"), LoraConfig(rank=4, target_modules=["q_proj", "qkv"]))


def test_merged_weight_is_w_plus_scaled_b_a():
    from stabledrl.learner.lora import merged_weight

    g = torch.Generator().manual_seed(0)
    w, a, b = (torch.randn(shape, generator=g) for shape in ((6, 5), (2, 5), (6, 2)))
    expected = w + 0.5 * (b @ a)
    assert torch.allclose(merged_weight(w, a, b, 0.5), expected, atol=1e-6)
    half = merged_weight(w.bfloat16(), a.bfloat16(), b.bfloat16(), 0.5)
    assert half.dtype == torch.bfloat16
    assert math.isclose(float((half.float() - expected).abs().max()), 0.0, abs_tol=0.05)


def test_validate_accepts_a_learner_section_with_every_option():
    cfg = validate(LearnerConfig, {"optimizer": {"schedule": "cosine", "lr_floor": 1e-7, "total_updates": 100,
                                                 "weight_decay_scope": "all"},
                                   "lora": {"rank": 16, "alpha": 32, "target_modules": ["q_proj"], "dropout": 0.05}})
    assert cfg.lora.target_modules == ["q_proj"] and cfg.optimizer.weight_decay_scope == "all"


def test_default_weight_decay_scope_is_the_stabledrl_releases():
    # the release builds AdamW(params=[every trained parameter], weight_decay=0.1): one group, all decayed
    policy = build_tiny_policy("llada")
    optimizer = build_optimizer(policy, OptimizerConfig())
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1]
    assert {id(p) for p in optimizer.param_groups[0]["params"]} == {id(p) for p in policy.parameters()}


def test_lora_on_llada_names_adapts_d1s_effective_set():
    from stabledrl.learner.lora import add_adapters

    d1_list = ["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj", "gate_proj"]
    with pytest.raises(ValueError, match=r"\['o_proj', 'down_proj', 'gate_proj'\]: LLaDA has no such module"):
        LoraConfig(target_modules=d1_list, module_names="llada")
    cfg = LoraConfig(rank=128, alpha=64, target_modules=["q_proj", "k_proj", "v_proj", "up_proj"], module_names="llada")
    assert cfg.resolved_targets() == ["q_proj", "k_proj", "v_proj", "up_proj"]
    own = LoraConfig(target_modules=["attn_out", "ff_proj", "ff_out"], module_names="llada")
    assert own.resolved_targets() == ["o_proj", "gate_proj", "down_proj", "lm_head"]
    # PEFT with d1's list on the release's own LLaDA code (modeling_llada.py, d_model 64, 4 heads, 2 layers,
    # mlp 128, r 128) adapted q_proj, k_proj, v_proj and up_proj: 147,456 adapter parameters
    policy = build_tiny_policy("llada", hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                               num_hidden_layers=2, intermediate_size=128)
    adapted = add_adapters(policy, cfg)
    assert sorted({a.path.rsplit(".", 1)[-1] for a in adapted}) == ["k_proj", "q_proj", "up_proj", "v_proj"]
    assert sum(a.lora_A.numel() + a.lora_B.numel() for a in adapted) == 147_456


def test_d1_lora_adapter_count_at_llada_8b_shape():
    from transformers import LlamaConfig, LlamaForCausalLM


    lora = load_job_config("deploy/configs/recipe_d1_llada8b_gsm8k_lora.yaml").learner.lora
    config = LlamaConfig(vocab_size=126464, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=32, intermediate_size=12288)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    targets = lora.resolved_targets()
    count = sum(lora.rank * (m.in_features + m.out_features) for n, m in model.named_modules()
                if isinstance(m, torch.nn.Linear) and n.rsplit(".", 1)[-1] in targets)
    assert count == 167_772_160  # the figure the recipe's header states
    assert "167,772,160" in open("deploy/configs/recipe_d1_llada8b_gsm8k_lora.yaml").read()


# the releases' schedules, run: StableDRL's training/utils/lr_scheduler.linear_decay(2000) at updates
# 0, 1, 500, 1999, 2000, and the HF Trainer's get_constant_schedule_with_warmup(6) (d1: warmup_ratio 0.0001
# of 56k updates) read before each of the first 9 updates at lr 3e-6
_STABLEDRL_LINEAR = {0: 1.0, 1: 0.9995, 500: 0.75, 1999: 0.0004999999999999449, 2000: 0.0}
_D1_WARMUP_LRS = [0.0, 5e-07, 1e-06, 1.5e-06, 2e-06, 2.5e-06, 3e-06, 3e-06, 3e-06]


def test_lr_schedules_are_the_releases():
    linear = OptimizerConfig(lr=2e-6, schedule="linear", total_updates=2000)
    for k, factor in _STABLEDRL_LINEAR.items():
        assert lr_at(linear, k) == pytest.approx(2e-6 * factor, rel=1e-9, abs=1e-18)
    d1 = load_job_config("deploy/configs/recipe_d1_llada8b_gsm8k_lora.yaml").learner.optimizer
    assert [lr_at(d1, k) for k in range(9)] == pytest.approx(_D1_WARMUP_LRS, rel=1e-9, abs=1e-18)
    plain = d1.model_copy(update={"warmup_from_zero": False})  # the default wastes no update
    assert lr_at(plain, 0) == pytest.approx(5e-7)
