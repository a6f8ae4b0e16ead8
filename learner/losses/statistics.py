"""Loss metrics: a value with the way it combines (``Metric``), and the shared statistics of
ratios, advantages and normalised weights.

Every value is a detached 0-d tensor (no ``.item()``, no host sync) covering the rows of one
micro-batch. How the learner combines a metric over the micro-batches and ranks of one update,
and over the inner iterations of one step, is its ``Reduce`` (common/stats.py, where the reduced
floats travel on as ``Stat``s):

    mean    a statistic of the rows: weighted by the micro-batch's share of the step's rows
            (a row-weighted mean over the step), then the mean over inner iterations
    share   this micro-batch's share of a globally normalised total (the ``loss/*`` parts): summed
            over micro-batches and ranks, then the mean over inner iterations
    max     the largest value (min: the smallest), everywhere
    count   summed everywhere, inner iterations too (skipped updates)
    last    a running total: its value after the last inner iteration
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Union

import torch
from torch import Tensor

from stabledrl.common.stats import Reduce
from stabledrl.learner.losses.advantages import group_sum, groups_here

LOG_RATIO_LIMIT = 20.0  # exp(±20) bounds every ratio: a finite value instead of inf/NaN from noise


@dataclass(frozen=True)
class Metric:
    """A metric's value (a 0-d tensor, detached; a float once reduced) and how it combines."""

    value: Union[Tensor, float]
    reduce: Reduce = Reduce.MEAN

    @classmethod
    def mean(cls, x: Tensor) -> "Metric":
        return cls(x.detach(), Reduce.MEAN)

    @classmethod
    def share(cls, x: Tensor) -> "Metric":
        return cls(x.detach(), Reduce.SHARE)

    @classmethod
    def max(cls, x: Tensor) -> "Metric":
        return cls(x.detach(), Reduce.MAX)

    @classmethod
    def min(cls, x: Tensor) -> "Metric":
        return cls(x.detach(), Reduce.MIN)


class LossOutput(NamedTuple):
    """What a loss returns: the micro-batch's share of the step loss (differentiable) and its metrics."""

    loss: Tensor
    metrics: dict[str, Metric]


def ratio_from_log(log_ratio: Tensor) -> Tensor:
    """exp(log ρ) with log ρ clamped to ±20 (gradient is zero only beyond e^20, as in verl)."""
    return torch.exp(log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))


def masked_mean(x: Tensor, valid: Tensor) -> Tensor:
    v = valid.to(x.dtype)
    return (x * v).sum() / v.sum().clamp(min=1.0)


def masked_std(x: Tensor, valid: Tensor) -> Tensor:
    mean = masked_mean(x, valid)
    return masked_mean((x - mean).square(), valid).sqrt()


def masked_max(x: Tensor, valid: Tensor) -> Tensor:
    """Max over valid entries; 0 when none is valid."""
    lowest = torch.finfo(x.dtype).min
    top = x.masked_fill(~valid, lowest).amax()
    return torch.where(valid.any(), top, torch.zeros_like(top))


def masked_min(x: Tensor, valid: Tensor) -> Tensor:
    return -masked_max(-x, valid)


def ratio_metrics(log_ratio: Tensor, valid: Tensor) -> dict[str, Metric]:
    """ratio/{mean,max,std} and log_ratio/{mean,min,max,std} over the valid units."""
    log_ratio = log_ratio.detach().float()
    ratio = ratio_from_log(log_ratio)
    return {
        "ratio/mean": Metric.mean(masked_mean(ratio, valid)),
        "ratio/max": Metric.max(masked_max(ratio, valid)),
        "ratio/std": Metric.mean(masked_std(ratio, valid)),
        "log_ratio/mean": Metric.mean(masked_mean(log_ratio, valid)),
        "log_ratio/min": Metric.min(masked_min(log_ratio, valid)),
        "log_ratio/max": Metric.max(masked_max(log_ratio, valid)),
        "log_ratio/std": Metric.mean(masked_std(log_ratio, valid)),
    }


def advantage_metrics(advantages: Tensor) -> dict[str, Metric]:
    """advantage/{mean,std,abs_mean,max,min} and the fraction of exactly-zero advantages
    (rows of degenerate groups, which carry no policy gradient)."""
    a = advantages.detach().float()
    valid = torch.ones_like(a, dtype=torch.bool)
    return {
        "advantage/mean": Metric.mean(masked_mean(a, valid)),
        "advantage/std": Metric.mean(masked_std(a, valid)),
        "advantage/abs_mean": Metric.mean(masked_mean(a.abs(), valid)),
        "advantage/max": Metric.max(masked_max(a, valid)),
        "advantage/min": Metric.min(masked_min(a, valid)),
        "advantage/zero_frac": Metric.mean(masked_mean((a == 0).float(), valid)),
    }


def ess_metrics(weights: Tensor, same: Tensor, prefix: str = "ess") -> dict[str, Metric]:
    """Effective sample size of self-normalised weights (Σ_{group} w̃ = 1).

    Per group ESS_g = 1 / Σ_{i∈g} w̃_i² ∈ [1, G]; ``{prefix}/mean`` is its mean over the groups here,
    ``{prefix}/frac`` the mean of ESS_g / G_g ∈ (0, 1] (1 = uniform weights, 1/G = one sample wins).
    """
    w = weights.detach().float()
    size = same.sum(dim=1).float()  # [B] G of each row's group
    ess = 1.0 / group_sum(w.square(), same)  # [B] ESS of each row's group
    n_groups = groups_here(same)
    return {
        f"{prefix}/mean": Metric.mean((ess / size).sum() / n_groups),
        f"{prefix}/frac": Metric.mean((ess / size.square()).sum() / n_groups),
        f"{prefix}/weight_max": Metric.max(w.amax()),
    }
