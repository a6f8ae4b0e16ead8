"""Group-relative advantages and the per-group reductions the group-coupled losses need.

Group reductions inside a loss use the [B, B] same-group matrix rather than ``torch.unique`` or
``scatter`` into ``max(group_index) + 1`` slots: both of those need the number of groups on the
host (a device sync). B is a micro-batch, so B² booleans cost nothing, and group ids may be any
integers in any order.
"""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor


def same_group(group_index: Tensor) -> Tensor:
    """[B, B] bool: True where rows i and j belong to one group."""
    return group_index[:, None] == group_index[None, :]


def group_sum(x: Tensor, same: Tensor) -> Tensor:
    """[B] Σ_{j in group(i)} x_j, for every row i."""
    return same.to(x.dtype) @ x


def group_softmax(logits: Tensor, same: Tensor) -> Tensor:
    """[B] exp(x_i) / Σ_{j in group(i)} exp(x_j), stabilised by the group's max."""
    neg_inf = torch.finfo(logits.dtype).min
    group_max = logits[None, :].expand_as(same).masked_fill(~same, neg_inf).amax(dim=1)
    e = torch.exp(logits - group_max)
    return e / group_sum(e, same)


def groups_here(same: Tensor) -> Tensor:
    """0-d: the number of distinct groups among the rows, Σ_i 1/|group(i)| (no host sync)."""
    return (1.0 / same.sum(dim=1).float()).sum()


def group_advantages(
    rewards: Tensor, group_index: Tensor, scale: Literal["std", "population_std", "none"] = "std", eps: float = 1e-4
) -> Tensor:
    """[B] A_i = r_i − mean_{group(i)} r, divided by (std_{group(i)} r + eps) when scale="std".

    GRPO's group baseline (arXiv 2402.03300); scale="none" is Dr. GRPO's choice (arXiv 2503.20783)
    and what d1 and the StableDRL release train with (neither divides by the std). The std is the
    unbiased one (G − 1 in the denominator), as TRL and d1 compute it; eps = 1e-4 is TRL's.
    scale="population_std" is dLLM-RL's z-score (its reward/rl_reward.py ``z_score_normalize``): the
    population std (G in the denominator) and no eps, so its advantages are sqrt(G / (G − 1)) times
    TRL's (3.2% larger at G = 16).

    Degenerate groups: when every reward of a group is equal (all right, all wrong, or G = 1) every
    A_i is exactly 0.0, with either scale. This is enforced, not left to arithmetic: a group mean
    computed as Σr/n is not exactly r in floating point (16 rewards of 0.1 sum to 1.6000000238),
    and dividing that rounding by (0 + eps) would turn it into an advantage of order 1. So the mean
    and the std are computed in float64 and a group whose largest and smallest rewards are equal
    gets A = 0 outright. Such a group then contributes no policy gradient to any loss here:
    grpo/spg/dppo/drpo/stabledrl multiply by A = 0, and wd1's two softmax weights are both uniform so
    its terms cancel. Only dipod's ELBO regulariser still acts on it. Keep such groups in the batch
    (they count in num_groups / num_samples / num_tokens) or filter them before counting; either way
    the counts must match.

    Uses torch.unique: meant for batch assembly, not for the inside of a loss.
    """
    if rewards.shape != group_index.shape or rewards.dim() != 1:
        raise ValueError(
            f"rewards and group_index must both be [B], got {tuple(rewards.shape)} and {tuple(group_index.shape)}"
        )
    if scale not in ("std", "population_std", "none"):
        raise ValueError(f"unknown advantage scale {scale!r}; valid: std, population_std, none")
    r = rewards.double()
    _, inverse, counts = torch.unique(group_index, return_inverse=True, return_counts=True)
    n = counts.double()
    mean = torch.zeros_like(n).index_add_(0, inverse, r) / n
    top = torch.full_like(n, float("-inf")).scatter_reduce_(0, inverse, r, reduce="amax")
    bottom = torch.full_like(n, float("inf")).scatter_reduce_(0, inverse, r, reduce="amin")
    constant = (top == bottom)[inverse]  # [B] the row's group has one reward value
    centred = torch.where(constant, torch.zeros_like(r), r - mean[inverse])
    if scale == "std":
        var = torch.zeros_like(n).index_add_(0, inverse, centred.square()) / (n - 1).clamp(min=1)
        centred = centred / (var.sqrt()[inverse] + eps)
    elif scale == "population_std":  # a constant group is 0 already; its std (0) is never divided by
        var = torch.zeros_like(n).index_add_(0, inverse, centred.square()) / n
        centred = torch.where(constant, centred, centred / var.sqrt()[inverse].clamp(min=torch.finfo(r.dtype).tiny))
    return centred.float()
