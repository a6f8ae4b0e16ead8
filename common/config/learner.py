"""Learner config: the optimizer, the DeepSpeed ZeRO engine and the learner's process group.

Defaults are the released StableDRL settings for LLaDA-8B (arXiv 2603.06743; docs/algorithms.md §3):
AdamW(0.9, 0.99), weight decay 0.1 on every trained parameter, grad-norm clip 0.2, full-parameter bf16.
The learning rate (1e-6 for Sudoku / Countdown, 2e-6 for MATH / GSM8K) is the task's choice.

    learner:
      num_ranks: 2
      optimizer: {lr: 2.0e-6, warmup_steps: 0, schedule: linear}     # linear decay to 0 over the run
      deepspeed: {zero_stage: 3, dtype: auto, gradient_checkpointing: true}
      lora: {rank: 128, alpha: 64}                                     # adapters instead of full fine-tuning
      checkpoint: {reserve: true}                                      # background saves: host memory reserved ahead
"""
from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field, model_validator

from stabledrl.common.config.base import MAX_SECONDS, StrictModel
from stabledrl.common.llada_names import LLADA_LINEAR_NAMES, llada_linear_targets


class OptimizerConfig(StrictModel):
    """AdamW with a linear warm-up, then a constant, linearly or cosine-decaying learning rate
    (``stabledrl.learner.zero.lr_at`` has the formulas)."""

    lr: float = Field(1e-6, gt=0.0, description="peak learning rate, reached after warmup_steps applied updates")
    betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW (β1, β2); StableDRL releases (0.9, 0.99)")
    eps: float = Field(1e-8, gt=0.0, description="AdamW ε added to sqrt(v̂)")
    weight_decay: float = Field(
        0.1, ge=0.0, description="decoupled weight decay of the parameters weight_decay_scope picks"
    )
    weight_decay_scope: Literal["all", "matrices"] = Field(
        "all", description="all: every trained parameter decays (the StableDRL release: one AdamW group over all "
        "trained parameters); matrices: only parameters of 2 or more dimensions decay, biases and norm weights never "
        "do (HF Trainer's rule, so d1's; with LoRA every adapter is a matrix and the two scopes agree)"
    )
    grad_clip: float = Field(
        0.2, ge=0.0, description="clip the global gradient L2 norm to this value before the update; 0 disables"
    )
    warmup_steps: int = Field(
        0,
        ge=0,
        description="lr ramps linearly lr·k/warmup_steps over the first applied updates k=1..warmup_steps, then stays",
    )
    warmup_from_zero: bool = Field(
        False, description="warm-up as the HF Trainer (so d1) schedules it: update k runs at lr·k/warmup_steps, the "
        "first at lr 0; False: lr·(k+1)/warmup_steps, so that no update is wasted"
    )
    schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="lr after the warm-up: constant; linear or cosine decay from lr to lr_floor over "
        "total_updates (the StableDRL release decays linearly to 0 over the run)"
    )
    lr_floor: float = Field(0.0, ge=0.0, description="the lr a linear or cosine schedule ends at (0: decay to 0)")
    total_updates: Optional[int] = Field(
        None, ge=1, description="applied optimizer updates the schedule spans, warm-up included: a decaying lr "
        "reaches lr_floor after this many. None: the whole run, run.steps × algorithm.inner_iterations (filled in "
        "when the job config is read). A skipped (non-finite) step does not advance the schedule"
    )

    @model_validator(mode="after")
    def _schedule_fits(self) -> "OptimizerConfig":
        if self.lr_floor > self.lr:
            raise ValueError(f"learner.optimizer.lr_floor ({self.lr_floor}) must be <= lr ({self.lr})")
        if self.schedule != "constant" and self.total_updates is not None and self.total_updates <= self.warmup_steps:
            raise ValueError(f"learner.optimizer.total_updates ({self.total_updates}) must exceed warmup_steps "
                             f"({self.warmup_steps}) for a decaying schedule")
        return self


class DeepSpeedConfig(StrictModel):
    """How the learner shards and computes (DeepSpeed ZeRO, arXiv 1910.02054)."""

    zero_stage: Literal[2, 3] = Field(
        3, description="2: optimizer state + gradients sharded; 3: parameters sharded too (gathered per layer)"
    )
    dtype: Literal["auto", "bf16", "fp32"] = Field(
        "auto", description="parameter / compute dtype; auto = bf16 on a CUDA device that has it, else fp32 (CPU)"
    )
    gradient_checkpointing: bool = Field(
        False, description="recompute activations in backward (the HF model's gradient_checkpointing_enable)"
    )
    param_persistence_threshold: int = Field(
        100_000, ge=0, description="ZeRO-3: parameters with fewer elements stay gathered; 0 for tiny test models"
    )
    reduce_bucket_size: int = Field(
        500_000_000, gt=0, description="elements per gradient reduce(-scatter) bucket"
    )
    prefetch_bucket_size: int = Field(50_000_000, gt=0, description="ZeRO-3: elements prefetched ahead of a forward")
    gather_bucket_mb: int = Field(
        512, gt=0, description="ZeRO-3: MiB of parameters gathered at once when the full weights are read (weight push)"
    )
    max_live_parameters: int = Field(
        1_000_000_000, gt=0, description="ZeRO-3: most gathered parameter elements kept on a rank at once (prefetched "
        "ones included) before released ones must go"
    )
    max_reuse_distance: int = Field(
        1_000_000_000, ge=0, description="ZeRO-3: a gathered parameter needed again within this many elements of "
        "other parameters is kept instead of released and gathered again (the recomputed forward re-uses them)"
    )
    overlap_comm: Optional[bool] = Field(
        None, description="run gradient reduction (and, ZeRO-3, parameter gathers) on side streams overlapping the "
        "compute; None = DeepSpeed's default (on for ZeRO-3, off for ZeRO-2)"
    )
    contiguous_gradients: bool = Field(
        True, description="copy gradients into one contiguous buffer as they are produced (no fragmentation)"
    )
    allgather_bucket_size: int = Field(
        500_000_000, gt=0, description="ZeRO-2: elements per all-gather of the updated parameters"
    )
    hpz_partition_size: int = Field(
        1, ge=1, description="ZeRO++ hierarchical partitioning (hpZ, arXiv 2306.10209), ZeRO-3 only: a second copy "
        "of the bf16 weights sharded over groups of this many ranks (the GPUs of one node), so the backward's "
        "gathers stay inside a node; 1 = off. Must divide learner.num_ranks; helps only across nodes"
    )
    quantized_weights: bool = Field(
        False, description="ZeRO++ qwZ, ZeRO-3 only: gather weights quantised to int8 blocks (half the bytes, "
        "rounding error in every forward); for slow links, not NVLink"
    )
    quantized_gradients: bool = Field(
        False, description="ZeRO++ qgZ, ZeRO-3 only: reduce-scatter gradients quantised to int4/int8 (fewer bytes, "
        "rounding error in every update); for slow links, not NVLink"
    )
    offload_optimizer: Literal["none", "cpu"] = Field(
        "none", description="ZeRO-Offload (arXiv 2101.06840): cpu = the fp32 master weights, the AdamW moments and "
        "the optimizer step live in host memory (~12 bytes per trained parameter leave the GPU; every step copies "
        "the gradients down and the updated weights up). The step is torch's AdamW on the CPU (learner.optimizer "
        "as ever), so a full-parameter 8B learner fits one 80 GB card at the price of a slower step"
    )
    offload_params: Literal["none", "cpu"] = Field(
        "none", description="ZeRO-3 only (ZeRO-Infinity, arXiv 2104.07857): cpu = the bf16 parameter shards live in "
        "host memory too and are copied up for each gather; needs offload_optimizer: cpu"
    )
    offload_pin_memory: bool = Field(
        True, description="page-locked host buffers for the offloaded tensors (faster copies; host memory that "
        "cannot be swapped)"
    )

    @model_validator(mode="after")
    def _offload_params_needs_stage_3(self) -> "DeepSpeedConfig":
        if self.offload_params != "none" and self.zero_stage != 3:
            raise ValueError("offload_params: parameter offload needs zero_stage 3 (ZeRO-2 keeps whole parameters)")
        if self.offload_params != "none" and self.offload_optimizer == "none":
            raise ValueError("offload_params: cpu needs offload_optimizer: cpu (DeepSpeed offloads parameters only "
                             "with the optimizer)")
        return self

    @model_validator(mode="after")
    def _zero_plus_plus_needs_stage_3(self) -> "DeepSpeedConfig":
        used = [name for name, on in (("hpz_partition_size", self.hpz_partition_size > 1),
                                      ("quantized_weights", self.quantized_weights),
                                      ("quantized_gradients", self.quantized_gradients)) if on]
        if used and self.zero_stage != 3:
            raise ValueError(f"{', '.join(used)}: ZeRO++ options need zero_stage 3")
        return self


class LoraConfig(StrictModel):
    """Low-rank adapters (LoRA, arXiv 2106.09685, through the ``peft`` library) instead of full
    fine-tuning: each target Linear W becomes W + (alpha / rank)·B·A with A [rank, in] and B
    [out, rank] trained, W frozen. The rollout workers receive A and B and hold them unmerged (``push``).
    Defaults are d1's diffu-GRPO recipe (r 128, alpha 64)."""

    rank: int = Field(128, ge=1, description="r: the inner dimension of B·A (d1: 128)")
    alpha: float = Field(64.0, gt=0.0, description="the adapter output is scaled by alpha / rank (d1: 64)")
    target_modules: list[str] = Field(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        min_length=1, description="Linear modules to adapt, by the last part of their name in the transformers "
        "model (LLaDA runs as Llama here: q/k/v/o_proj, gate/up/down_proj; Dream and SDAR use the same names). "
        "d1 lists these seven against LLaDA's own module names, of which only q/k/v_proj and up_proj exist there; "
        "module_names: llada names LLaDA's own modules (the d1 recipe: [q_proj, k_proj, v_proj, up_proj])",
    )
    module_names: Literal["project", "llada"] = Field(
        "project", description="how target_modules are named. project: the modules of the model as loaded here "
        "(LLaDA runs as Llama). llada: LLaDA's own module names (q_proj, k_proj, v_proj, attn_out, ff_proj, "
        "up_proj, ff_out), mapped to the project's (o_proj, gate_proj, up_proj, down_proj; ff_out is also LLaDA's "
        "output head, lm_head, as for PEFT on LLaDA's code); a name LLaDA lacks is refused, where PEFT would skip it"
    )
    dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="dropout on the adapters' input while training (d1: 0.05); above 0 the "
        "learner's log-likelihoods carry dropout noise that the rollout workers' behaviour estimates do not"
    )
    push: Literal["adapters", "merged"] = Field(
        "adapters", description="what a weight push carries: adapters = A and B of every target (r·(in+out) numbers "
        "per target), held unmerged on each rollout worker, which then computes the learner's forward exactly (two "
        "small matmuls more per target); merged = W + (alpha/rank)·B·A of every target (out·in numbers per target), "
        "rounded to the weights' dtype: the workers sample a dense model, without the adapters' matmuls, whose "
        "policy is the learner's rounded (in bf16 an update under half an ulp of W is lost, most of a small early "
        "one): for rollouts at the dense model's speed where that rounding is acceptable"
    )

    @model_validator(mode="after")
    def _llada_names_exist(self) -> "LoraConfig":
        if self.module_names == "llada":
            unknown = [t for t in self.target_modules if t not in LLADA_LINEAR_NAMES]
            if unknown:
                raise ValueError(
                    f"target_modules {unknown}: LLaDA has no such module (its Linear modules: "
                    f"{', '.join(LLADA_LINEAR_NAMES)}); PEFT on LLaDA's own code skips such names silently, so d1's "
                    "list adapts q_proj, k_proj, v_proj and up_proj only")
        return self

    def resolved_targets(self) -> list[str]:
        """target_modules in the project's module names."""
        if self.module_names == "llada":
            return llada_linear_targets(self.target_modules)
        return list(self.target_modules)


class CheckpointWriterConfig(StrictModel):
    """How a learner rank writes a checkpoint in the background (run.async_checkpoint): the state is
    copied into shared host memory reserved ahead (page-locked with CUDA: a copy at the link's
    speed) and a child process writes the files, so neither the copy nor the write holds the
    training thread up (learner/checkpoint_process.py)."""

    reserve: bool = Field(
        True, description="reserve the host memory (one copy of this rank's state) after the first update, so that "
        "the first save's copy does not fault it in; it stays reserved for the run. Only where the job saves in the "
        "background during the run (run.async_checkpoint and run.checkpoint_every > 0); false: at the first save"
    )

    @model_validator(mode="before")
    @classmethod
    def _writer_removed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "writer" in data:
            raise ValueError(
                f"learner.checkpoint.writer ({data['writer']!r}) is gone: a background checkpoint is always written "
                "by a child process from shared host memory (the thread writer it chose between was removed); "
                "delete the line")
        return data


class LearnerConfig(StrictModel):
    """The learner section: ranks, their process group, the optimizer and the ZeRO engine."""

    num_ranks: int = Field(1, ge=1, description="data-parallel learner ranks (one process per GPU)")
    backend: Literal["auto", "nccl", "gloo"] = Field(
        "auto", description="torch.distributed backend; auto = nccl with CUDA, gloo on CPU"
    )
    dist_timeout_s: float = Field(
        1800.0, gt=0.0, le=MAX_SECONDS, description="seconds a collective of the learner group may wait before it fails"
    )
    loss_normalisation: Literal["step", "micro_batch"] = Field(
        "step", description="what a loss divides its token (sample, group) sums by. step: the whole optimizer step's "
        "count over all micro-batches and ranks, so every token weighs the same however the batch is cut. "
        "micro_batch: d1's (TRL's) and SPG's plain rule, a mean inside each micro-batch, then the mean over "
        "micro-batches and ranks: a token weighs 1/(tokens in its micro-batch), up to several times more in a "
        "micro-batch of short completions"
    )
    micro_batches_per_forward: int = Field(
        1, ge=1, description="micro-batches (algorithm.micro_batch_size rows each) fed to one forward and backward: "
        "their rows are collated together and each takes its loss with its own counts (loss_normalisation), so the "
        "update is the one of separate forwards, to rounding. Fewer, larger forwards keep the GPU busy where small "
        "ones leave it waiting on the host: d1's 6-row micro-batches with LoRA at LLaDA-8B keep an H100 busy 44% "
        "of the time, 12-row forwards train 1.55x faster; activation memory grows with the rows of a forward"
    )
    compile: bool = Field(
        False, description="the elementwise work between each decoder layer's matrix products (both RMSNorms, the "
        "rotation of queries and keys, the SiLU-gated activation) through torch.compile: one fused kernel forward "
        "and one backward where eager runs several passes each over the activation (LLaDA rotates in float32). "
        "Only those three functions are compiled; the modules are still "
        "called as modules, so ZeRO-3's gathers, LoRA and checkpointing are unchanged. Llama / Qwen2 / Qwen3 "
        "classes (LLaDA, Dream, SDAR, TraDo); the first micro-batch of a new shape compiles (seconds)"
    )
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    deepspeed: DeepSpeedConfig = Field(default_factory=DeepSpeedConfig)
    checkpoint: CheckpointWriterConfig = Field(default_factory=CheckpointWriterConfig)
    lora: Optional[LoraConfig] = Field(
        None, description="train LoRA adapters on the frozen model (None: full fine-tuning); the optimizer then "
        "holds only the adapters' states and a weight push carries only the adapted matrices"
    )

    @model_validator(mode="after")
    def _hpz_divides_ranks(self) -> "LearnerConfig":
        hpz = self.deepspeed.hpz_partition_size
        if hpz > 1 and self.num_ranks % hpz:
            raise ValueError(f"deepspeed.hpz_partition_size ({hpz}) must divide num_ranks ({self.num_ranks})")
        return self
