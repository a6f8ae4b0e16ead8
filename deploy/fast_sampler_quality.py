"""The fast sampler's quality on learned weights: the quickstart's RL job from its own warm start,
once with the exact sampler (the quickstart as shipped: no cache, a fixed number of tokens a step)
and once with the shipped fast paths (Fast-dLLM's dual KV cache and threshold decoding at 0.9,
``FAST``), several RL seeds each, on the CPU.

    python deploy/fast_sampler_quality.py --out runs/fast_sampler_quality
    python deploy/fast_sampler_quality.py --out /tmp/q --seeds 0 --set run.steps=20  # a short check

Each job trains and evaluates with its own sampler (the held-out prompts are decoded greedily with
it, as a user of that sampler sees them), so the accuracy at step 0 is the warm start decoded each
way and the later ones what RL reaches with each. The runs are deploy/quickstart_sweep.py's
(one warm start, ``--seeds``), into ``OUT/exact`` and ``OUT/fast``; this script then writes
``OUT/results.json`` and ``OUT/table.md``:

- held-out accuracy per run: BEFORE (step 0), the mean of the last ``--window`` evaluations, and
  over the seeds of a sampler their mean, sample standard deviation and range;
- tokens committed per forward per row: the completion tokens the rollouts kept (up to the first
  EOS, ``rollout/tokens``) over the forwards that sampled them (``rollout/forwards``, each a
  forward of every row of a request) times the rows of a request (prompts_per_request x G); and
  the canvas positions per forward (gen_length x rows / forwards), which counts the positions
  after the EOS too. The exact sampler commits gen_length / steps positions a forward.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("quickstart_sweep", Path(__file__).with_name("quickstart_sweep.py"))
sweep = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = sweep  # its dataclass looks its module up there
_spec.loader.exec_module(sweep)

WARM_START = "seed=0,steps=300,threads=1"  # the quickstart's own (its warmstart section)
FAST = ["sampler.cache=dual", "sampler.threshold=0.9"]  # the shipped fast paths (deploy/configs/llada8b_1node.yaml)
SAMPLERS = {"exact": [], "fast": FAST}


def rollout_rates(metrics: Path, rows_per_request: int, gen_length: int) -> dict[str, Optional[float]]:
    """Tokens kept and canvas positions committed per forward per row, over every step of a run."""
    tokens = forwards = 0.0
    samples = 0.0
    for line in metrics.read_text().splitlines() if metrics.is_file() else []:
        record = json.loads(line)
        if "rollout/forwards" in record:
            tokens += record.get("rollout/tokens", 0.0)
            forwards += record["rollout/forwards"]
            samples += record.get("rollout/samples", 0.0)
    if not forwards:
        return {"tokens_per_forward": None, "positions_per_forward": None}
    row_forwards = forwards * rows_per_request
    return {"tokens_per_forward": tokens / row_forwards, "positions_per_forward": samples * gen_length / row_forwards}


def summarise(records: list[dict]) -> dict:
    """Mean, sample standard deviation and range of the final accuracy (and BEFORE) over runs."""
    ok = [r for r in records if "after_window" in r]
    out: dict = {"runs": len(records), "finished": len(ok)}
    for key in ("before", "after_window", "tokens_per_forward", "positions_per_forward"):
        xs = [r[key] for r in ok if r.get(key) is not None]
        if xs:
            out[key] = {"mean": statistics.fmean(xs), "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0,
                        "min": min(xs), "max": max(xs)}
    return out


def table(results: dict) -> str:
    head = (f"Quickstart (deploy/configs/quickstart.yaml), warm start {results['warm_start']}, RL seeds "
            f"{results['seeds']}, {results['machine']}; overrides {' '.join(results['set']) or 'none'}.\n\n"
            "| sampler | seed | BEFORE % | final % (mean of last evals) | tokens / forward / row | "
            "positions / forward / row | wall s |\n|---|---|---|---|---|---|---|\n")
    lines = []
    for name, part in results["samplers"].items():
        for r in part["records"]:
            if "after_window" not in r:
                lines.append(f"| {name} | {r['seed']} | failed (exit {r['returncode']}) | | | | {r['wall_s']:.0f} |")
                continue
            lines.append(f"| {name} | {r['seed']} | {r['before']:.1f} | {r['after_window']:.1f} | "
                         f"{_f(r.get('tokens_per_forward'))} | {_f(r.get('positions_per_forward'))} | "
                         f"{r['wall_s']:.0f} |")
    for name, part in results["samplers"].items():
        s = part["summary"]
        if "after_window" in s:
            a, b = s["after_window"], s["before"]
            lines.append(f"| **{name}: mean ± sd (range)** | {s['finished']} of {s['runs']} | {b['mean']:.1f} | "
                         f"**{a['mean']:.1f} ± {a['sd']:.1f}** ({a['min']:.1f}-{a['max']:.1f}) | "
                         f"{_f(s.get('tokens_per_forward', {}).get('mean'))} | "
                         f"{_f(s.get('positions_per_forward', {}).get('mean'))} | |")
    verdict = results.get("verdict")
    return head + "\n".join(lines) + "\n" + (f"\n{verdict}\n" if verdict else "")


def verdict(results: dict) -> Optional[str]:
    """Where the fast sampler's mean final accuracy lies against the exact sampler's spread (its range
    over the seeds, widened to one standard deviation about its mean where that is wider): within,
    above or below, with the difference of the means and its standard error (Welch)."""
    exact, fast = (results["samplers"][k]["summary"].get("after_window") for k in ("exact", "fast"))
    if not exact or not fast:
        return None
    low, high = min(exact["min"], exact["mean"] - exact["sd"]), max(exact["max"], exact["mean"] + exact["sd"])
    where = "within" if low <= fast["mean"] <= high else "above" if fast["mean"] > high else "BELOW"
    n_e = results["samplers"]["exact"]["summary"]["finished"]
    n_f = results["samplers"]["fast"]["summary"]["finished"]
    se = (exact["sd"] ** 2 / n_e + fast["sd"] ** 2 / n_f) ** 0.5
    diff = fast["mean"] - exact["mean"]
    return (f"fast mean {fast['mean']:.1f}% against exact {exact['mean']:.1f}% (exact's spread "
            f"{low:.1f}-{high:.1f}%): {where} the exact sampler's spread; difference {diff:+.1f} points "
            f"(standard error {se:.1f}, t = {diff / se if se else float('nan'):.2f} over {n_e} + {n_f} runs)")


def _f(x: Optional[float]) -> str:
    return "—" if x is None else f"{x:.2f}"


def machine() -> str:
    import os
    import platform

    return f"{platform.node()}, {os.cpu_count()} CPU cores ({platform.processor() or platform.machine()})"


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "fast_sampler_quality")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--samplers", nargs="+", default=list(SAMPLERS), choices=list(SAMPLERS))
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for every run")
    p.add_argument("--parallel", type=int, default=1)
    p.add_argument("--window", type=int, default=3)
    p.add_argument("--from-results", action="store_true", help="write table.md again from OUT/results.json")
    a = p.parse_args(argv)
    if a.from_results:
        results = json.loads((a.out / "results.json").read_text())
        results["verdict"] = verdict(results)
        (a.out / "table.md").write_text(table(results))
        print(table(results), end="")
        return 0
    from stabledrl.common.config.job import load_job_config

    cfg = load_job_config(str(sweep.CONFIG), list(a.set))
    rows = cfg.rollout.prompts_per_request * cfg.algorithm.group_size
    results = {"warm_start": WARM_START, "seeds": a.seeds, "set": a.set, "machine": machine(), "samplers": {}}
    for name in a.samplers:
        args = sweep.parse(["--out", str(a.out / name), "--warm-starts", WARM_START, "--seeds", *map(str, a.seeds),
                            "--parallel", str(a.parallel), "--window", str(a.window),
                            "--set", *SAMPLERS[name], *a.set])
        records = sweep.sweep(args)
        for r in records:
            r.update(rollout_rates(Path(r["dir"]) / "metrics.jsonl", rows, cfg.sampler.gen_length))
        records.sort(key=lambda r: r["seed"])
        results["samplers"][name] = {"overrides": SAMPLERS[name], "records": records, "summary": summarise(records)}
        (a.out / "results.json").write_text(json.dumps(results, indent=1))
    results["verdict"] = verdict(results) if len(results["samplers"]) == 2 else None
    (a.out / "results.json").write_text(json.dumps(results, indent=1))
    (a.out / "table.md").write_text(table(results))
    print(table(results), end="")
    return 0 if all(s["summary"]["finished"] == s["summary"]["runs"] for s in results["samplers"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
