"""The whole job's config: one section per component, validated before any actor starts.

    stabledrl train --config deploy/configs/quickstart.yaml algorithm.max_staleness=1 loss.clip_max=3

Each component receives only its own section (the rollout worker: model, sampler, estimator,
task; the learner: model, learner, estimator, loss); the coordinator reads algorithm, rollout,
weights, warmstart, eval and run.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

from pydantic import Field

from common.config.base import StrictModel, apply_overrides, load_yaml, validate
from common.config.estimator import EstimatorConfig
from common.config.learner import LearnerConfig
from common.config.loss import LossConfig
from common.config.model import ModelConfig
from common.config.sampler import SamplerConfig
from common.config.task import TaskConfig
from common.config.warmstart import EvalConfig, WarmStartConfig


class AlgorithmConfig(StrictModel):
    """What one RL step is (ALGORITHMS.md §3-4)."""

    group_size: int = Field(16, ge=2, description="G: completions per prompt; advantages are computed within a group")
    groups_per_step: int = Field(8, ge=1, description="prompts (groups) per optimizer batch")
    inner_iterations: int = Field(2, ge=1, description="μ: optimizer updates on each batch (StableDRL 2, d1 12)")
    advantage_scale: Literal["std", "none"] = Field(
        "none", description="A = r - mean_group(r), divided by the group's std when 'std'"
    )
    max_staleness: int = Field(
        0, ge=0, description="η: a sample generated at version v_b trains at version v_l only if v_l - v_b <= η; 0 = synchronous"
    )


class RolloutConfig(StrictModel):
    """The rollout workers (Ray actors)."""

    num_workers: int = Field(2, ge=1, description="rollout workers started with the job (scalable at run time)")
    num_gpus: float = Field(0.0, ge=0.0, description="GPUs per worker (0 on CPU)")
    num_cpus: float = Field(0.5, gt=0.0, description="CPUs reserved per worker")
    prompts_per_request: int = Field(2, ge=1, description="prompts a worker samples together (each yields one group)")


class RunConfig(StrictModel):
    """Length, seeds, outputs of the run."""

    steps: int = Field(100, ge=1, description="optimizer batches to train (each runs inner_iterations updates)")
    seed: int = Field(0, description="the run is a function of (config, seed)")
    output_dir: Path = Field(Path("runs/latest"), description="metrics.jsonl, TensorBoard events, checkpoints, plots")
    checkpoint_every: int = Field(0, ge=0, description="save a checkpoint every N steps (0: only at the end)")
    tensorboard: bool = Field(True, description="also write TensorBoard events")
    wandb_project: Optional[str] = Field(None, description="log to Weights & Biases under this project when set")
    progress: bool = Field(True, description="show a progress bar")


class JobConfig(StrictModel):
    model: ModelConfig
    task: TaskConfig
    sampler: SamplerConfig = SamplerConfig()
    estimator: EstimatorConfig
    loss: LossConfig
    algorithm: AlgorithmConfig = AlgorithmConfig()
    rollout: RolloutConfig = RolloutConfig()
    learner: LearnerConfig = LearnerConfig()
    warmstart: Optional[WarmStartConfig] = None
    eval: EvalConfig = EvalConfig()
    run: RunConfig = RunConfig()


def load_job_config(path: str | Path, overrides: list[str] = ()) -> JobConfig:
    """YAML file + dotted overrides -> a validated JobConfig (ConfigError names every bad field)."""
    data = apply_overrides(load_yaml(path), list(overrides))
    return validate(JobConfig, data, source=f"config {path}")
