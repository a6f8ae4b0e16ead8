"""The whole job's config: one section per component, validated before any actor starts.

    stabledrl train --config deploy/configs/quickstart.yaml algorithm.max_staleness=1 loss.clip_max=3

Each component receives only its own sections (a rollout worker: model, sampler, estimator, task;
a learner rank: model, learner, estimator, loss, algorithm); the coordinator reads algorithm,
rollout, cluster, weights, warmstart, eval and run. ``load_job_config`` validates the file, the
overrides and every rule that spans sections (``JobConfig._cross_checks``), so a bad config fails
with the dotted name of the field before Ray is even started.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from stabledrl.common.config.base import MAX_SECONDS, ConfigError, StrictModel, apply_overrides, load_yaml, validate
from stabledrl.common.config.estimator import UNIFORM_NOISE_ESTIMATORS, EstimatorConfig
from stabledrl.common.config.learner import LearnerConfig
from stabledrl.common.config.loss import LossConfig
from stabledrl.common.config.model import ModelConfig
from stabledrl.common.config.recipe import RecipeConfig
from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.config.task import TaskConfig
from stabledrl.common.config.warmstart import EvalConfig, WarmStartConfig
from stabledrl.common.config.weights import WeightPushConfig

TOKEN_ESTIMATORS = ("mean_field", "coupled", "trajectory")  # estimators that define per-token values


class AlgorithmConfig(StrictModel):
    """What one RL step is (docs/algorithms.md §3-4)."""

    group_size: int = Field(
        16, ge=2, le=4096, description="G: completions per prompt; advantages are computed within a group"
    )
    groups_per_step: int = Field(
        8, ge=1, le=1 << 20, description="prompts (groups) per optimizer batch, over all learner ranks"
    )
    inner_iterations: int = Field(
        2, ge=1, le=10_000, description="μ: optimizer updates on each batch (StableDRL 2, d1 12)"
    )
    advantage_scale: Literal["std", "population_std", "none"] = Field(
        "none", description="A = r - mean_group(r), divided by the group's std: 'std' = the unbiased one (G - 1) "
        "plus 1e-4, as TRL; 'population_std' = the population one (G) with no epsilon, as dLLM-RL's "
        "z_score_normalize (reward/rl_reward.py); 'none' = not divided (d1, the StableDRL release)"
    )
    max_staleness: int = Field(
        0,
        ge=0,
        description="η: a sample generated at version v_b trains at version v_l only if v_l - v_b <= η; "
        "0 = synchronous",
    )
    in_order: bool = Field(
        False, description="batch b trains on exactly the prompts b·B .. (b+1)·B - 1 of the stream, waiting for a late "
        "one, and every admitted request is sent at once: the run is then a function of (config, seed) for any η "
        "and resumes exactly; False: the oldest finished groups (a straggler never holds the learner up)"
    )
    micro_batch_size: int = Field(
        64, ge=1, description="samples per learner forward; a group-coupled loss (stabledrl, wd1) keeps whole groups "
        "together, so a micro-batch then holds max(1, micro_batch_size // G) groups"
    )


class RolloutConfig(StrictModel):
    """The rollout workers (Ray actors) and how the coordinator feeds them."""

    num_workers: int = Field(2, ge=1, le=100_000, description="rollout workers started with the job")
    prompts_per_request: int = Field(
        2, ge=1, description="prompts one request carries; the worker samples their G completions each in one batch "
        "and returns one group per prompt"
    )
    requests_per_worker: int = Field(
        2, ge=1, description="requests queued on a worker at once (2: the next one is ready when one finishes)"
    )
    request_timeout_s: float = Field(
        600.0, gt=0.0, le=MAX_SECONDS, description="longest one rollout request, one worker's part of a held-out "
        "evaluation or one learner step may run (its clock starts when the call before it on the same actor "
        "finished): a rollout worker past it is killed and replaced like a dead one, its prompts re-queued; a learner "
        "rank past it stops the job, naming the rank"
    )
    min_workers: int = Field(
        1, ge=1, description="fewest workers the job runs with: `stabledrl scale` stops here, and a worker lost with "
        "its node is replaced (instead of dropped) while fewer remain"
    )
    max_workers: Optional[int] = Field(
        None, ge=1, description="most workers `stabledrl scale` and autoscale may run (None: num_workers)"
    )
    autoscale: bool = Field(
        False, description="between steps, start a worker (up to max_workers) whenever the Ray cluster has free "
        "resources for one (cluster.rollout), e.g. after a node joined"
    )
    max_restarts: int = Field(
        3, ge=0, description="replacements of one worker whose process died or hung; one more loss fails the job, "
        "naming it"
    )

    @property
    def worker_limit(self) -> int:
        return self.max_workers if self.max_workers is not None else self.num_workers


class ActorResources(StrictModel):
    """Ray resources of one actor; a placement-group bundle per actor reserves them."""

    num_cpus: float = Field(0.5, gt=0.0, description="CPUs reserved (fractions let several actors share a core)")
    num_gpus: float = Field(0.0, ge=0.0, description="GPUs (1 per learner rank and per rollout worker on GPU nodes)")
    resources: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources each actor's bundle also reserves, e.g. "
        "{learner_node: 1}: the actors go only to nodes started with that resource (`ray start --resources "
        "'{\"learner_node\": 8}'`), which pins a role to the nodes you choose; empty: any node with room"
    )

    @model_validator(mode="after")
    def _custom_resources(self) -> "ActorResources":
        for name, amount in self.resources.items():
            if name in ("CPU", "GPU", "memory", "object_store_memory"):
                raise ValueError(f"resources.{name}: set num_cpus / num_gpus instead; resources names custom Ray "
                                 "resources (a node label such as learner_node)")
            if not amount > 0:
                raise ValueError(f"resources.{name} must be > 0 (got {amount})")
        return self


class ClusterConfig(StrictModel):
    """Where the actors run: Ray resources per role and their placement groups."""

    learner: ActorResources = Field(default_factory=ActorResources, description="per learner rank")
    rollout: ActorResources = Field(default_factory=ActorResources, description="per rollout worker")
    learner_strategy: Literal["PACK", "STRICT_PACK", "SPREAD"] = Field(
        "PACK", description="placement of the learner ranks (PACK keeps NCCL traffic on as few nodes as possible, "
        "STRICT_PACK all on one node, SPREAD over as many as possible); which nodes: cluster.learner.resources"
    )
    rollout_strategy: Literal["PACK", "STRICT_PACK", "SPREAD"] = Field(
        "PACK", description="placement of the rollout workers"
    )
    colocate: bool = Field(
        False, description="rollout worker i shares learner rank i's bundle, so each GPU holds one learner rank "
        "and one worker that take turns (generation on every GPU, then training on every GPU, as the releases' "
        "own loops run): rollout.num_workers must equal learner.num_ranks and cluster.learner.num_gpus equal "
        "cluster.rollout.num_gpus (the GPU each pair shares; each actor asks Ray for half of it); the weights go "
        "through the object store (NCCL cannot hold two ranks of one group on one GPU); each actor hands its "
        "cached GPU memory back after its turn. Keep algorithm.max_staleness 0 so the turns never overlap. "
        "Workers added later (`stabledrl scale`) get bundles of their own"
    )
    local_num_cpus: Optional[int] = Field(
        None, ge=1, description="CPUs of the local Ray instance started when RAY_ADDRESS is unset (None: all cores)"
    )
    start_timeout_s: float = Field(
        600.0, gt=0.0, le=MAX_SECONDS,
        description="longest wait for placement groups and for actors to load their models"
    )


class RunConfig(StrictModel):
    """Length, seeds, outputs of the run."""

    name: Optional[str] = Field(
        None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="the job's name on the Ray cluster, for "
        "`stabledrl scale --job NAME` (None: the last part of output_dir)"
    )

    steps: int = Field(
        100, ge=1, le=100_000_000, description="optimizer batches to train (each runs inner_iterations updates)"
    )
    seed: int = Field(0, description="the run is a function of (config, seed): sampling and mask seeds derive from it")
    output_dir: Path = Field(Path("runs/latest"), description="metrics.jsonl, TensorBoard events, checkpoints")
    checkpoint_every: int = Field(0, ge=0, description="save a checkpoint every N steps (0: only at the end)")
    async_checkpoint: bool = Field(
        True, description="a child process of each learner rank writes its checkpoint files from shared host memory "
        "while training goes on (one host-memory copy of the rank's state, learner.checkpoint); the checkpoint counts "
        "as complete, and a resume uses it, only once every file is durable. false: training waits for the write"
    )
    save_final_checkpoint: bool = Field(True, description="save a checkpoint after the last step")

    export_final: bool = Field(
        True, description="write the trained policy in its family's released format, output_dir/final_model (the "
        "config and weight names the family's own code loads; model.path and `stabledrl eval --model` read it too); "
        "a LoRA run writes it with the adapters merged (in fp32, rounded once) and also its adapters as a PEFT "
        "adapter folder for model.path, output_dir/final_adapter (docs/exports.md)"
    )
    resume_from: Optional[Path] = Field(
        None, description="a checkpoint directory written by this job (output_dir/checkpoints); continue from its "
        "latest tag (`stabledrl train --resume RUN_DIR` sets it)"
    )
    tensorboard: bool = Field(True, description="also write TensorBoard events")
    wandb_project: Optional[str] = Field(None, description="log to Weights & Biases under this project when set")
    progress: bool = Field(True, description="show progress: a bar on a terminal; where the output is not a "
                           "terminal (a log file, ray job submit) a line every progress_every_s seconds with the step, "
                           "samples/s, reward, staleness and ETA")
    progress_every_s: float = Field(30.0, gt=0.0, description="seconds between two progress lines when the output is "
                                    "not a terminal (a line is also written on the first and the last step)")
    peak_tflops: Optional[float] = Field(
        None, gt=0.0, description="peak dense TFLOP/s of one learner device; when set, perf/mfu is logged"
    )

    @property
    def job_name(self) -> str:
        return self.name or Path(self.output_dir).resolve().name

    @field_validator("async_checkpoint")
    @classmethod
    def _shared_memory_here(cls, v: bool) -> bool:
        if v and not hasattr(os, "memfd_create"):
            raise ValueError("the background writer's shared host memory needs Linux (os.memfd_create); set "
                             "run.async_checkpoint false here")
        return v


class JobConfig(StrictModel):
    recipe: Optional[RecipeConfig] = Field(
        None, description="a published recipe's release and its remaining departures (common/config/recipe.py)"
    )
    model: ModelConfig
    task: TaskConfig
    sampler: SamplerConfig = Field(default_factory=SamplerConfig)
    estimator: EstimatorConfig
    loss: LossConfig
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    weights: WeightPushConfig = Field(default_factory=WeightPushConfig)
    warmstart: Optional[WarmStartConfig] = None
    eval: EvalConfig = Field(default_factory=EvalConfig)
    run: RunConfig = Field(default_factory=RunConfig)

    @model_validator(mode="after")
    def _cross_checks(self) -> "JobConfig":
        """Rules that span sections; each message starts with the field to change."""
        if self.algorithm.groups_per_step < self.learner.num_ranks:
            raise ValueError(
                f"algorithm.groups_per_step ({self.algorithm.groups_per_step}) must be >= learner.num_ranks "
                f"({self.learner.num_ranks}): every rank trains on whole groups"
            )
        # DiffusionGemma renoises with uniform tokens: its own sampler (rollout/sampling/uniform_block.py) and the
        # uniform-noise estimators read its canvases; every other estimator writes [MASK], which it never saw
        uniform = self.model.preset == "tiny-diffusion-gemma" or self.model.family == "diffusion_gemma"
        masked = not uniform and (self.model.preset is not None or self.model.family is not None)
        if uniform and self.estimator.name not in UNIFORM_NOISE_ESTIMATORS:
            raise ValueError(
                f"estimator.name {self.estimator.name!r} corrupts with the [MASK] token, but DiffusionGemma "
                f"renoises with uniform tokens; use {' or '.join(UNIFORM_NOISE_ESTIMATORS)}"
            )
        if masked and self.estimator.name in UNIFORM_NOISE_ESTIMATORS:
            raise ValueError(f"estimator.name {self.estimator.name!r} scores uniform-noise canvases (DiffusionGemma); "
                             "this model decodes [MASK] canvases: use staircase, elbo_mc or another masked estimator")
        if uniform and getattr(self.sampler, "cuda_graph", False):
            raise ValueError("sampler.cuda_graph: the DiffusionGemma sampler has no graphed step; set it False")
        level = getattr(self.loss, "level", None) or getattr(getattr(self.loss, "base", None), "level", None)
        if level == "token" and self.estimator.name not in TOKEN_ESTIMATORS:
            raise ValueError(f"loss.level 'token' needs per-token values, which estimator.name {self.estimator.name!r} "
                             f"does not give; use one of {', '.join(TOKEN_ESTIMATORS)} or level 'sequence'")
        backend = self.weights.backend
        if backend == "nccl" and self.cluster.rollout.num_gpus == 0:
            raise ValueError("weights.backend 'nccl' needs GPU rollout workers (cluster.rollout.num_gpus > 0)")
        if self.warmstart is not None and self.task.name == "generic":
            raise ValueError("warmstart: the generic task has no reference completions to fine-tune on; remove the "
                             "warmstart section (warmstart=null)")
        self._check_colocation()
        self._check_ipc()
        self._check_estimator_blocks()
        self._check_worker_bounds()
        self._fill_schedule_length()
        return self

    def _fill_schedule_length(self) -> None:
        """A decaying lr schedule spans the whole run unless learner.optimizer.total_updates says otherwise."""
        opt = self.learner.optimizer
        if opt.schedule == "constant" or opt.total_updates is not None:
            return
        updates = self.run.steps * self.algorithm.inner_iterations
        if updates <= opt.warmup_steps:
            raise ValueError(f"learner.optimizer.warmup_steps ({opt.warmup_steps}) must be below the run's "
                             f"{updates} updates (run.steps × algorithm.inner_iterations) for a decaying schedule")
        opt.total_updates = updates

    def _check_estimator_blocks(self) -> None:
        """SPG's block masking (block_random, spg_sandwich) masks the sampler's generation blocks."""
        width, block = getattr(self.estimator, "block_length", None), self.sampler.block_length
        if width is not None and block is not None and width != block:
            raise ValueError(f"estimator.block_length ({width}) must equal sampler.block_length ({block}): "
                             f"{self.estimator.name} masks the completion block by block as it was generated")

    def _check_colocation(self) -> None:
        c = self.cluster
        if not c.colocate:
            return
        if self.rollout.num_workers != self.learner.num_ranks:
            raise ValueError(f"cluster.colocate: rollout.num_workers ({self.rollout.num_workers}) must equal "
                             f"learner.num_ranks ({self.learner.num_ranks}): worker i shares learner rank i's GPU")
        if c.learner.num_gpus != c.rollout.num_gpus:
            raise ValueError(f"cluster.colocate: cluster.learner.num_gpus ({c.learner.num_gpus:g}) must equal "
                             f"cluster.rollout.num_gpus ({c.rollout.num_gpus:g}): the GPU a rank and its worker share")
        if self.weights.backend == "nccl":
            raise ValueError("weights.backend 'nccl' cannot push to a worker on its learner rank's GPU (NCCL holds "
                             "one rank of a group per GPU); with cluster.colocate use auto, ipc or object_store")

    @property
    def in_turns(self) -> bool:
        """Every rollout worker shares its learner rank's device and they take turns: colocated, no
        staleness, no workers beyond the shared devices (the ipc push's condition)."""
        r = self.rollout
        return self.cluster.colocate and self.algorithm.max_staleness == 0 and r.worker_limit == r.num_workers \
            and not r.autoscale

    def ipc_view_problem(self, gpus: bool) -> Optional[str]:
        """Why a rollout worker could not view its learner rank's parameters (``weights.ipc: view``),
        or None: a view is the parameter as the learner holds it, so the worker's dtype must be the
        learner's (``learner.deepspeed.dtype`` auto: bf16 on GPUs, fp32 on CPUs) and the parameter
        must be the learner's own (no LoRA merge, no wire dtype, not offloaded to the host)."""
        ds, learner_dtype = self.learner.deepspeed, self.learner.deepspeed.dtype
        if learner_dtype == "auto":
            learner_dtype = "bf16" if gpus else "fp32"
        if self.learner.lora is not None:
            return "learner.lora: the worker's weights are the adapters merged into the base, not a learner parameter"
        if self.weights.dtype != "keep":
            return f"weights.dtype {self.weights.dtype!r}: the worker would read another dtype than the learner holds"
        if ds.offload_params != "none":
            return "learner.deepspeed.offload_params: the parameters live in host memory, not on the shared GPU"
        if {"bf16": "bfloat16", "fp32": "float32"}[learner_dtype] != self.model.dtype:
            return (f"model.dtype {self.model.dtype!r} differs from the learner's parameters ({learner_dtype}, "
                    "learner.deepspeed.dtype)")
        return None

    def _check_ipc(self) -> None:
        c = self.cluster
        problem = self.ipc_view_problem(c.learner.num_gpus > 0 and c.rollout.num_gpus > 0)
        if self.weights.ipc == "view" and problem is not None:
            raise ValueError(f"weights.ipc 'view' lets each rollout worker read its learner rank's parameters where "
                             f"they lie, which this job cannot: {problem}; use weights.ipc auto or copy")
        if self.weights.backend != "ipc" or self.in_turns:
            return
        raise ValueError(
            "weights.backend 'ipc' maps each learner rank's weights from the rollout worker on the same device while "
            "they take turns: it needs cluster.colocate true, algorithm.max_staleness 0 and no workers beyond the "
            f"shared devices (rollout.max_workers {self.rollout.worker_limit} = num_workers "
            f"{self.rollout.num_workers}, no autoscale); otherwise use auto or object_store"
        )

    def _check_worker_bounds(self) -> None:
        r = self.rollout
        if not r.min_workers <= r.num_workers <= r.worker_limit:
            raise ValueError(f"rollout.num_workers: need min_workers ({r.min_workers}) <= num_workers "
                             f"({r.num_workers}) <= max_workers ({r.worker_limit})")
        if r.autoscale and r.max_workers is None:
            raise ValueError("rollout.autoscale needs rollout.max_workers (how far it may grow)")


STUDY_KEYS = ("job", "methods")  # the top level of a `stabledrl study` config (stabledrl/recipes/study/config.py)


def load_job_config(path: str | Path, overrides: list[str] = ()) -> JobConfig:
    """YAML file + dotted overrides -> a validated JobConfig (ConfigError names every bad field)."""
    given = load_yaml(path)
    if all(key in given for key in STUDY_KEYS) and "model" not in given:
        raise ConfigError(f"{path} is a study config (job, methods, seeds: several jobs): run it with "
                          f"`stabledrl study --config {path}`")
    data = apply_overrides(given, list(overrides), model=JobConfig)
    return validate(JobConfig, data, source=f"config {path}")


def check_installed(cfg: JobConfig) -> None:
    """What the config asks of this environment beyond the core packages: ConfigError naming the
    field and the install command (checked by `train` and its dry run before anything starts)."""
    import importlib.util

    if cfg.run.wandb_project and importlib.util.find_spec("wandb") is None:
        raise ConfigError(f"run.wandb_project: {cfg.run.wandb_project!r} logs to Weights & Biases, but wandb is not "
                          "installed here: pip install 'stabledrl[wandb]' (or pip install wandb), or unset "
                          "run.wandb_project")


def check_resources(cfg: JobConfig, offered: dict[str, float], where: str = "the Ray cluster") -> None:
    """Both roles' actors against what the cluster offers in total (``ray.cluster_resources()``),
    before any actor starts; ConfigError naming the fields that size the job."""
    roles = (("learner.num_ranks", cfg.learner.num_ranks, "cluster.learner", cfg.cluster.learner),
             ("rollout.num_workers", cfg.rollout.num_workers, "cluster.rollout", cfg.cluster.rollout))
    for resource, attribute in (("CPU", "num_cpus"), ("GPU", "num_gpus")):
        shared = resource == "GPU" and cfg.cluster.colocate  # each worker on its learner rank's GPU
        counted = roles[:1] if shared else roles
        needed = sum(count * getattr(res, attribute) for _, count, _, res in counted)
        have = float(offered.get(resource, 0.0))
        if needed > have + 1e-9:
            terms = " + ".join(f"{count_name} ({count}) × {res_name}.{attribute} ({getattr(res, attribute)})"
                               for count_name, count, res_name, res in counted)
            terms += " (cluster.colocate: the workers share these)" if shared else ""
            raise ConfigError(f"{terms} = {needed:g} {resource}s, but {where} has {have:g}: lower these or give "
                              "the cluster more (cluster.local_num_cpus for a local instance)")
    for count_name, count, res_name, res in roles:
        for name, amount in sorted(res.resources.items()):
            have = float(offered.get(name, 0.0))
            if count * amount > have + 1e-9:
                raise ConfigError(
                    f"{res_name}.resources.{name}: {count_name} ({count}) × {amount:g} = {count * amount:g}, "
                    f"but {where} has {have:g} {name} (start the nodes meant for this role with "
                    f"`ray start --resources '{{\"{name}\": N}}'`)"
                )
