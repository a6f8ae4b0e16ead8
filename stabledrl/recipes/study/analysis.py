"""What a study reports per run and per method: accuracy, collapses, gradient spikes.

Pure functions of metrics records (``metrics.jsonl`` lines), so a study's table can be rebuilt
from its files alone (``stabledrl study --report DIR``).

Per run:
    start / final / best held-out pass@1   eval/pass@1 at step 0, at the last evaluation, and the
                                           largest over the evaluations after step 0
    collapse step                          ``find_collapse`` on the batch reward (CollapseRule)
    largest grad-norm spike                max_t g_t and max_t g_t / median_{t: g_t > 0} g_t, where g_t is
                                           the step's largest pre-clip gradient norm over its μ updates
Per method: means and standard deviations over seeds, collapses counted as n of N runs.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Sequence

from stabledrl.recipes.plot import RunCurves, ema
from stabledrl.recipes.study.config import CollapseRule

REWARD = "rollout/reward_mean"
ACCURACY = "eval/pass@1"
GRAD_NORM = "train/grad_norm_max"


def find_collapse(rewards: Sequence[float], rule: CollapseRule) -> Optional[int]:
    """Index t* where the reward EMA falls below ``rule.fraction`` of its peak for good (the
    CollapseRule docstring), or None. ``rewards`` are per step, in order."""
    smooth = ema(rewards, rule.ema)
    if not smooth:
        return None
    peak = max(smooth)
    if peak < rule.min_peak:
        return None
    threshold = rule.fraction * peak
    start = len(smooth)
    while start > 0 and smooth[start - 1] < threshold:
        start -= 1
    return start if len(smooth) - start >= rule.hold else None


def grad_spike(grad_norms: Sequence[float]) -> tuple[float, float]:
    """(largest gradient norm, largest / median): how far the worst step stands above a typical one.

    The median is over the steps that had a gradient (norm > 0): a step whose groups all scored
    alike has zero advantages and a zero gradient, and a collapsed run has mostly such steps, which
    would put the median at 0 and the ratio at infinity. Non-finite norms (skipped updates) are left out."""
    finite = [g for g in grad_norms if math.isfinite(g)]
    if not finite:
        return math.nan, math.nan
    moved = [g for g in finite if g > 0]
    top = max(finite)
    return top, top / statistics.median(moved) if moved else math.nan


@dataclass
class RunSummary:
    method: str
    seed: int
    steps: int  # training steps logged
    status: str  # "finished" | "stopped" (deadline) | "failed" | "not started"
    start_accuracy: float
    final_accuracy: float
    best_accuracy: float
    final_reward: float  # reward EMA at the last step
    peak_reward: float  # largest reward EMA
    collapse_step: Optional[int]  # the step the reward fell for good, None: no collapse
    grad_norm_max: float
    grad_spike: float  # largest / median of the per-step grad norm
    ratio_max: float  # largest importance ratio seen (train/ratio/max)
    skipped_steps: float  # non-finite updates the learner skipped
    time_s: float  # wall time of the run's steps

    @property
    def collapsed(self) -> bool:
        return self.collapse_step is not None

    @property
    def finished(self) -> bool:
        return self.status == "finished"


def summarize_run(method: str, seed: int, records: Sequence[dict[str, float]], rule: CollapseRule, *,
                  status: str = "finished") -> RunSummary:
    curves = RunCurves(f"{method}/seed{seed}", list(records))
    reward_steps, rewards = curves.series((REWARD,))
    eval_steps, accuracy = curves.series((ACCURACY,))
    smooth = ema(rewards, rule.ema)
    collapse = find_collapse(rewards, rule)
    top, spike = grad_spike(curves.series((GRAD_NORM,))[1])
    after_start = [a for s, a in zip(eval_steps, accuracy) if s > 0]
    ratio_max = curves.series(("train/ratio/max",))[1]
    skipped = curves.series(("train/skipped_total",))[1]
    return RunSummary(
        method=method, seed=seed, steps=len(rewards), status=status,
        start_accuracy=accuracy[0] if eval_steps and eval_steps[0] == 0 else math.nan,
        final_accuracy=after_start[-1] if after_start else math.nan,
        best_accuracy=max(after_start) if after_start else math.nan,
        final_reward=smooth[-1] if smooth else math.nan, peak_reward=max(smooth) if smooth else math.nan,
        collapse_step=reward_steps[collapse] if collapse is not None else None,
        grad_norm_max=top, grad_spike=spike, ratio_max=max(ratio_max) if ratio_max else math.nan,
        skipped_steps=skipped[-1] if skipped else 0.0,
        time_s=math.fsum(curves.series(("time/step",))[1]),
    )


@dataclass
class MethodSummary:
    method: str
    runs: list[RunSummary] = field(repr=False)

    def stat(self, name: str) -> tuple[float, float]:
        """(mean, std over seeds) of a RunSummary field, NaNs left out."""
        values = [getattr(r, name) for r in self.runs if not math.isnan(getattr(r, name))]
        if not values:
            return math.nan, math.nan
        return statistics.fmean(values), statistics.pstdev(values) if len(values) > 1 else 0.0

    @property
    def collapses(self) -> int:
        return sum(r.collapsed for r in self.runs)

    def worst(self, name: str) -> float:
        values = [getattr(r, name) for r in self.runs if not math.isnan(getattr(r, name))]
        return max(values) if values else math.nan


def summarize_methods(runs: Sequence[RunSummary], order: Sequence[str]) -> list[MethodSummary]:
    return [MethodSummary(m, [r for r in runs if r.method == m]) for m in order if any(r.method == m for r in runs)]


def _pct(mean_std: tuple[float, float]) -> str:
    mean, std = mean_std
    return "n/a" if math.isnan(mean) else f"{100 * mean:.1f} ± {100 * std:.1f}"


def _num(x: float, digits: int = 2) -> str:
    return "n/a" if math.isnan(x) else ("inf" if math.isinf(x) else f"{x:.{digits}f}")


def method_table(methods: Sequence[MethodSummary]) -> str:
    """The study's markdown table, one row per method (mean ± std over seeds, in %)."""
    head = ("| method | runs | held-out pass@1: start | final | best | reward EMA: final | collapses "
            "| largest grad norm (× median) | largest ratio |\n|---|---|---|---|---|---|---|---|---|\n")
    rows = []
    for m in methods:
        unfinished = sum(not r.finished for r in m.runs)
        runs = f"{len(m.runs)}" + (f" ({unfinished} unfinished)" if unfinished else "")
        spike = max(m.runs, key=lambda r: -math.inf if math.isnan(r.grad_norm_max) else r.grad_norm_max)
        rows.append(f"| {m.method} | {runs} | {_pct(m.stat('start_accuracy'))} | {_pct(m.stat('final_accuracy'))} "
                    f"| {_pct(m.stat('best_accuracy'))} | {_num(m.stat('final_reward')[0], 3)} "
                    f"| {m.collapses}/{len(m.runs)} | {_num(spike.grad_norm_max)} (× {_num(spike.grad_spike, 1)}) "
                    f"| {_num(m.worst('ratio_max'), 1)} |")
    return head + "\n".join(rows) + "\n"


def run_table(runs: Sequence[RunSummary]) -> str:
    """One row per run: the numbers behind the method table."""
    head = ("| run | steps | pass@1 start → final (best) | reward EMA peak → final | collapse at step "
            "| max grad norm (× median) | max ratio | skipped |\n|---|---|---|---|---|---|---|---|\n")
    rows = [
        f"| {r.method}/seed{r.seed}{'' if r.finished else f' ({r.status})'} | {r.steps} "
        f"| {_num(100 * r.start_accuracy, 1)} → {_num(100 * r.final_accuracy, 1)} ({_num(100 * r.best_accuracy, 1)}) "
        f"| {_num(r.peak_reward, 3)} → {_num(r.final_reward, 3)} | {r.collapse_step if r.collapsed else '-'} "
        f"| {_num(r.grad_norm_max)} (× {_num(r.grad_spike, 1)}) | {_num(r.ratio_max, 1)} | {int(r.skipped_steps)} |"
        for r in runs
    ]
    return head + "\n".join(rows) + "\n"


def as_json(runs: Sequence[RunSummary]) -> list[dict[str, Any]]:
    return [{**asdict(r), "collapsed": r.collapsed, "finished": r.finished} for r in runs]
