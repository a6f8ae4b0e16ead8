"""Learner config: the optimizer, the DeepSpeed ZeRO engine and the learner's process group.

Defaults are the released StableDRL settings for LLaDA-8B (arXiv 2603.06743; ALGORITHMS.md §3):
AdamW(0.9, 0.99), weight decay 0.1, grad-norm clip 0.2, full-parameter bf16. The learning rate
(1e-6 for Sudoku / Countdown, 2e-6 for MATH / GSM8K) is the task's choice.

    learner:
      num_ranks: 2
      optimizer: {lr: 2.0e-6, warmup_steps: 0}
      deepspeed: {zero_stage: 3, dtype: auto, gradient_checkpointing: true}
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, model_validator

from common.config.base import StrictModel


class OptimizerConfig(StrictModel):
    """AdamW with a linear warm-up to a constant learning rate."""

    lr: float = Field(1e-6, gt=0.0, description="peak learning rate, reached after warmup_steps applied updates")
    betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW (β1, β2); StableDRL releases (0.9, 0.99)")
    eps: float = Field(1e-8, gt=0.0, description="AdamW ε added to sqrt(v̂)")
    weight_decay: float = Field(
        0.1, ge=0.0, description="decoupled weight decay on matrices; biases and norm weights (1-D) never decay"
    )
    grad_clip: float = Field(
        0.2, ge=0.0, description="clip the global gradient L2 norm to this value before the update; 0 disables"
    )
    warmup_steps: int = Field(
        0, ge=0, description="lr ramps linearly lr·k/warmup_steps over the first applied updates k=1..warmup_steps, then stays"
    )


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


    @model_validator(mode="after")
    def _zero_plus_plus_needs_stage_3(self) -> "DeepSpeedConfig":
        used = [name for name, on in (("hpz_partition_size", self.hpz_partition_size > 1),
                                      ("quantized_weights", self.quantized_weights),
                                      ("quantized_gradients", self.quantized_gradients)) if on]
        if used and self.zero_stage != 3:
            raise ValueError(f"{', '.join(used)}: ZeRO++ options need zero_stage 3")
        return self


class LearnerConfig(StrictModel):
    """The learner section: ranks, their process group, the optimizer and the ZeRO engine."""

    num_ranks: int = Field(1, ge=1, description="data-parallel learner ranks (one process per GPU)")
    backend: Literal["auto", "nccl", "gloo"] = Field(
        "auto", description="torch.distributed backend; auto = nccl with CUDA, gloo on CPU"
    )
    dist_timeout_s: float = Field(
        1800.0, gt=0.0, description="seconds a collective of the learner group may wait before it fails"
    )
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    deepspeed: DeepSpeedConfig = Field(default_factory=DeepSpeedConfig)

    @model_validator(mode="after")
    def _hpz_divides_ranks(self) -> "LearnerConfig":
        hpz = self.deepspeed.hpz_partition_size
        if hpz > 1 and self.num_ranks % hpz:
            raise ValueError(f"deepspeed.hpz_partition_size ({hpz}) must divide num_ranks ({self.num_ranks})")
        return self
