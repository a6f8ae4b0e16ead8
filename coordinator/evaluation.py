"""Held-out evaluation spread over the rollout workers (``rollout/evaluate.py`` does the scoring).

The held-out rows are dealt out to the workers (row i to worker i mod N); each worker evaluates its slice
with its current weights and the run's sampler settings. Sample j of prompt i is seeded by
(eval seed, prompt id, j) alone, so the merged result does not depend on the number of workers,
and BEFORE and AFTER are a paired comparison. pass@k is recomputed from the merged per-prompt
counts (the unbiased estimator is a mean over prompts, so merging slices is exact).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from common.tasks import Row
from coordinator.actors import wait


@dataclass
class HeldOutResult:
    num_prompts: int
    samples_per_prompt: int
    pass_at: dict[int, float]
    mean_correctness: float
    version: int  # the weights version every worker held
    time_s: float

    @property
    def pass_at_1(self) -> float:
        return self.pass_at[1]

    @property
    def stderr(self) -> float:
        """Standard error of pass@1 over the prompts, sqrt(p (1 - p) / N): exact for one sample per
        prompt, an upper bound for more (a prompt's mean over n samples varies less than one sample)."""
        p = self.pass_at_1
        return math.sqrt(p * (1.0 - p) / max(self.num_prompts, 1))

    def metrics(self) -> dict[str, float]:
        out = {f"eval/pass@{k}": v for k, v in sorted(self.pass_at.items())}
        out.update({"eval/mean_correctness": self.mean_correctness, "eval/version": float(self.version),
                    "eval/time_s": self.time_s, "eval/prompts": float(self.num_prompts)})
        return out


def evaluate_held_out(workers: Sequence[Any], rows: Sequence[Row], samples_per_prompt: int, seed: int,
                      timeout_s: float, sampler: Optional[Any] = None) -> HeldOutResult:
    """Evaluate ``rows`` on the workers with ``sampler`` (None: each worker's own sampler config)."""
    from rollout.evaluate import pass_at_k

    slices = [list(rows[i :: len(workers)]) for i in range(len(workers))]
    calls = [(i, w.evaluate.remote(part, samples_per_prompt, seed, sampler))
             for i, (w, part) in enumerate(zip(workers, slices)) if part]
    answers = wait([ref for _, ref in calls], timeout_s, [f"rollout worker {i} (held-out evaluation)" for i, _ in calls])
    versions = {version for version, _ in answers}
    if len(versions) != 1:
        raise RuntimeError(f"held-out evaluation ran on different weights versions {sorted(versions)}")
    results = [r for _, r in answers]
    correct = [c for r in results for c in r.correct]
    n = samples_per_prompt
    ks = sorted({k for r in results for k in r.pass_at})
    return HeldOutResult(
        num_prompts=len(correct),
        samples_per_prompt=n,
        pass_at={k: sum(pass_at_k(n, c, k) for c in correct) / len(correct) for k in ks},
        mean_correctness=sum(r.mean_correctness * r.num_prompts for r in results) / len(correct),
        version=versions.pop(),
        time_s=max(r.time_s for r in results),
    )
