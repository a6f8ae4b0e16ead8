"""The estimator contract, its registry and the seed rule shared by the rollout side and the learner.

An estimator is ``estimate(policy, batch, seeds, cfg) -> LogLikelihood``: deterministic given the
per-sample ``seeds`` (every draw comes from a generator seeded by the sample's own seed, in an order
that depends only on that sample), differentiable when grad is enabled.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Optional, Sequence

import torch

from stabledrl.common.config.estimator import UNIFORM_NOISE_ESTIMATORS
from stabledrl.common.registry import Registry
from stabledrl.common.seeding import derive_seed

if TYPE_CHECKING:
    from stabledrl.common.models.base import DiffusionPolicy
    from stabledrl.common.types import SequenceBatch


@dataclass
class LogLikelihood:
    """What an estimator returns for a batch of B sequences with completion width C.

    ``sequence`` is the per-sequence value the losses use. ``token`` is set by the estimators that
    define a per-token value (mean_field, coupled, trajectory); ``token_mask`` marks the tokens that
    count (the completion up to and including its first EOS), and ``sequence`` is then
    ``(token * token_mask).sum(-1)``. ``elbo`` is set where the value the loss differentiates is not
    the ELBO that importance ratios compare (spg_sandwich); ratio code reads ``ratio_value``.
    """

    sequence: torch.Tensor  # [B] float32
    token: Optional[torch.Tensor] = None  # [B, C] float32
    token_mask: Optional[torch.Tensor] = None  # [B, C] bool
    elbo: Optional[torch.Tensor] = None  # [B] float32, spg_sandwich only
    forwards: int = 0  # masked views scored per sample (model evaluations, before batching)
    diagnostics: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def ratio_value(self) -> torch.Tensor:
        """[B] the value log-ratios compare: the ELBO where it differs from ``sequence``."""
        return self.sequence if self.elbo is None else self.elbo

    def detach(self) -> "LogLikelihood":
        def d(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            return None if t is None else t.detach()

        return LogLikelihood(
            sequence=self.sequence.detach(),
            token=d(self.token),
            token_mask=self.token_mask,
            elbo=d(self.elbo),
            forwards=self.forwards,
            diagnostics={k: v.detach() for k, v in self.diagnostics.items()},
        )


Estimator = Callable[["DiffusionPolicy", "SequenceBatch", torch.Tensor, Any], LogLikelihood]

ESTIMATORS: Registry[Estimator] = Registry("estimator")


def get_estimator(name: str) -> Estimator:
    """The estimator registered as ``name`` (a KeyError lists the valid names)."""
    return ESTIMATORS.get(name)


def estimate(
    policy: "DiffusionPolicy", batch: "SequenceBatch", seeds: torch.Tensor | Sequence[int], cfg: Any
) -> LogLikelihood:
    """Run the estimator that ``cfg.name`` selects (one that corrupts as the policy's family does)."""
    if (policy.spec.noise == "uniform") != (cfg.name in UNIFORM_NOISE_ESTIMATORS):
        raise ValueError(
            f"estimator {cfg.name!r} does not corrupt with the {policy.spec.noise!r} noise of {policy.spec.name}; "
            f"uniform-noise families take {', '.join(UNIFORM_NOISE_ESTIMATORS)}, [MASK] families every other one"
        )
    return get_estimator(cfg.name)(policy, batch, as_seeds(seeds, batch.input_ids.shape[0]), cfg)


# d1 draws the seeds of its per-iteration masks with torch.randint(0, 2**12): its masks per batch shape are
# these 4,096 (accelerate's set_seed, which d1 seeds them with, also takes no seed of 2**32 or more)
PER_ITERATION_SEEDS = 2**12


def per_iteration_index(inner_iteration: int, unit: int, units: int, iterations: int) -> int:
    """Which of its ``iterations`` (μ) masks micro-batch ``unit`` (of the ``units`` a learner rank
    trains in one update) reads at inner iteration k under ``per_iteration``: (units·k + unit + 1)
    mod μ, as d1's counters make it (TRL counts micro-steps from 1 and d1 reads that count mod μ).
    With d1's 2 micro-batches a update and μ = 12, each micro-batch meets 6 of its 12 masks, each twice."""
    return (units * inner_iteration + unit + 1) % iterations


def distinct_iteration_masks(units: int, iterations: int) -> int:
    """How many different masks one micro-batch meets over the μ iterations (per_iteration_index):
    the old policy and the reference are scored once under each."""
    return iterations // math.gcd(units, iterations)


def learner_seeds(
    mask_seeds: torch.Tensor | Sequence[int],
    masks: Literal["shared", "independent", "per_iteration"],
    inner_iteration: int = 0,
) -> torch.Tensor:
    """[B] int64 seeds the learner passes to the estimator for samples carrying ``mask_seeds``.

    ``shared``: the behaviour estimate's own seeds, so both sides draw identical masks and the
    log-ratio is exactly 0 at theta = mu (common random numbers: coupled-GRPO, FPO).
    ``independent``: a fresh seed per (mask_seed, inner_iteration), as the released StableDRL code
    draws fresh masks at every update; still a pure function of the sample, so a re-run or another
    learner rank reproduces it.
    ``per_iteration`` (d1): the rows given are one micro-batch, and every row gets its seed for this
    iteration: one value in [0, PER_ITERATION_SEEDS) derived from (its rows' mask seeds, iteration),
    from which the mean_field estimator draws the micro-batch's mask as one stream, as d1 does. The
    learner scores the old and the reference policy under it too (learner/worker.py).
    """
    seeds = torch.as_tensor(mask_seeds, dtype=torch.long).reshape(-1)
    if masks == "shared":
        return seeds.clone()
    if masks == "independent":
        return torch.tensor(
            [derive_seed(int(s), "learner", int(inner_iteration)) for s in seeds.tolist()], dtype=torch.long
        )
    if masks == "per_iteration":
        seed = derive_seed("per_iteration", tuple(seeds.tolist()), int(inner_iteration)) % PER_ITERATION_SEEDS
        return torch.full_like(seeds, seed)
    raise ValueError(f"masks must be 'shared', 'independent' or 'per_iteration', got {masks!r}")


def as_seeds(seeds: torch.Tensor | Sequence[int], batch_size: int) -> torch.Tensor:
    """Validate per-sample seeds: a [B] int64 CPU tensor."""
    seeds = torch.as_tensor(seeds, dtype=torch.long).reshape(-1).cpu()
    if seeds.numel() != batch_size:
        raise ValueError(f"need one seed per sample: got {seeds.numel()} seeds for a batch of {batch_size}")
    return seeds
