"""What one step logs besides the learner's own ``train/*``: rollout statistics of the batch, the
ranks' results merged, throughput and (optionally) MFU (docs/design.md lists the names)."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from stabledrl.common.stats import Stat, combine
from stabledrl.common.types import Episode


def rollout_metrics(batch: Sequence[Episode]) -> dict[str, float]:
    """rollout/*: rewards (and their parts), lengths, degenerate groups, versions, worker cost."""
    samples = [s for e in batch for s in e.group.samples]
    rewards = [s.reward for s in samples]
    out = {
        "rollout/reward_mean": statistics.fmean(rewards),
        "rollout/reward_std": statistics.pstdev(rewards),
        "rollout/completion_length": statistics.fmean(s.completion_length for s in samples),
        "rollout/groups": float(len(batch)),
        "rollout/samples": float(len(samples)),
        # groups whose rewards are all equal carry no policy gradient (A = 0 for every sample)
        "rollout/degenerate_groups": statistics.fmean(
            float(len({s.reward for s in e.group.samples}) == 1) for e in batch
        ),
        "rollout/policy_version_min": float(min(s.policy_version for s in samples)),
        "rollout/behaviour_logp": statistics.fmean(s.behaviour_logp for s in samples),
    }
    # each part over the samples that carry it (a user function's None, a failed call: none), as TRL averages
    for part in sorted({k for s in samples for k in s.reward_parts}):
        values = [s.reward_parts[part] for s in samples if part in s.reward_parts]
        out[f"rollout/reward/{part}"] = statistics.fmean(values)
    for key in ("generate_s", "reward_s", "estimate_s", "tokens", "forwards", "forward_rows", "forward_tokens",
                "forward_attended", "prompt_tokens", "compiles"):
        out[f"rollout/{key}"] = sum(e.stats.get(key, 0.0) for e in batch)
    return out


def data_metrics(reports: Sequence[Any]) -> dict[str, float]:
    """data/*: rows read and kept over the task's sources, rows skipped by reason (on_bad_row: skip)."""
    out = {"data/rows_read": float(sum(r.read for r in reports)), "data/rows_kept": float(sum(r.kept for r in reports))}
    for report in reports:
        for reason, n in report.skipped.items():
            out[f"data/skipped/{reason}"] = out.get(f"data/skipped/{reason}", 0.0) + n
    return out


def merge_ranks(results: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """One record from the learner ranks' results, each statistic by the reduction it carries
    (common/stats.py): ``train/*`` are replicated (rank 0's value); learner/staleness_max, the
    slowest rank's time and the peak memory by max, learner/samples and tokens by sum."""
    return {key: float(value) for key, value in combine(results, across="ranks").items()}


def perf_metrics(*, step_s: float, train_s: float, samples: float, tokens: float, forward_tokens: float,
                 inner_iterations: int, parameters: int, learner_devices: int,
                 peak_tflops: Optional[float]) -> dict[str, float]:
    """perf/*: samples and completion tokens trained per second of wall time, learner tokens/s;
    MFU ≈ 6·N·(tokens the estimates' forwards feed)·μ / (train time · devices · peak), the usual
    6N-per-token estimate of a forward and backward, ignoring attention FLOPs and the forward that
    activation checkpointing recomputes (``forward_tokens``: see ``estimate_forward_tokens``)."""
    out = {
        "perf/samples_per_s": samples / step_s if step_s > 0 else 0.0,
        "perf/tokens_per_s": tokens / step_s if step_s > 0 else 0.0,
        "perf/learner_tokens_per_s": tokens * inner_iterations / train_s if train_s > 0 else 0.0,
    }
    if peak_tflops and train_s > 0:
        flops = 6.0 * parameters * forward_tokens * inner_iterations
        out["perf/mfu"] = flops / (train_s * learner_devices * peak_tflops * 1e12)
    return out


def forwards_per_estimate(estimator: Any) -> int:
    """Model forwards one learner estimate costs per sample (coupled: 1 + 2 per pair)."""
    draws = int(getattr(estimator, "num_draws", 1))
    return 1 + 2 * draws if estimator.name == "coupled" else draws


def estimate_forward_tokens(estimator: Any, prompt_tokens: int, completion_tokens: int) -> int:
    """Tokens the model takes in for one sample's estimate: prompt + completion per forward; the
    staircase's one forward carries the completion twice (the noisy copy and the clean copy its
    blocks attend to), so it feeds prompt + 2 x completion per draw, as the estimator needs them."""
    per_forward = prompt_tokens + completion_tokens
    if estimator.name == "staircase":
        per_forward += completion_tokens
    return per_forward * forwards_per_estimate(estimator)


@dataclass
class StepEnd:
    """What a finished step's record needs: taken when the learner's result came back, and (the
    push's time) when its weights were out."""

    batch: list[Episode]
    results: list[dict[str, Stat]]  # each learner rank's statistics
    train_s: float
    at_end: dict[str, float]  # staleness/*, rollout/* counters, workers, faults: as the step ended
    push_s: float = 0.0
    push_at: float = 0.0


def step_record(end: StepEnd, *, version: int, step_s: float, inner_iterations: int, estimator: Any,
                parameters: int, learner_devices: int, peak_tflops: Optional[float]) -> dict[str, float]:
    """The metrics.jsonl line of one step (keys in the order the logs have always had)."""
    staleness = {k: v for k, v in end.at_end.items() if k.startswith("staleness/")}
    record = {**rollout_metrics(end.batch), **merge_ranks(end.results), **staleness}
    record.update({"time/step": step_s, "time/train": end.train_s, "time/weight_push": end.push_s,
                   "time/generate": record["rollout/generate_s"], "version": float(version),
                   **{k: v for k, v in end.at_end.items() if not k.startswith("staleness/")}})
    forward_tokens = sum(estimate_forward_tokens(estimator, len(s.prompt_ids), len(s.completion_ids))
                         for e in end.batch for s in e.group.samples)
    record.update(perf_metrics(
        step_s=step_s, train_s=end.train_s, samples=record["learner/samples"], tokens=record["learner/tokens"],
        forward_tokens=forward_tokens, inner_iterations=inner_iterations, parameters=parameters,
        learner_devices=learner_devices, peak_tflops=peak_tflops))
    return record
