"""One learner rank's share of an RL step, cut into micro-batches with the step's global counts.

The coordinator hands every rank whole groups. A rank collates them, computes group-relative
advantages (each group lies on one rank, so a rank has everything ``group_advantages`` needs),
all-reduces its counts so that every loss term is divided by the *step's* totals (the rule of
``learner/losses/inputs.py``), and cuts its rows into micro-batches: by whole groups when the loss
couples a group's rows (stabledrl, wd1), by rows otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

import torch
import torch.distributed as dist
from jaxtyping import Float, Int
from torch import Tensor

from stabledrl.common.estimators import learner_seeds
from stabledrl.common.estimators.base import PER_ITERATION_SEEDS, per_iteration_index
from stabledrl.common.types import Group, SequenceBatch, collate_samples
from stabledrl.learner.losses import group_advantages, local_counts


@dataclass(frozen=True)
class LossPart:
    """Rows of a forward that take one loss with their own counts (``learner.micro_batches_per_forward``)."""

    rows: slice
    counts: dict[str, Float[Tensor, ""]]
    share: float


@dataclass
class MicroBatch:
    """Rows of one learner forward; ``counts`` are the whole step's (all ranks, all micro-batches).

    A forward of several micro-batches (``parts``) takes each one's loss with that micro-batch's
    own counts and sums them: the update is the one of separate forwards."""

    batch: SequenceBatch  # padded rows, ``advantages`` set (the SPG sandwich reads their sign)
    mask_seeds: Int[Tensor, " b"]  # the seeds the rollout's behaviour estimate used
    seeds: Int[Tensor, " b"]  # this inner iteration's estimator seeds (learner_seeds)
    behaviour_logp: Float[Tensor, " b"]
    behaviour_token_logp: Optional[Float[Tensor, "b C"]]  # where the estimator defines it
    group_index: Int[Tensor, " b"]  # unique per group over the whole step
    completion_length: Int[Tensor, " b"]
    counts: dict[str, Float[Tensor, ""]]  # num_groups, num_samples, num_tokens the loss divides by (the step's)
    share: float  # b / num_samples: this micro-batch's weight in row-averaged metrics
    parts: tuple[LossPart, ...] = ()  # () : one loss over every row, with ``counts`` and ``share``
    unit: int = 0  # the rank-wide index of its first micro-batch (a loss part is one; per_iteration's masks)
    units: int = 1  # micro-batches this rank trains in one update

    def loss_parts(self) -> tuple[LossPart, ...]:
        return self.parts or (LossPart(slice(None), self.counts, self.share),)

    def for_iteration(self, masks: str, inner_iteration: int, iterations: Optional[int] = None) -> "MicroBatch":
        """This micro-batch with inner iteration ``inner_iteration``'s estimator seeds. Under
        ``per_iteration`` (``iterations``: μ) each loss part (a micro-batch of d1's) reads mask
        ``per_iteration_index`` of its μ, as d1's counters pick it, drawn from a seed of (its rows'
        mask seeds, that index); part j's rows carry j·PER_ITERATION_SEEDS + its seed, so that two
        parts never read as one stream even when their seeds coincide (the estimator draws from the
        seed modulo PER_ITERATION_SEEDS)."""
        if masks != "per_iteration":
            return replace(self, seeds=learner_seeds(self.mask_seeds, masks, inner_iteration))
        if iterations is None:
            raise ValueError("per_iteration masks need the step's inner iterations (iterations=)")
        seeds = torch.cat([
            learner_seeds(self.mask_seeds[part.rows], masks,
                          per_iteration_index(inner_iteration, self.unit + j, self.units, iterations))
            + j * PER_ITERATION_SEEDS
            for j, part in enumerate(self.loss_parts())])
        return replace(self, seeds=seeds)


def global_counts(groups: Sequence[Group]) -> dict[str, Tensor]:
    """This rank's counts summed over the learner group (one all-reduce; local outside a group)."""
    rows = [s for g in groups for s in g.samples]
    group_index = torch.tensor([i for i, g in enumerate(groups) for _ in g.samples])
    lengths = torch.tensor([s.completion_length for s in rows])
    counts = local_counts(group_index, lengths)
    packed = torch.stack([counts["num_groups"], counts["num_samples"], counts["num_tokens"]]).double()
    if dist.is_initialized():
        device = (
            torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
        )
        packed = packed.to(device)
        dist.all_reduce(packed, op=dist.ReduceOp.SUM)
    packed = packed.cpu().float()
    return {"num_groups": packed[0], "num_samples": packed[1], "num_tokens": packed[2]}


def micro_batches(
    groups: Sequence[Group],
    *,
    group_offset: int,
    pad_token_id: int,
    advantage_scale: str,
    micro_batch_size: int,
    whole_groups: bool,
    counts: dict[str, Tensor],
    normalisation: str = "step",
    world_size: int = 1,
    per_forward: int = 1,
) -> list[MicroBatch]:
    """Micro-batches of this rank's ``groups`` (group ``k`` here is group ``group_offset + k`` of the step).

    Groups are taken in order of prompt length, so a micro-batch holds prompts of similar length
    and little left padding is computed (the rows of one group share their prompt: a micro-batch
    of whole groups of one prompt length has no padding at all, and its forward then needs no
    attention mask, common/estimators/scoring.py). The order changes no loss term: each is
    normalised by the step's counts and the update sums them.

    ``normalisation`` (``learner.loss_normalisation``): "step" gives every micro-batch the step's
    counts. "micro_batch" gives micro-batch m of this rank the counts of its own rows times
    ``world_size`` × (micro-batches on this rank), so that the update is d1's: a token mean inside
    each micro-batch, then the mean over the rank's micro-batches (gradient accumulation) and over
    ranks (data-parallel averaging). A token then weighs 1/(tokens of its micro-batch), which
    depends on how the batch was cut (the order above included).

    ``per_forward`` (``learner.micro_batches_per_forward``) > 1 puts that many consecutive
    micro-batches into one forward: rows collated together (left padding where prompt lengths
    differ), each micro-batch's loss taken with its own counts (``LossPart``), the losses summed.
    The update is unchanged (to rounding); a forward of 12 rows instead of 6 keeps the GPU busier."""
    order = sorted(range(len(groups)), key=lambda k: (len(groups[k].samples[0].prompt_ids), k))
    rows = [s for k in order for s in groups[k].samples]
    group_index = torch.tensor([group_offset + k for k in order for _ in groups[k].samples])
    rewards = torch.tensor([s.reward for s in rows], dtype=torch.float32)
    advantages = group_advantages(rewards, group_index, advantage_scale)  # [N]
    cuts = _cuts([len(groups[k].samples) for k in order], micro_batch_size, whole_groups)
    if normalisation not in ("step", "micro_batch"):
        raise ValueError(f"unknown loss normalisation {normalisation!r}; valid: step, micro_batch")
    if per_forward < 1:
        raise ValueError(f"learner.micro_batches_per_forward must be at least 1, got {per_forward}")
    num_samples = float(counts["num_samples"])

    def unit_counts(lo: int, hi: int) -> dict[str, Tensor]:
        if normalisation == "step":
            return counts
        own = local_counts(group_index[lo:hi], torch.tensor([s.completion_length for s in rows[lo:hi]]))
        return {k: v * float(world_size * len(cuts)) for k, v in own.items()}

    out = []
    for j in range(0, len(cuts), per_forward):
        units = cuts[j : j + per_forward]
        lo, hi = units[0][0], units[-1][1]
        part = rows[lo:hi]
        mb_counts = unit_counts(lo, hi) if len(units) == 1 else counts
        parts = () if len(units) == 1 else tuple(
            LossPart(slice(a - lo, b - lo), unit_counts(a, b), (b - a) / num_samples) for a, b in units)
        adv = advantages[lo:hi]
        token_values = [s.behaviour_token_logp for s in part]
        out.append(MicroBatch(
            batch=collate_samples(part, pad_token_id, advantages=adv),
            mask_seeds=torch.tensor([s.mask_seed for s in part], dtype=torch.long),
            seeds=torch.tensor([s.mask_seed for s in part], dtype=torch.long),
            behaviour_logp=torch.tensor([s.behaviour_logp for s in part], dtype=torch.float32),
            behaviour_token_logp=None if any(t is None for t in token_values) else torch.stack(token_values).float(),
            group_index=group_index[lo:hi],
            completion_length=torch.tensor([s.completion_length for s in part]),
            counts=mb_counts,
            share=(hi - lo) / num_samples,
            parts=parts,
            unit=j,
            units=len(cuts),
        ))
    return out


def micro_batch_count(group_sizes: list[int], micro_batch_size: int, whole_groups: bool) -> int:
    """How many micro-batches ``micro_batches`` cuts groups of these sizes into (a rank's micro-batches
    per update: ``MicroBatch.units``)."""
    return len(_cuts(group_sizes, micro_batch_size, whole_groups))


def _cuts(group_sizes: list[int], micro_batch_size: int, whole_groups: bool) -> list[tuple[int, int]]:
    """[lo, hi) row ranges: at most ``micro_batch_size`` rows each, or whole groups (at least one)."""
    total = sum(group_sizes)
    if not whole_groups:
        return [(lo, min(lo + micro_batch_size, total)) for lo in range(0, total, micro_batch_size)]
    cuts, lo, hi = [], 0, 0
    for size in group_sizes:
        if hi > lo and hi - lo + size > micro_batch_size:
            cuts.append((lo, hi))
            lo = hi
        hi += size
    if hi > lo:
        cuts.append((lo, hi))
    return cuts
