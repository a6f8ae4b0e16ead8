"""Per-sample mask draws and the masked "views" that estimators score.

Determinism rule: sample i draws from its own CPU ``torch.Generator`` seeded with ``seeds[i]``, in an
order fixed by the estimator and by the sample's own content (real prompt length, completion length,
gen length, decode steps) -- never by the batch's padding width or its neighbours. The rollout side
and the learner therefore reproduce the same masks from a sample's seed in differently composed
batches, on any device (draws happen on the CPU; the masks then move to the model's device).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from stabledrl.common.seeding import generator
from stabledrl.common.types import SequenceBatch


@dataclass
class Views:
    """V masked views of each of B sequences (all on the CPU until scored).

    A view replaces the ``prompt`` and ``completion`` positions marked True by the mask token and
    reads log p(o_k | view) at the ``score`` positions. For block-diffusion families the completion
    mask applies to the noisy copy of the staircase layout; the clean copy stays clean.
    """

    prompt: torch.Tensor  # [B, V, P] bool
    completion: torch.Tensor  # [B, V, C] bool
    score: torch.Tensor  # [B, V, C] bool

    @classmethod
    def empty(cls, batch: SequenceBatch, num_views: int) -> "Views":
        b = batch.input_ids.shape[0]
        z = lambda w: torch.zeros(b, num_views, w, dtype=torch.bool)  # noqa: E731
        return cls(prompt=z(batch.prompt_width), completion=z(batch.completion_width), score=z(batch.completion_width))

    @property
    def num_views(self) -> int:
        return self.completion.shape[1]


@dataclass(frozen=True)
class RowInfo:
    """What a sample's draws may depend on: its own lengths, never the batch's padding."""

    prompt_positions: torch.Tensor  # [Lp] column indices of the real prompt tokens
    completion_length: int  # |o|: tokens up to and including the first EOS
    gen_length: int  # C: the canvas width


def row_infos(batch: SequenceBatch) -> list[RowInfo]:
    prompt_mask = batch.prompt_mask.cpu()
    lengths = batch.completion_mask.sum(dim=1).cpu().tolist()
    c = batch.completion_width
    return [RowInfo(prompt_mask[i].nonzero().flatten(), int(lengths[i]), c) for i in range(len(lengths))]


def sample_generators(seeds: torch.Tensor) -> list[torch.Generator]:
    """One CPU generator per sample, seeded from that sample's seed alone."""
    return [generator(int(s)) for s in torch.as_tensor(seeds).reshape(-1).tolist()]


def draw_bernoulli(g: torch.Generator, n: int, p: float) -> torch.Tensor:
    """[n] bool, each True with probability p; draws nothing when p == 0 or n == 0."""
    if p <= 0.0 or n == 0:
        return torch.zeros(n, dtype=torch.bool)
    return torch.rand(n, generator=g) < p


def draw_count(g: torch.Generator, n: int, t_min: float, t_max: float) -> int:
    """l ~ U{lo .. hi}, lo = max(floor(n t_min), 1), hi = min(floor(n t_max), n) (the SPG rule; with
    t in [0, 1] this is LLaDA's l ~ U{1 .. n}). Returns 0 for n == 0."""
    if n <= 0:
        return 0
    lo = max(int(n * t_min), 1)
    hi = max(lo, min(int(n * t_max), n))
    return int(torch.randint(lo, hi + 1, (1,), generator=g))


def draw_subset(g: torch.Generator, n: int, m: int) -> torch.Tensor:
    """[n] bool with exactly m True positions, uniformly among the C(n, m) subsets."""
    out = torch.zeros(n, dtype=torch.bool)
    if n > 0:
        out[torch.randperm(n, generator=g)[:m]] = True
    return out


def mask_prompt(views: Views, row: int, view: int, info: RowInfo, g: torch.Generator, p: float) -> None:
    """Mask each real prompt token of ``row`` in ``view`` with probability p (first real token first)."""
    noise = draw_bernoulli(g, len(info.prompt_positions), p)
    views.prompt[row, view, info.prompt_positions] = noise
