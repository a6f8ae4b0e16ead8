"""LoRA on the learner: adapters injected with ``peft``, and the policy's weights read back in
the policy's own parameter names, with every adapted matrix merged.

    W' = W + s·B·A,   s = alpha / rank,   A [rank, in], B [out, rank]

``add_adapters`` wraps each target Linear of ``policy.model`` in a peft LoRA layer (its weight
moves to ``<module>.base_layer.weight``, the adapters to ``<module>.lora_A.default.weight`` and
``<module>.lora_B.default.weight``) and freezes everything but A and B. The forward stays the
policy's, so the estimators and losses run unchanged.

The rollout workers never see peft. With ``learner.lora.push: adapters`` (the default) a weight
push carries A and B of every adapted module (``<module>.lora_A``, ``<module>.lora_B``; the frozen
W is not even gathered: at LLaDA-8B, r 128, 0.67 GB on the wire instead of 13 GB) and each worker
holds them unmerged (common/models/lora.py), computing peft's expression with the same
operations: the rollout policy is the learner's. With ``push: merged`` the push carries
W' = W + s·B·A rounded once to W's dtype (``merged_weight``) under the plain policy's name
(``<module>.weight``) and the worker samples a dense model, without the adapters' matmuls but
with every adapted matrix rounded: in bf16 an update under half an ulp of W is lost. Every other
weight is frozen and equal to what the worker loaded from ``model.path``. The export writes the
merged model (``merged_weight`` again) and the adapters themselves as a PEFT adapter folder.
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn

from stabledrl.common.config.learner import LoraConfig
from stabledrl.common.models.lora import target_paths
from stabledrl.common.transport.adapters import adapter_names, merged_weight
from stabledrl.learner.zero import zero3_numel

ADAPTER = "default"  # peft's adapter name
INIT_SEED = 0  # A is drawn from this seed on every rank, so that all ranks start from the same adapters


@dataclass(frozen=True)
class Adapted:
    """One adapted Linear: its path in the policy and its three parameters."""

    path: str  # e.g. "model.model.layers.0.self_attn.q_proj"
    base: nn.Parameter  # W [out, in], frozen
    lora_A: nn.Parameter  # [rank, in]
    lora_B: nn.Parameter  # [out, rank]
    scale: float  # alpha / rank

    @property
    def weight_name(self) -> str:
        """The weight's name in the plain policy (what a rollout worker and the export use)."""
        return f"{self.path}.weight"

    def parameters(self) -> list[nn.Parameter]:
        return [self.base, self.lora_A, self.lora_B]


def add_adapters(policy: nn.Module, cfg: LoraConfig) -> list[Adapted]:
    """Inject LoRA into ``policy.model`` in place (A ~ peft's Kaiming init from ``INIT_SEED``,
    B = 0, so the policy computes exactly what it did) and freeze every other parameter.
    Every target (``cfg.resolved_targets()``) must match at least one Linear module."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import inject_adapter_in_model

    # LLaDA's own names (module_names: llada) become the project's; the rule rollout workers follow too
    targets = target_paths(policy.model, cfg.resolved_targets())
    peft_cfg = PeftLoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=targets,
                              bias="none")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(INIT_SEED)
        inject_adapter_in_model(peft_cfg, policy.model, adapter_name=ADAPTER)
    for name, p in policy.named_parameters():
        p.requires_grad_(".lora_A." in name or ".lora_B." in name)
    return adapted_modules(policy)


@contextmanager
def adapters_off(policy: nn.Module) -> Iterator[None]:
    """The frozen base model, in place: every peft LoRA layer of ``policy`` computes its base Linear
    only, until the block exits. With the base frozen this is the initial policy, GRPO's KL
    reference, without a second copy of the model (d1 on TRL takes its reference the same way).
    peft's ``enable_adapters(False)`` would also flip the adapters' ``requires_grad``, under
    which DeepSpeed registered its gradient hooks; only the flag its forward reads is set here."""
    from peft.tuners.lora import LoraLayer

    layers = [m for m in policy.modules() if isinstance(m, LoraLayer)]
    if not layers:
        raise ValueError("adapters_off needs a policy with LoRA adapters (learner.lora)")
    was = [m._disable_adapters for m in layers]
    for m in layers:
        m._disable_adapters = True
    try:
        yield
    finally:
        for m, w in zip(layers, was):
            m._disable_adapters = w


def adapted_modules(policy: nn.Module) -> list[Adapted]:
    """Every peft LoRA Linear of ``policy``, in module order."""
    from peft.tuners.lora import LoraLayer

    out = []
    for path, module in policy.named_modules():
        if isinstance(module, LoraLayer) and ADAPTER in module.lora_A:
            out.append(Adapted(path, module.get_base_layer().weight, module.lora_A[ADAPTER].weight,
                               module.lora_B[ADAPTER].weight, float(module.scaling[ADAPTER])))
    return out


def adapter_named_parameters(adapted: list[Adapted], *, zero_stage: int, bucket_bytes: int,
                             receive: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of every adapted module's A and B (``<module>.lora_A``, ``.lora_B``: the
    adapter push), gathered like ``plain_named_parameters`` (the frozen W is never gathered)."""
    units = [(name, [p], None) for a in adapted for name, p in zip(adapter_names(a.path), (a.lora_A, a.lora_B))]
    for bucket in _buckets(units, bucket_bytes):
        with _gathered([p for _, params, _ in bucket for p in params], zero_stage):
            if not receive:
                continue
            for name, params, _ in bucket:
                yield name, params[0].detach()


def plain_named_parameters(policy: nn.Module, adapted: list[Adapted], *, zero_stage: int, bucket_bytes: int,
                           receive: bool, only_adapted: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` in the plain policy's names: every adapted module's merged weight, and
    (unless ``only_adapted``) every other parameter as it is. Collective under ZeRO-3 like
    ``stabledrl.learner.zero.gathered_named_parameters``: every rank iterates to the end, ``receive`` says
    where the tensors are yielded, parameters are gathered ``bucket_bytes`` at a time, and a
    yielded tensor is valid until the next item is requested."""
    units: list[tuple[str, list[nn.Parameter], Adapted | None]] = [(a.weight_name, a.parameters(), a) for a in adapted]
    if not only_adapted:
        owned = {id(p) for a in adapted for p in a.parameters()}
        units += [(plain_name(name), [p], None) for name, p in policy.named_parameters() if id(p) not in owned]
    for bucket in _buckets(units, bucket_bytes):
        with _gathered([p for _, params, _ in bucket for p in params], zero_stage):
            if not receive:
                continue
            for name, params, a in bucket:
                yield name, (merged_weight(a.base, a.lora_A, a.lora_B, a.scale) if a else params[0].detach())


def plain_name(name: str) -> str:
    """A parameter's name in the plain policy: an adapted module's bias sits under peft's base_layer."""
    return name.replace(".base_layer.", ".")


def _gathered(params: list[nn.Parameter], zero_stage: int):
    if zero_stage < 3:
        return nullcontext()
    from deepspeed.runtime.zero import GatheredParameters

    return GatheredParameters(params, modifier_rank=None)


def _buckets(units: list, bucket_bytes: int) -> Iterator[list]:
    bucket, size = [], 0
    for unit in units:
        nbytes = sum(zero3_numel(p) * p.element_size() for p in unit[1])
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append(unit)
        size += nbytes
    if bucket:
        yield bucket
