"""What every loss reads: ``LossInputs``, and the one rule for normalising a loss globally.

Global normalisation (the rule every loss follows)
--------------------------------------------------
One optimizer step sees a batch split over R data-parallel ranks and, on each rank, over several
micro-batches. A loss returns *its micro-batch's share of the batch loss*: a sum over the rows it
holds, divided by a count taken over the **whole step** (all ranks, all micro-batches):

    per group     (stabledrl, wd1):          Σ_{groups g here}  L_g   / num_groups
    per sample    (dipod's ELBO term):        Σ_{samples i here} L_i   / num_samples
    per token     (grpo, spg, dppo, drpo):    Σ_{tokens here}    L_ik  / num_tokens

so summing the returned values over every micro-batch of every rank gives exactly the loss of one
batch holding everything (``tests/unit/learner/test_losses_microbatch.py`` proves it for every loss).
A mean taken per micro-batch would weight a token by 1/(tokens in *its* micro-batch) instead and
change with how the batch was cut; that is d1's (TRL's) rule, and ``learner.loss_normalisation:
micro_batch`` reproduces it by handing each micro-batch its own counts scaled by the number of
micro-batches and ranks (learner/rl_batch.py), with the losses unchanged. The default is OpenRLHF's
``aggregate_loss`` rule: the normalisers are the step's totals, summed over micro-batches and
all-reduced over ranks *before* the first forward. The engine then undoes its own averaging:
DeepSpeed divides each micro-batch loss by the gradient-accumulation steps and averages gradients
over ranks, so the learner scales each returned loss by ``world_size × grad_accum_steps`` before
``backward`` (or, equivalently, passes pre-divided normalisers as OpenRLHF does). The losses
themselves never talk to other ranks.

Sequence forms count a sequence as |o_i| tokens sharing its value (weight ``completion_length``
over ``num_tokens``), which matches the per-token form exactly when every token of a sequence
shares one ratio. Sequence values are expected length-normalised (the per-masked-token mean that
the StableDRL / SPG estimators return); a summed estimate also works, its ratios are just larger.

Metrics are statistics of the rows in *this* micro-batch, detached; the learner combines them over
micro-batches by mean (keys ending in ``max``/``min`` by max/min; ``loss/*`` shares by sum).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import NamedTuple, Optional, Sequence, Union

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

Count = Union[float, Float[Tensor, ""]]  # a python number or a 0-d tensor (e.g. the result of an all-reduce)


@dataclass
class LossInputs:
    """Per-sample estimates and the step's global counts. B = rows here, T = completion width."""

    logp: Float[Tensor, " B"]  # sequence estimate under θ (differentiable)
    behaviour_logp: Float[Tensor, " B"]  # the same estimator under μ, computed by the rollout at version v_b
    advantages: Float[Tensor, " B"]  # A_i (group_advantages)
    group_index: Int[Tensor, " B"]  # rows with equal values belong to one group (any ids, any order)
    completion_length: Int[Tensor, " B"]  # |o_i|: completion tokens up to and including the first EOS
    num_groups: Count  # groups in the whole optimizer step (all ranks and micro-batches)
    num_samples: Count  # samples in the whole step
    num_tokens: Count  # Σ_i |o_i| over the whole step
    token_logp: Optional[Float[Tensor, "B T"]] = None  # per-token estimate under θ, where the estimator defines it
    token_mask: Optional[Bool[Tensor, "B T"]] = None  # True on the |o_i| completion tokens
    behaviour_token_logp: Optional[Float[Tensor, "B T"]] = None  # per-token estimate under μ
    ref_logp: Optional[Float[Tensor, " B"]] = None  # estimate under the reference policy (GRPO's KL)
    ref_token_logp: Optional[Float[Tensor, "B T"]] = None
    elbo: Optional[Float[Tensor, " B"]] = None  # on-policy ELBO under θ (DiPOD); may be the same tensor as logp

    def __post_init__(self) -> None:
        b = self.logp.shape
        if self.logp.dim() != 1:
            raise ValueError(f"logp must be [B], got shape {tuple(b)}")
        for name in ("behaviour_logp", "advantages", "group_index", "completion_length", "ref_logp", "elbo"):
            t = getattr(self, name)
            if t is not None and t.shape != b:
                raise ValueError(f"{name} must have shape {tuple(b)} like logp, got {tuple(t.shape)}")
        token = [self.token_logp, self.token_mask]
        if (token[0] is None) != (token[1] is None):
            raise ValueError("token_logp and token_mask come together (both or neither)")
        if self.token_logp is not None:
            bt = self.token_logp.shape
            if self.token_logp.dim() != 2 or bt[0] != b[0]:
                raise ValueError(f"token_logp must be [B, T] with B={b[0]}, got {tuple(bt)}")
            for name in ("token_mask", "behaviour_token_logp", "ref_token_logp"):
                t = getattr(self, name)
                if t is not None and t.shape != bt:
                    raise ValueError(f"{name} must have shape {tuple(bt)} like token_logp, got {tuple(t.shape)}")

    @property
    def has_token_values(self) -> bool:
        """True when both θ and μ per-token values are present (token-form ratios are possible)."""
        return self.token_logp is not None and self.behaviour_token_logp is not None

    def select(self, rows: Union[Sequence[int], Tensor]) -> "LossInputs":
        """The inputs of a micro-batch: the given rows, the same global counts."""
        idx = torch.as_tensor(rows, dtype=torch.long, device=self.logp.device)
        picked = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor) and v.dim() >= 1 and not f.name.startswith("num_"):
                picked[f.name] = v.index_select(0, idx.to(v.device))
        return replace(self, **picked)


class Units(NamedTuple):
    """The units a ratio-based loss sums over: tokens (U = T) or whole sequences (U = 1)."""

    logp: Float[Tensor, "B U"]  # under θ
    behaviour_logp: Float[Tensor, "B U"]  # under μ
    advantages: Float[Tensor, "B U"]  # A_i broadcast over the units of row i
    weight: Float[Tensor, "B U"]  # token mask (token form) or |o_i| (sequence form)
    ref_logp: Optional[Float[Tensor, "B U"]]
    level: str  # "token" or "sequence"


def units(inputs: LossInputs, level: str) -> Units:
    """Resolve ``level`` ("auto" | "token" | "sequence") to per-token or per-sequence units, float32."""
    if level == "auto":
        level = "token" if inputs.has_token_values else "sequence"
    if level == "token":
        if not inputs.has_token_values:
            raise ValueError("level='token' needs token_logp and behaviour_token_logp; this estimator gives none")
        mask = inputs.token_mask.float()
        ref = None if inputs.ref_token_logp is None else inputs.ref_token_logp.float()
        adv = inputs.advantages.float()[:, None].expand_as(mask)
        return Units(inputs.token_logp.float(), inputs.behaviour_token_logp.float(), adv, mask, ref, "token")
    if level == "sequence":
        ref = None if inputs.ref_logp is None else inputs.ref_logp.float()[:, None]
        return Units(
            inputs.logp.float()[:, None],
            inputs.behaviour_logp.float()[:, None],
            inputs.advantages.float()[:, None],
            inputs.completion_length.float()[:, None],
            ref,
            "sequence",
        )
    raise ValueError(f"unknown level {level!r}; valid: auto, token, sequence")


def local_counts(group_index: Int[Tensor, " B"], completion_length: Int[Tensor, " B"]) -> dict[str, Float[Tensor, ""]]:
    """num_groups / num_samples / num_tokens of the rows given: the global counts when these rows
    are the whole step, else the per-rank part to all-reduce. Uses torch.unique (a host sync):
    call it when the batch is built, never inside a loss."""
    return {
        "num_groups": torch.tensor(float(torch.unique(group_index).numel())),
        "num_samples": torch.tensor(float(completion_length.numel())),
        "num_tokens": completion_length.float().sum(),
    }
