"""What the system benchmark reads out of a finished job: its metrics.jsonl (every actor's own
``time/<actor>/*`` clock, the coordinator's step times, perf/*) and the GPU utilisation samples
taken beside it, reduced over the timed steps into one record, and that record as markdown.

Actors are named as in the job's metrics (common/actor_time.py): ``learner<r>``, ``rollout<i>``.
For each: seconds per activity over the timed window, the window's wall time, idle (wall minus
the busy seconds of its main thread), its GPU's busy fraction (nvidia-smi ``utilization.gpu``:
the share of each 200 ms sample during which a kernel ran) and its peak memory (torch's
``max_memory_allocated`` from the actor, ``memory.used`` of the GPU from nvidia-smi).
"""
from __future__ import annotations

import datetime as dt
import statistics
import sys
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for a script run from anywhere
from stabledrl.common.actor_time import BACKGROUND, TRAIN_PARTS  # noqa: E402
from stabledrl.common.transport.clocks import PUSH_PARTS, STAGE  # noqa: E402


def read_gpu_samples(path: str) -> list[tuple[float, int, float, float]]:
    """(unix time, GPU index, utilisation %, memory used MiB) per line of nvidia-smi's CSV
    (``--query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader,nounits``)."""
    out = []
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            stamp = dt.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            out.append((stamp, int(parts[1]), float(parts[2]), float(parts[3])))
        except ValueError:
            continue
    return out


def step_records(records: list[dict]) -> list[dict]:
    return [r for r in records if "time/step" in r]


def actors_of(records: list[dict]) -> list[str]:
    names = {k.split("/")[1] for r in records for k in r if k.startswith("time/") and k.count("/") == 2}
    return sorted(n for n in names if n.startswith(("learner", "rollout")))


def analyse(records: list[dict], gpu_samples: list[tuple[float, int, float, float]], *, skip: int,
            started_at: float, peak_tflops: Optional[float], checkpoint_at: Optional[int] = None) -> dict[str, Any]:
    """The job's figures over steps ``skip+1 .. N`` (the first ``skip`` hold start-up and the
    pipeline fill); see the module docstring."""
    steps = step_records(records)
    if not steps:
        return {"steps": 0}
    timed = steps[skip:] if len(steps) > skip else steps[-1:]
    window = (steps[skip - 1]["time"] if 0 < skip < len(steps) else started_at, timed[-1]["time"])
    out: dict[str, Any] = {
        "steps": len(steps), "timed_steps": [int(r["step"]) for r in timed],
        "first_step_s": steps[0]["time"] - started_at,
        "startup_s": {k.removeprefix("time/"): steps[0][k] for k in ("time/startup_prepare", "time/startup_actors")
                      if k in steps[0]},
        "per_step": [{k: r.get(k) for k in ("step", "time/step", "time/train", "time/weight_push", "time/generate",
                                             "perf/mfu", "perf/samples_per_s", "rollout/tokens", "rollout/forwards",
                                             "learner/samples", "rollout/compiles", "learner/compiles")}
                     # each actor's push clocks in this step (a slow push: which end, and what part of it)
                     | {"push_by_actor_s": {k.removeprefix("time/"): v for k, v in sorted(r.items())
                                            if k.startswith("time/") and k.count("/") == 2
                                            and k.split("/")[2].startswith("push")}}
                     for r in steps],
    }
    sum_of = lambda key: sum(r.get(key, 0.0) for r in timed)  # noqa: E731
    wall = sum_of("time/step")
    out["samples_per_s"] = sum_of("learner/samples") / wall if wall else None
    out["step_s_median"] = statistics.median(r["time/step"] for r in timed)
    out["train_s_median"] = statistics.median(r["time/train"] for r in timed)
    out["push_s"] = [r.get("time/weight_push") for r in steps]
    push = [r["time/weight_push"] for r in timed if r.get("time/weight_push") is not None]
    out["push_s_median"] = statistics.median(push) if push else None
    for kind in ("gpu", "rss"):  # each learner rank's peak over the run (learner/peak_<kind>_gb/rank<r>)
        prefix = f"learner/peak_{kind}_gb/"
        ranks = sorted({k.removeprefix(prefix) for r in steps for k in r if k.startswith(prefix)})
        if ranks:
            out[f"learner_peak_{kind}_gb"] = {rank: max(r.get(prefix + rank, 0.0) for r in steps) for rank in ranks}
    mfu = [r["perf/mfu"] for r in timed if "perf/mfu" in r]
    out["learner_mfu"] = statistics.median(mfu) if mfu else None
    out["learner_mfu_against_tflops"] = peak_tflops
    # the timed steps' totals the roofline counts FLOPs from (tests/benchmarks/peers/roofline.py)
    out["timed_totals"] = {name: sum_of(key) for name, key in (
        ("step_s", "time/step"), ("samples", "learner/samples"), ("prompt_tokens", "rollout/prompt_tokens"),
        ("forward_rows", "rollout/forward_rows"), ("forward_tokens", "rollout/forward_tokens"),
        ("forward_attended", "rollout/forward_attended"), ("tokens", "rollout/tokens"))}
    # graphs torch.compile built during the timed steps, by side: zero once the shapes have been seen
    # (common/compiling.py); a count here is compiling that the rates carry (a new shape's recompile inside
    # the window, or shapes that keep recompiling)
    out["compiles_timed"] = {side: sum_of(f"{side}/compiles") for side in ("rollout", "learner")}
    generate_s = sum_of("rollout/generate_s")
    out["rollout_tokens_per_s_generating"] = sum_of("rollout/tokens") / generate_s if generate_s else None
    out["rollout_tokens_per_forward"] = sum_of("rollout/tokens") / max(1.0, sum_of("rollout/forwards"))
    if checkpoint_at is not None:
        # each timed step after the save against the plain steps: the timed steps up to the save (the
        # steps after it overlap its background write, so they are no baseline); none timed before
        # it: the other timed steps. Wall (set by whichever actor is the critical path) and training
        # (where a learner that waited for the save's copy shows). The step right after the save is
        # the headline; the later ones show a write that still slows training.
        for key, name in (("time/step", "step"), ("time/train", "train")):
            before = [r[key] for r in timed if r["step"] <= checkpoint_at and key in r]
            after = {int(r["step"]): r[key] for r in steps if r["step"] > checkpoint_at and key in r}
            plain = before or [r[key] for r in timed if r["step"] != checkpoint_at + 1 and key in r]
            if checkpoint_at + 1 in after and plain:
                base = statistics.median(plain)
                out[f"{name}_after_checkpoint_s"] = after[checkpoint_at + 1]
                out[f"{name}_after_checkpoint_ratio"] = after[checkpoint_at + 1] / base
                out[f"{name}_plain_s"] = base
                out[f"{name}_plain_steps"] = len(plain)
                out[f"{name}_after_checkpoint_ratios"] = {str(k): v / base for k, v in sorted(after.items())}
    out["actors"] = {name: actor_figures(name, timed, gpu_samples, window) for name in actors_of(records)}
    out["push_by_actor_s"] = {f"{name}/{activity}": seconds / len(timed) for name, a in out["actors"].items()
                              for activity, seconds in sorted(a["seconds"].items()) if activity.startswith("push")}
    return out


def actor_figures(name: str, timed: list[dict], gpu_samples: list, window: tuple[float, float]) -> dict[str, Any]:
    prefix = f"time/{name}/"
    seconds: dict[str, float] = {}
    for r in timed:
        for key, value in r.items():
            if key.startswith(prefix):
                seconds[key.removeprefix(prefix)] = seconds.get(key.removeprefix(prefix), 0.0) + value
    wall = seconds.pop("wall", 0.0)
    idle = seconds.pop("idle", 0.0)
    gpu = next((r.get(f"actor/{name}/gpu") for r in reversed(timed) if f"actor/{name}/gpu" in r), None)
    peak = max((r.get(f"actor/{name}/peak_memory_gib", 0.0) for r in timed), default=None)
    out = {"wall_s": wall, "idle_s": idle, "seconds": seconds, "busy_fraction": (wall - idle) / wall if wall else None,
           "gpu": gpu, "peak_memory_gib": peak or None}
    if gpu is not None:
        mine = [(u, m) for t, i, u, m in gpu_samples if i == int(gpu) and window[0] <= t <= window[1]]
        every = [m for _, i, _, m in gpu_samples if i == int(gpu)]
        out["gpu_busy_fraction"] = statistics.fmean(u for u, _ in mine) / 100 if mine else None
        out["gpu_memory_used_max_gib"] = max(every) / 1024 if every else None
        out["gpu_samples"] = len(mine)
    return out


def check(figures: dict[str, Any]) -> list[str]:
    """What must hold in any run's record (the tiny CPU test asserts it is empty)."""
    problems = []
    for name, a in figures.get("actors", {}).items():
        busy = sum(a["seconds"].values())
        if a["wall_s"] <= 0:
            problems.append(f"{name}: no wall time")
        if a["idle_s"] < 0 or a["idle_s"] > a["wall_s"] + 1e-6:
            problems.append(f"{name}: idle {a['idle_s']:.3f} s outside [0, wall {a['wall_s']:.3f} s]")
        main = busy - sum(v for k, v in a["seconds"].items() if k in BACKGROUND + STAGE + PUSH_PARTS + TRAIN_PARTS)
        if main > a["wall_s"] * 1.001 + 1e-3:
            problems.append(f"{name}: main-thread busy {main:.3f} s exceeds wall {a['wall_s']:.3f} s")
        if abs(main + a["idle_s"] - a["wall_s"]) > max(1e-3, 1e-3 * a["wall_s"]) and main <= a["wall_s"]:
            problems.append(f"{name}: busy {main:.3f} + idle {a['idle_s']:.3f} != wall {a['wall_s']:.3f}")
    for key in ("samples_per_s", "first_step_s", "step_s_median", "rollout_tokens_per_s_generating"):
        if not figures.get(key) or figures[key] <= 0:
            problems.append(f"{key} missing or not positive: {figures.get(key)}")
    return problems


def markdown(name: str, f: dict[str, Any]) -> str:
    """The record as a few lines of markdown (summary.md)."""
    if not f or not f.get("steps"):
        return f"### {name}\n\nno step finished\n"

    def num(x, fmt="{:.2f}"):
        return "n/a" if x is None else fmt.format(x)

    lines = [
        f"### {name}",
        "",
        f"steps {f['steps']} (timed {f['timed_steps']}); first step after {num(f['first_step_s'], '{:.1f}')} s; "
        f"step {num(f['step_s_median'])} s, train {num(f['train_s_median'])} s (medians); "
        f"{num(f['samples_per_s'])} samples/s; learner MFU {num(f['learner_mfu'], '{:.1%}')} of "
        f"{num(f['learner_mfu_against_tflops'], '{:.3g}')} TFLOP/s; "
        f"rollout {num(f['rollout_tokens_per_s_generating'], '{:.0f}')} "
        f"tokens/s per worker while generating ({num(f['rollout_tokens_per_forward'])} tokens/forward); "
        f"push {', '.join(num(p) for p in f['push_s'])} s"
        + (
            f" (per step: {', '.join(f'{k} {v:.2f}' for k, v in f['push_by_actor_s'].items())} s)"
            if f.get("push_by_actor_s")
            else ""
        )
        + (f"; graphs compiled in the timed steps: rollout {f['compiles_timed']['rollout']:g}, learner "
           f"{f['compiles_timed']['learner']:g}" if f.get("compiles_timed") else "")
        + "".join(
            f"; learner peak {kind.upper()} GB {', '.join(f'{r} {v:.1f}' for r, v in f[key].items())}"
            for kind, key in (("gpu", "learner_peak_gpu_gb"), ("rss", "learner_peak_rss_gb"))
            if f.get(key)
        )
        + (
            f"; step after the checkpoint {num(f.get('step_after_checkpoint_ratio'))}x a plain one "
            f"(training {num(f.get('train_after_checkpoint_ratio'))}x; against the median of "
            f"{f.get('step_plain_steps')} step(s) before the save; each step after it, wall / training: "
            + ", ".join(f"{k}: {v:.2f} / {(f.get('train_after_checkpoint_ratios') or {}).get(k, float('nan')):.2f}"
                        for k, v in (f.get("step_after_checkpoint_ratios") or {}).items()) + ")"
            if "step_after_checkpoint_ratio" in f
            else ""
        ),
        "",
        "| actor | GPU | busy | GPU busy | peak GiB (torch / smi) | seconds per activity (timed steps) |",
        "|---|---|---|---|---|---|",
    ]
    for actor, a in f["actors"].items():
        acts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(a["seconds"].items(), key=lambda kv: -kv[1]))
        lines.append(
            f"| {actor} | {num(a['gpu'], '{:.0f}')} | {num(a['busy_fraction'], '{:.0%}')} | "
            f"{num(a.get('gpu_busy_fraction'), '{:.0%}')} | {num(a['peak_memory_gib'], '{:.1f}')} / "
            f"{num(a.get('gpu_memory_used_max_gib'), '{:.1f}')} | {acts}, idle {a['idle_s']:.1f} of {a['wall_s']:.1f} |"
        )
    return "\n".join(lines) + "\n"
