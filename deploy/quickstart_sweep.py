"""The quickstart's robustness sweep: its RL recipe from several warm starts, several RL seeds each.

    python deploy/quickstart_sweep.py --out runs/quickstart_sweep --parallel 2
    python deploy/quickstart_sweep.py --out /tmp/sweep --parallel 8 --cores-per-run 2 --budget-s 480

A warm start is a set of ``warmstart.*`` overrides (``seed=1,steps=200,threads=1``); the default
grid has seven, whose held-out accuracy BEFORE RL spans 35-71% on the 2-core development machine.
Every warm start is built first (in parallel, cached under .cache/warmstart as `make run` caches
its own), then every (warm start, RL seed) pair runs ``python -m stabledrl train`` with the
quickstart config, ``run.seed`` = the RL seed, and any ``--set`` overrides. Each run gets
``--cores-per-run`` cores of its own (CPU affinity, inherited by its Ray processes;
``cluster.local_num_cpus`` matches) when the machine has enough, else the runs share the machine's
cores. CUDA is hidden from the runs (``--gpu`` shows it), so the sweep measures the CPU recipe on
any host.

Results are written to ``--out`` as runs finish (the runs' own directories and logs, and the warm
starts' logs, go under ``--runs-dir``, default OUT/runs): ``results.jsonl`` (one line per run:
BEFORE, AFTER, the mean of the last ``--window`` evaluations, the gains, the held-out curve, the
wall time) and ``summary.md`` (the table, the gain per warm start and over all runs: min / median
/ max). A sweep into an --out that already holds results runs only the pairs not finished there.
``--budget-s``: no run starts after that many seconds; runs still going ``--grace-s`` later are
stopped and recorded as failed.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "deploy" / "configs" / "quickstart.yaml"
WARM_STARTS = (  # SFT seed, steps and CPU threads; BEFORE on the 2-core development machine in brackets
    "seed=0,steps=300,threads=2",  # the quickstart's own (59.5%)
    "seed=0,steps=300,threads=1",  # the same with one thread (bit-identical weights there: the tensors are small)
    "seed=1,steps=300,threads=2",  # (35.0%)
    "seed=2,steps=300,threads=1",  # (39.5%)
    "seed=3,steps=300,threads=2",  # (57.5%)
    "seed=0,steps=400,threads=1",  # (71.0%)
    "seed=0,steps=350,threads=1",
)
QUIET = ("run.save_final_checkpoint=false", "run.export_final=false", "run.tensorboard=false")  # not measured


@dataclass
class Run:
    warm_start: str
    seed: int
    out: Path
    proc: Optional[subprocess.Popen] = None
    cores: list[int] = field(default_factory=list)
    slot: int = 0
    started: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.warm_start.replace('=', '').replace(',', '-')}/seed{self.seed}"


def warm_start_overrides(spec: str) -> list[str]:
    """``seed=1,steps=200`` -> ``['warmstart.seed=1', 'warmstart.steps=200']``."""
    return [f"warmstart.{item.strip()}" for item in spec.split(",") if item.strip()]


def held_out_curve(metrics: Path) -> list[tuple[int, float]]:
    """(step, eval/pass@1) of every held-out evaluation in a run's metrics.jsonl."""
    curve = []
    for line in metrics.read_text().splitlines() if metrics.is_file() else []:
        record = json.loads(line)
        if "eval/pass@1" in record:
            curve.append((int(record["step"]), float(record["eval/pass@1"])))
    return curve


def run_record(run: Run, returncode: Optional[int], window: int) -> dict:
    """One results.jsonl line: BEFORE, AFTER (the last evaluation), the mean of the last ``window``
    evaluations, gains in points, the curve, the exit status and the wall time."""
    curve = held_out_curve(run.out / "metrics.jsonl")
    record = {"warm_start": run.warm_start, "seed": run.seed, "returncode": returncode,
              "wall_s": round(time.monotonic() - run.started, 1), "curve": curve, "dir": str(run.out)}
    if returncode == 0 and len(curve) >= 2:
        before, after = 100 * curve[0][1], 100 * curve[-1][1]
        tail = statistics.mean(100 * p for _, p in curve[1:][-window:])
        record.update(before=before, after=after, after_window=round(tail, 2), gain=round(after - before, 2),
                      gain_window=round(tail - before, 2))
    return record


def summary(records: list[dict], args: argparse.Namespace) -> str:
    """The markdown table of every finished run and the gain's distribution."""
    ok = [r for r in records if "gain" in r]
    lines = [f"# quickstart sweep ({len(ok)} of {len(records)} runs finished; config {args.config}; "
             f"overrides {' '.join(args.set) or 'none'})", "",
             "| warm start | RL seed | BEFORE | AFTER | gain | mean of last evals | its gain | wall s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in sorted(records, key=lambda r: (r["warm_start"], r["seed"])):
        if "gain" in r:
            lines.append(f"| {r['warm_start']} | {r['seed']} | {r['before']:.1f} | {r['after']:.1f} | "
                         f"{r['gain']:+.1f} | {r['after_window']:.1f} | {r['gain_window']:+.1f} | {r['wall_s']:.0f} |")
        else:
            lines.append(f"| {r['warm_start']} | {r['seed']} | failed (exit {r['returncode']}) | | | | | "
                         f"{r['wall_s']:.0f} |")
    if ok:
        lines += ["", "| warm start | BEFORE | gains (last eval) | gains (mean of last evals) |", "|---|---|---|---|"]
        for ws in sorted({r["warm_start"] for r in ok}):
            mine = [r for r in ok if r["warm_start"] == ws]
            last = ", ".join(f"{r['gain']:+.1f}" for r in mine)
            tail = ", ".join(f"{r['gain_window']:+.1f}" for r in mine)
            lines.append(f"| {ws} | {mine[0]['before']:.1f} | {last} | {tail} |")
        lines.append("")
        for key, label in (("gain", "last evaluation"), ("gain_window", f"mean of the last {args.window} evaluations")):
            gains = sorted(r[key] for r in ok)
            lines.append(f"gain over {len(gains)} runs ({label}): min {gains[0]:+.1f}, median "
                         f"{statistics.median(gains):+.1f}, max {gains[-1]:+.1f}; "
                         f"{sum(g >= 10 for g in gains)} of {len(gains)} at least +10")
        befores = sorted({r["before"] for r in ok})
        lines.append(f"BEFORE spans {befores[0]:.1f}% to {befores[-1]:.1f}% over {len(befores)} distinct values")
    return "\n".join(lines) + "\n"


def core_sets(parallel: int, per_run: int) -> list[list[int]]:
    """Disjoint core sets, one per concurrent run, from this process's affinity; [] each (no
    pinning) when there are too few cores."""
    cores = sorted(os.sched_getaffinity(0))
    if parallel * per_run > len(cores):
        return [[] for _ in range(parallel)]
    return [cores[i * per_run : (i + 1) * per_run] for i in range(parallel)]


def launch(argv: list[str], cores: list[int], log: Path, env: dict) -> subprocess.Popen:
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    with open(log, "w") as f:
        return subprocess.Popen(argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env, preexec_fn=pin,
                                start_new_session=True)  # its own process group: stopped as one


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


BUILD = ("import sys; from stabledrl.common.config.job import load_job_config; "
         "from stabledrl.recipes.warmstart import warm_start; "
         "warm_start(load_job_config(sys.argv[1], sys.argv[2:]))")


def build_warm_starts(args: argparse.Namespace, env: dict, slots: list[list[int]]) -> None:
    """Every warm start of the grid, ``len(slots)`` at a time (each is cached, so the runs reuse it)."""
    pending, active, free = list(args.warm_starts), [], list(range(len(slots)))
    while pending or active:
        while pending and free:
            spec, slot = pending.pop(0), free.pop(0)
            log = args.runs_dir / f"warmstart-{spec.replace('=', '').replace(',', '-')}.log"
            argv = [args.python, "-c", BUILD, str(args.config), *warm_start_overrides(spec), *args.set]
            active.append((spec, slot, launch(argv, slots[slot], log, env)))
        time.sleep(1)
        for spec, slot, proc in list(active):
            if proc.poll() is not None:
                active.remove((spec, slot, proc))
                free.append(slot)
                state = "built" if proc.returncode == 0 else f"FAILED (exit {proc.returncode}), see {args.runs_dir}"
                print(f"warm start {spec}: {state}", flush=True)


def previous_records(path: Path) -> list[dict]:
    """The finished runs an earlier sweep into the same --out recorded (they are not run again)."""
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    return [r for r in records if "gain" in r]


def sweep(args: argparse.Namespace) -> list[dict]:
    args.out.mkdir(parents=True, exist_ok=True)
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", RAY_USAGE_STATS_ENABLED="0")
    env.setdefault("RAY_DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES", str(2 * 10**9))  # many local Ray instances at once
    if not args.gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    slots = core_sets(args.parallel, args.cores_per_run)
    t0 = time.monotonic()
    build_warm_starts(args, env, slots)  # cached ones are found at once
    records = previous_records(args.out / "results.jsonl")
    done = {(r["warm_start"], r["seed"]) for r in records}
    queue = [Run(ws, seed, args.runs_dir / f"{ws.replace('=', '').replace(',', '-')}" / f"seed{seed}")
             for seed in args.seeds for ws in args.warm_starts if (ws, seed) not in done]  # one seed of each first
    active: list[Run] = []
    free = list(range(len(slots)))
    while queue or active:
        while queue and free and time.monotonic() - t0 < args.budget_s:
            run = queue.pop(0)
            run.slot = free.pop(0)
            run.cores, run.started = slots[run.slot], time.monotonic()
            run.out.mkdir(parents=True, exist_ok=True)
            argv = [
                args.python,
                "-m",
                "stabledrl",
                "train",
                "--overwrite",
                "--config",
                str(args.config),  # unfinished: again
                f"run.output_dir={run.out}",
                f"run.seed={run.seed}",
                *warm_start_overrides(run.warm_start),
                f"cluster.local_num_cpus={max(2, args.cores_per_run)}",
                *QUIET,
                *args.set,
            ]
            run.proc = launch(argv, run.cores, run.out / "train.log", env)
            active.append(run)
        if not active:
            break  # the budget is spent and nothing is running
        time.sleep(2)
        overdue = time.monotonic() - t0 > args.budget_s + args.grace_s
        for run in list(active):
            if run.proc.poll() is None and overdue:
                stop(run.proc)
            code = run.proc.poll()
            if code is None:
                continue
            active.remove(run)
            free.append(run.slot)
            record = run_record(run, code, args.window)
            records.append(record)
            with open(args.out / "results.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")
            (args.out / "summary.md").write_text(summary(records, args))
            if "gain" in record:
                shown = (f"{record['before']:.1f} -> {record['after']:.1f} ({record['gain']:+.1f}; last-evals mean "
                         f"{record['after_window']:.1f})")
            else:
                shown = f"failed (exit {code}), see {run.out}/train.log"
            print(f"[{time.monotonic() - t0:5.0f} s] {run.name}: {shown}, {record['wall_s']:.0f} s", flush=True)
    if records:
        (args.out / "summary.md").write_text(summary(records, args))
    skipped = len(queue)
    if skipped:
        print(f"budget spent: {skipped} runs not started", flush=True)
    return records


def parse(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=CONFIG, help="the recipe (default: the quickstart's)")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "quickstart_sweep", help="results and run directories")
    p.add_argument("--runs-dir", type=Path, help="the runs' own directories and logs (default: OUT/runs)")
    p.add_argument("--warm-starts", nargs="+", default=list(WARM_STARTS), metavar="SPEC",
                   help="warmstart overrides per warm start, e.g. seed=1,steps=200,threads=1")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="RL seeds (run.seed) per warm start")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for every run")
    p.add_argument("--parallel", type=int, default=2, help="runs at a time")
    p.add_argument("--cores-per-run", type=int, default=2, help="cores pinned to each run (if the machine has enough)")
    p.add_argument("--budget-s", type=float, default=float("inf"), help="start no run after this many seconds")
    p.add_argument("--grace-s", type=float, default=240.0, help="stop runs still going this long after the budget")
    p.add_argument("--window", type=int, default=3, help="last evaluations (after step 0) averaged for the window gain")
    p.add_argument("--gpu", action="store_true", help="let the runs see CUDA (default: CPU only)")
    p.add_argument("--python", default=sys.executable, help="the interpreter the runs use")
    args = p.parse_args(argv)
    args.out = args.out.resolve()
    args.runs_dir = (args.runs_dir or args.out / "runs").resolve()
    args.config = args.config.resolve()
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse(argv)
    records = sweep(args)
    print((args.out / "summary.md").read_text() if records else "no run finished", end="")
    return 0 if records and all("gain" in r for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
