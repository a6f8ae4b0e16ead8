"""The job's held-out evaluation, spread over the rollout workers (``rollout/evaluate.py`` scores
each worker's part; ``stabledrl eval``, stabledrl/evaluation/offline.py, evaluates outside a job).

The held-out rows are dealt into one part per active worker (row i to part i mod N); each worker
evaluates its part with its current weights and the run's sampler settings. Sample j of prompt i
is seeded by (eval seed, prompt id, j) alone, so a part gives the same answer on any worker: a part
whose worker died or hung is simply run again on another (or its replacement), and the merged
result does not depend on the number of workers; BEFORE and AFTER are a paired comparison. pass@k
is recomputed from the merged per-prompt counts (the unbiased estimator is a mean over prompts, so
merging parts is exact). No Ray here: the scheduler hands parts out and collects them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from stabledrl.common.tasks import Row
from stabledrl.common.metrics import pass_at_k, read_metrics
from stabledrl.common.types import EvalResult


@dataclass
class HeldOutResult:
    num_prompts: int
    samples_per_prompt: int
    pass_at: dict[int, float]
    mean_correctness: float
    version: int  # the weights version every part was evaluated with
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

    @classmethod
    def from_metrics(cls, record: dict[str, float]) -> Optional["HeldOutResult"]:
        """The result an ``eval/*`` metrics line records (None if ``record`` is not one)."""
        if "eval/pass@1" not in record:
            return None
        pass_at = {int(k.removeprefix("eval/pass@")): v for k, v in record.items() if k.startswith("eval/pass@")}
        return cls(int(record.get("eval/prompts", 0)), 0, pass_at, record.get("eval/mean_correctness", 0.0),
                   int(record.get("eval/version", 0)), record.get("eval/time_s", 0.0))


def held_out_rows(rows: Sequence[Row], num_prompts: int) -> tuple[list[Row], Optional[str]]:
    """The first ``num_prompts`` held-out rows (``eval.num_prompts``), and a line to log when the
    task holds fewer (every evaluation then covers all of them)."""
    if rows and num_prompts > len(rows):
        return list(rows), (f"eval.num_prompts = {num_prompts}, but the task has {len(rows)} held-out rows: every "
                            f"evaluation covers those {len(rows)} (task.held_out sets how many)")
    return list(rows[:num_prompts]), None


@dataclass
class DealtParts:
    """Parts of one evaluation dealt over the workers: which wait for a worker, which run where,
    which are done. Every part gives the same answer on any worker, so a part whose worker died or
    hung simply waits again (the held-out parts below; the protocol's units, coordinator/decisions/scheduler.py)."""

    count: int
    waiting: list[int]  # parts not handed out (yet, or again after their worker was lost)
    running: dict[int, tuple[int, int]] = field(default_factory=dict)  # call -> (part, worker)
    done: dict[int, Any] = field(default_factory=dict)  # part -> its answer
    reruns: int = 0  # parts run again after their worker was lost

    @classmethod
    def of(cls, count: int) -> "DealtParts":
        return cls(count, list(range(count)))

    @property
    def finished(self) -> bool:
        return len(self.done) == self.count

    def assign(self, workers: Sequence[int]) -> list[tuple[int, int]]:
        """Hand every waiting part to one of ``workers`` (indices, in the fleet's order), each to the
        one with the fewest parts running: (part, worker) pairs, for the caller to start and record
        in ``running``."""
        load = {w: 0 for w in workers}
        for _, worker in self.running.values():
            if worker in load:
                load[worker] += 1
        out = []
        while self.waiting and load:
            worker = min(load, key=load.__getitem__)
            out.append((self.waiting.pop(0), worker))
            load[worker] += 1
        return out

    def lost_worker(self, worker: int) -> int:
        """The parts running on a worker that died or hung go back to the waiting parts."""
        calls = [c for c, (_, index) in self.running.items() if index == worker]
        for call in calls:
            self.waiting.append(self.running.pop(call)[0])
        self.reruns += len(calls)
        return len(calls)


@dataclass
class HeldOutRun(DealtParts):
    """One held-out evaluation in progress: its rows in parts, each answered by (version, EvalResult)."""

    done: dict[int, tuple[int, EvalResult]] = field(default_factory=dict)  # part -> (version, result)
    parts: list[list[Row]] = field(default_factory=list)
    step: int = 0  # the step it evaluates

    @classmethod
    def deal(cls, rows: Sequence[Row], workers: int, step: int = 0) -> "HeldOutRun":
        parts = [list(rows[i::workers]) for i in range(workers)]
        parts = [p for p in parts if p]
        return cls(len(parts), list(range(len(parts))), parts=parts, step=step)

    def merge(self) -> HeldOutResult:
        """The held-out result of every part; ValueError if the parts saw different weights."""
        answers = [self.done[part] for part in range(len(self.parts))]  # part order: sums are exact repeats
        versions = {version for version, _ in answers}
        if len(versions) != 1:
            raise ValueError(f"held-out evaluation ran on different weights versions {sorted(versions)}")
        results = [result for _, result in answers]
        correct = [c for r in results for c in r.correct]
        n = results[0].samples_per_prompt
        ks = sorted({k for r in results for k in r.pass_at})
        return HeldOutResult(
            num_prompts=len(correct),
            samples_per_prompt=n,
            pass_at={k: sum(pass_at_k(n, c, k) for c in correct) / len(correct) for k in ks},
            mean_correctness=sum(r.mean_correctness * r.num_prompts for r in results) / len(correct),
            version=versions.pop(),
            time_s=max(r.time_s for r in results),
        )


def first_evaluation(output_dir: Any) -> Optional[HeldOutResult]:
    """The run's evaluation at step 0, as output_dir/metrics.jsonl recorded it (a resumed run's BEFORE)."""
    path = output_dir / "metrics.jsonl"
    records = read_metrics(path) if path.is_file() else []
    return next((HeldOutResult.from_metrics(r) for r in records if r.get("step") == 0 and "eval/pass@1" in r), None)


def recorded_evaluations(output_dir: Any, every: int, steps: int) -> list[HeldOutResult]:
    """Every held-out evaluation of the run, one per step (the last one recorded at a step), at
    the steps an uninterrupted run evaluates, as output_dir/metrics.jsonl has them."""
    path = output_dir / "metrics.jsonl"
    by_step = {int(r["step"]): HeldOutResult.from_metrics(r) for r in (read_metrics(path) if path.is_file() else [])
               if "eval/pass@1" in r}
    return [by_step[step] for step in sorted(by_step) if scheduled_evaluation(step, every, steps)]


def evaluated_steps(output_dir: Any, protocol: bool = False) -> set[int]:
    """The steps at which output_dir/metrics.jsonl records an evaluation: the held-out rows' (and,
    with ``protocol``, the published protocol's, which runs first)."""
    path = output_dir / "metrics.jsonl"
    records = read_metrics(path) if path.is_file() else []
    return {int(r["step"]) for r in records if "eval/pass@1" in r or (protocol and "protocol/time_s" in r)}


def scheduled_evaluation(step: int, every: int, steps: int) -> bool:
    """Whether an uninterrupted run evaluates at ``step`` (BEFORE, every eval.every steps, AFTER):
    the evaluation a resumed process runs at its checkpoint's step is not one of the run's."""
    return step in (0, steps) or (every > 0 and step % every == 0 and step < steps)
