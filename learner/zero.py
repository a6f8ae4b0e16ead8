"""DeepSpeed ZeRO plumbing behind ``stabledrl.learner.engine.LearnerEngine``: the DeepSpeed config, the
guarded AdamW that can refuse a step, parameter groups, activation checkpointing, and the one
place where ZeRO-3 shards are gathered into full tensors (``gathered_named_parameters``).
"""
from __future__ import annotations

import math
from typing import Callable, Iterator, Optional

import torch
from torch import nn

from stabledrl.common.config.learner import DeepSpeedConfig, OptimizerConfig


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """"auto" -> bf16 on a CUDA device with bf16 support, fp32 elsewhere (DeepSpeed's CPU path
    runs fp32 and bf16 but not fp16)."""
    if dtype == "bf16":
        return torch.bfloat16
    if dtype == "fp32":
        return torch.float32
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def deepspeed_config(cfg: DeepSpeedConfig, opt: OptimizerConfig, dtype: torch.dtype, world_size: int) -> dict:
    """The DeepSpeed JSON config. Gradient accumulation is ours (see ``LearnerEngine.train_step``):
    DeepSpeed is told 1 micro-batch of 1 per rank, so its 1/gas loss scaling is 1."""
    zero: dict = {
        "stage": cfg.zero_stage,
        "contiguous_gradients": cfg.contiguous_gradients,
        "reduce_bucket_size": cfg.reduce_bucket_size,
    }
    if cfg.overlap_comm is not None:
        zero["overlap_comm"] = cfg.overlap_comm
    if cfg.zero_stage == 3:
        zero.update(
            stage3_param_persistence_threshold=cfg.param_persistence_threshold,
            stage3_prefetch_bucket_size=cfg.prefetch_bucket_size,
            stage3_max_live_parameters=cfg.max_live_parameters,
            stage3_max_reuse_distance=cfg.max_reuse_distance,
            zero_hpz_partition_size=cfg.hpz_partition_size,
            zero_quantized_weights=cfg.quantized_weights,
            zero_quantized_gradients=cfg.quantized_gradients,
        )
    else:
        zero["allgather_bucket_size"] = cfg.allgather_bucket_size
    if cfg.offload_optimizer != "none":
        zero["offload_optimizer"] = {"device": cfg.offload_optimizer, "pin_memory": cfg.offload_pin_memory}
    if cfg.offload_params != "none":
        zero["offload_param"] = {"device": cfg.offload_params, "pin_memory": cfg.offload_pin_memory}
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "train_batch_size": world_size,
        "gradient_clipping": opt.grad_clip,
        "zero_optimization": zero,
        # ZeRO-1/2 would test every gradient tensor for inf/NaN before the step: seven kernel launches a
        # tensor (d1's LoRA trains 256) and a host sync. A bf16 step has no loss scale to adjust, and a
        # non-finite gradient makes the global norm non-finite, which LearnerEngine._may_step refuses: the
        # step is skipped as before, nothing moves
        "bf16": {"enabled": dtype == torch.bfloat16, "check_grad_overflow": False},
        # GuardedAdamW subclasses torch's AdamW; DeepSpeed's allow-list checks the exact type
        "zero_allow_untested_optimizer": True,
        # offload steps GuardedAdamW on the host partitions (DeepSpeed would insist on its compiled CPU Adam)
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }


class GuardedAdamW(torch.optim.AdamW):
    """torch AdamW whose ``step`` does nothing while ``may_step()`` says no.

    DeepSpeed's ZeRO optimizer computes the global grad norm, clips, then calls this step on the
    fp32 master partitions. Refusing here leaves master weights, bf16 weights and the Adam moments
    untouched while DeepSpeed still clears the gradients, so a skipped step costs nothing but
    itself. ``refused`` records whether the last call was refused.
    """

    def __init__(self, params, **kwargs) -> None:
        super().__init__(params, **kwargs)
        self.may_step: Callable[[], bool] = lambda: True
        self.refused = False

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D401 - torch signature
        if not self.may_step():
            self.refused = True
            return None
        return super().step(closure)


def build_optimizer(model: nn.Module, opt: OptimizerConfig) -> GuardedAdamW:
    """AdamW over the trained parameters (``requires_grad``: all of them, or the LoRA adapters),
    in two groups by ``decay_groups``."""
    decay, no_decay = decay_groups(model, opt.weight_decay_scope)
    groups = [{"params": decay, "weight_decay": opt.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    # on GPUs the fused kernel: one pass over parameters, gradients and moments (+0.5 MFU point at
    # the 1.78B shape on an H200, BENCHMARKS.md); ZeRO-3 partitions start on the GPU too
    fused = bool(decay + no_decay) and all(p.is_cuda for p in decay + no_decay)
    return GuardedAdamW(groups, lr=opt.lr, betas=opt.betas, eps=opt.eps, weight_decay=opt.weight_decay,
                        fused=fused or None)


def decay_groups(model: nn.Module, scope: str) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(decayed, not decayed) trained parameters. ``scope`` "matrices": parameters of 2 or more
    dimensions decay, biases and norm weights (1-D) do not; "all": every trained parameter decays."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if scope == "all" or p.dim() >= 2 else no_decay).append(p)
    return decay, no_decay


def lr_at(opt: OptimizerConfig, applied_steps: int) -> float:
    """lr of update k = ``applied_steps`` (the count of updates applied before it; skipped steps
    do not advance k). With W = warmup_steps, T = total_updates, peak lr and floor f:

        k < W:              lr·(k+1)/W  (warmup_from_zero: lr·k/W)    linear warm-up
        k >= W, constant:   lr
        k >= W, linear:     f + (lr - f)·(1 - p)                      p = min(1, (k - W)/(T - W))
        k >= W, cosine:     f + (lr - f)·(1 + cos(π·p))/2

    so the decay starts at lr on update W and would reach f at update T: the last update of a run
    of T updates, k = T-1, still moves the weights (lr - f)/(T - W) above the floor (linear).
    """
    k, warmup = applied_steps, opt.warmup_steps
    if k < warmup:  # warmup_from_zero: the HF Trainer's lr·k/W (its first update at lr 0)
        return opt.lr * (k + (0 if opt.warmup_from_zero else 1)) / warmup
    if opt.schedule == "constant":
        return opt.lr
    if opt.total_updates is None:
        raise ValueError(f"learner.optimizer.total_updates is unset; the {opt.schedule} schedule needs the "
                         "run's length")
    p = min(1.0, (k - warmup) / (opt.total_updates - warmup))
    shape = 1.0 - p if opt.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * p))
    return opt.lr_floor + (opt.lr - opt.lr_floor) * shape


def enable_gradient_checkpointing(model: nn.Module) -> bool:
    """Call the first ``gradient_checkpointing_enable`` found (the HF model inside a
    DiffusionPolicy); non-reentrant checkpointing, which ZeRO-3's parameter hooks need."""
    for module in model.modules():
        enable = getattr(module, "gradient_checkpointing_enable", None)
        if callable(enable):
            # already on from model.gradient_checkpointing: kept as loaded (model.checkpointed_layers)
            name = "is_activation_checkpointing" if hasattr(type(module), "is_activation_checkpointing") \
                else "is_gradient_checkpointing"  # transformers >= 5.2x renamed it
            if not getattr(module, name, False):
                enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            return True
    return False


def zero3_numel(p: torch.Tensor) -> int:
    """Full element count of a parameter (ZeRO-3 partitions leave ``numel() == 0`` locally)."""
    return int(getattr(p, "ds_numel", p.numel()))


def gathered_named_parameters(
    module: nn.Module, zero_stage: int, bucket_bytes: int, receive: bool
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, full tensor)`` for every parameter of ``module`` where ``receive`` is true
    (rank 0 for a weight push; every rank in tests).

    Every rank must iterate to the end: under ZeRO-3 the gathers are collectives (a rank with
    ``receive=False`` yields nothing but takes part). Parameters are gathered ``bucket_bytes`` at a time, so at most
    one bucket of full tensors exists beyond the shards. A yielded tensor is a view that is valid
    only until the next item is requested: copy it (``send`` does). Under ZeRO-2 every rank holds
    full parameters and nothing is gathered.
    """
    named = list(module.named_parameters())
    if zero_stage < 3:
        if receive:
            for name, p in named:
                yield name, p.detach()
        return
    from deepspeed.runtime.zero import GatheredParameters

    for bucket in _buckets(named, bucket_bytes):
        with GatheredParameters([p for _, p in bucket], modifier_rank=None):
            if receive:
                for name, p in bucket:
                    yield name, p.detach()


def _buckets(named: list[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, p in named:
        nbytes = zero3_numel(p) * p.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, p))
        size += nbytes
    if bucket:
        yield bucket


def is_finite(x: Optional[float]) -> bool:
    return x is not None and math.isfinite(x)
