"""JobConfig: every shipped config parses; bad configs fail before any actor starts, naming the field."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from stabledrl.common.config.base import ConfigError
from stabledrl.common.config.job import load_job_config
from stabledrl.common.config.learner import LearnerConfig
from stabledrl.common.models.job_check import check_sampler_layout
from stabledrl.common.transport.plan import PushInputs, plan_push

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = sorted(p for p in (ROOT / "deploy" / "configs").glob("*.yaml") if not p.name.startswith("study_"))
STUDY_CONFIGS = sorted((ROOT / "deploy" / "configs").glob("study_*.yaml"))

GOOD = {
    "model": {"preset": "tiny-llada"},
    "task": {"name": "arithmetic", "held_out": 10},
    "sampler": {"gen_length": 4, "block_length": 4, "steps": 4},
    "estimator": {"name": "block_random", "block_length": 4},
    "loss": {"name": "stabledrl"},
    "algorithm": {"group_size": 4, "groups_per_step": 2},
    "learner": {"num_ranks": 2},
}


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_deploy_configs_exist_and_parse():
    assert {p.name for p in CONFIGS} >= {"quickstart.yaml", "llada8b_1node.yaml", "llada8b_multinode.yaml"}
    for path in CONFIGS:
        cfg = load_job_config(path)
        if cfg.model.preset is not None:
            check_sampler_layout(cfg)


def test_deploy_study_configs_parse_as_studies():
    from stabledrl.recipes.study.config import load_study_config

    assert {p.name for p in STUDY_CONFIGS} >= {"study_cpu.yaml", "study_gpu.yaml"}
    for path in STUDY_CONFIGS:
        load_study_config(path)


def test_a_good_config_and_its_overrides(tmp_path):
    cfg = load_job_config(write(tmp_path, GOOD), ["algorithm.max_staleness=2", "loss.clip_max=3"])
    assert cfg.algorithm.max_staleness == 2 and cfg.loss.clip_max == 3.0
    assert cfg.weights.backend == "auto"
    check_sampler_layout(cfg)


def test_the_auto_weight_push_follows_the_actors_gpus_not_this_process():
    from stabledrl.common.transport import setup_weight_push
    from stabledrl.common.transport.base import WeightPushConfig

    auto = WeightPushConfig()
    assert resolved(auto, gpus=False).backend == "object_store"
    assert resolved(auto, gpus=True).backend == "nccl"  # whatever this (CPU) process has
    assert resolved(WeightPushConfig(backend="gloo"), gpus=True).backend == "gloo"  # a choice stays
    with pytest.raises(ValueError, match="must be resolved"):
        setup_weight_push(auto)


def resolved(weights, gpus: bool, colocated: bool = False, in_turns: bool = False):
    """The transport the plan of the job's start sets up (common/transport/plan.py)."""
    return plan_push(PushInputs(weights, LearnerConfig(), gpus=gpus, colocated=colocated, in_turns=in_turns)).transport


def planned(cfg):
    """The transport the plan of ``cfg``'s start sets up."""
    return plan_push(PushInputs.of(cfg)).transport


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["algorithm.group_size=1"], "algorithm.group_size"),
        (["algorithm.max_staleness=-1"], "algorithm.max_staleness"),
        (["algorithm.groups_per_step=1"], "algorithm.groups_per_step"),  # fewer groups than learner ranks
        (["loss.name=ppo"], "loss"),
        (["loss.clip_max=abc"], "loss.clip_max"),
        (["estimator.num_draws=0"], "estimator.num_draws"),
        (["sampler.block_length=3"], "sampler.block_length"),
        (["rollout.num_workers=0"], "rollout.num_workers"),
        (["rollout.colour=blue"], "rollout.colour"),
        (["learner.deepspeed.zero_stage=1"], "learner.deepspeed.zero_stage"),
        (["weights.backend=carrier_pigeon"], "weights.backend"),
        (["weights.backend=nccl"], "weights.backend"),  # NCCL with CPU rollout workers
        (["model.preset=tiny-diffusion-gemma"], "estimator.name"),  # a [MASK] estimator on a uniform-noise model
        (["loss.name=grpo", "loss.level=token"], "loss.level"),  # per-token ratios from a sequence estimator
        (["warmstart.steps=0"], "warmstart.steps"),
        (["model.path=/ckpt"], "model"),  # both a preset and a path
        (["run.steps=0"], "run.steps"),
        (["cluster.learner.num_cpus=0"], "cluster.learner.num_cpus"),
    ],
)
def test_bad_configs_name_the_field(tmp_path, overrides, field):
    with pytest.raises(ConfigError) as info:
        load_job_config(write(tmp_path, GOOD), overrides)
    assert field in str(info.value)


def test_sampler_layout_is_checked_against_the_model_block(tmp_path):
    data = {**GOOD, "model": {"preset": "tiny-sdar"}, "estimator": {"name": "staircase"}}
    cfg = load_job_config(write(tmp_path, data))  # gen 4, block 4 = SDAR's block: fine
    check_sampler_layout(cfg)
    cfg = load_job_config(write(tmp_path, data), ["sampler.gen_length=8", "sampler.block_length=8", "sampler.steps=8"])
    with pytest.raises(ConfigError, match="sampler"):
        check_sampler_layout(cfg)  # block diffusion decodes in the model's own block size (4)


def test_a_missing_file_and_a_malformed_override_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_job_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="key.path=value"):
        load_job_config(write(tmp_path, GOOD), ["algorithm.group_size"])


def test_colocation_needs_a_worker_per_rank_the_same_gpu_and_no_nccl(tmp_path):
    """cluster.colocate: worker i shares rank i's GPU; a config that cannot do that fails naming
    the field, and auto pushes through the object store (NCCL holds one rank of a group per GPU)."""
    from stabledrl.common.config.job import check_resources

    path = write(tmp_path, GOOD)
    gpus = ["cluster.learner.num_gpus=1", "cluster.rollout.num_gpus=1"]
    cfg = load_job_config(path, ["cluster.colocate=true", "rollout.num_workers=2", *gpus])
    assert resolved(cfg.weights, gpus=True, colocated=True).backend == "object_store"  # not in turns
    check_resources(cfg, {"CPU": 2.0, "GPU": 2.0})  # 2 GPUs shared by 2 ranks and 2 workers
    with pytest.raises(ConfigError, match=r"learner.num_ranks \(2\) × cluster.learner.num_gpus \(1.0\) \(cluster"):
        check_resources(cfg, {"CPU": 2.0, "GPU": 1.0})
    for overrides, message in (
        (["rollout.num_workers=1", *gpus], r"cluster.colocate: rollout.num_workers \(1\) must equal learner.num_ranks"),
        (["rollout.num_workers=2", "cluster.learner.num_gpus=1"], r"cluster.colocate: cluster.learner.num_gpus \(1\)"),
        (["rollout.num_workers=2", *gpus, "weights.backend=nccl"], r"weights.backend 'nccl' cannot push"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_job_config(path, ["cluster.colocate=true", *overrides])


def test_colocated_ranks_and_workers_in_turns_push_through_ipc_and_only_then(tmp_path):
    """auto resolves to the same-device push (ipc) on GPUs when every worker shares its rank's GPU
    and they take turns; an explicit ipc that cannot hold fails naming the fields to change."""
    path = write(tmp_path, GOOD)
    colocated = ["cluster.colocate=true", "rollout.num_workers=2", "cluster.learner.num_gpus=1",
                 "cluster.rollout.num_gpus=1"]
    cfg = load_job_config(path, [*colocated, "algorithm.max_staleness=0"])
    assert cfg.in_turns
    assert resolved(cfg.weights, gpus=True, colocated=True, in_turns=cfg.in_turns).backend == "ipc"
    assert resolved(cfg.weights, gpus=False, colocated=True, in_turns=True).backend == "object_store"
    assert resolved(cfg.weights, gpus=True, colocated=False, in_turns=False).backend == "nccl"
    assert load_job_config(path, [*colocated, "algorithm.max_staleness=0", "weights.backend=ipc"]).weights.collective \
        is False
    for overrides in (["algorithm.max_staleness=1"], ["algorithm.max_staleness=0", "rollout.max_workers=3"]):
        cfg = load_job_config(path, [*colocated, *overrides])
        assert not cfg.in_turns
        assert resolved(cfg.weights, gpus=True, colocated=True, in_turns=cfg.in_turns).backend == \
            "object_store"
        with pytest.raises(ConfigError, match=r"weights.backend 'ipc' .* algorithm.max_staleness 0"):
            load_job_config(path, [*colocated, *overrides, "weights.backend=ipc"])
    with pytest.raises(ConfigError, match=r"weights.backend 'ipc' .* needs cluster.colocate true"):
        load_job_config(path, ["algorithm.max_staleness=0", "weights.backend=ipc"])


def test_colocated_workers_view_their_ranks_parameters_where_they_can(tmp_path):
    """weights.ipc auto: view where the worker's model is in the learner's parameter dtype and holds the
    learner's own parameters, else copy; an explicit view that cannot hold fails naming why."""
    path = write(tmp_path, GOOD)
    gpus = ["cluster.colocate=true", "rollout.num_workers=2", "cluster.learner.num_gpus=1",
            "cluster.rollout.num_gpus=1", "algorithm.max_staleness=0"]
    bf16 = ["model.dtype=bfloat16"]  # the learner's auto dtype on GPUs
    assert planned(load_job_config(path, [*gpus, *bf16])).model_dump(include={"backend", "ipc"}) == \
        {"backend": "ipc", "ipc": "view"}
    cpu = ["cluster.colocate=true", "rollout.num_workers=2", "algorithm.max_staleness=0", "weights.backend=ipc"]
    assert planned(load_job_config(path, cpu)).ipc == "view"  # fp32 on both sides on the CPU
    lora = ["learner.lora.rank=4", "learner.lora.target_modules=[q_proj]"]
    for overrides, why in ((["model.dtype=float32"], "model.dtype 'float32' differs"),
                           ([*bf16, *lora], "learner.lora"), ([*bf16, "weights.dtype=fp16"], "weights.dtype 'fp16'"),
                           ([*bf16, "learner.deepspeed.zero_stage=3", "learner.deepspeed.offload_optimizer=cpu",
                             "learner.deepspeed.offload_params=cpu"], "offload_params")):
        cfg = load_job_config(path, [*gpus, *overrides])
        assert planned(cfg).ipc == "copy" and why in cfg.ipc_view_problem(True), overrides
        with pytest.raises(ConfigError, match=rf"weights.ipc 'view' .*: .*{why}"):
            load_job_config(path, [*gpus, *overrides, "weights.ipc=view"])
    assert planned(load_job_config(path, [*gpus, *bf16, "weights.ipc=copy"])).ipc == "copy"


@pytest.mark.parametrize("value", ["shards", "gather"])
def test_a_removed_weights_option_is_refused_naming_what_to_do(tmp_path, value):
    """weights.source is gone (the plan reads partitions where they lie wherever it can): a config
    that still sets it fails before any actor starts, naming the field and what to do."""
    with pytest.raises(ConfigError, match=r"weights: weights.source was removed: .*; delete weights.source"):
        load_job_config(write(tmp_path, GOOD), [f"weights.source={value}"])
    with pytest.raises(ConfigError, match=r"weights.source was removed"):
        load_job_config(write(tmp_path, {**GOOD, "weights": {"backend": "gloo", "source": value}}))
