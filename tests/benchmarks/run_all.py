"""The component benchmarks: each job its own process with its own timeout, and always what came
back: ``results.json`` (every job's full record), ``table.md`` (one row per target) and ``run.log``
(all output) in ``--out`` (default ``$OUT``, else runs/bench/components), rewritten after every job
(a run cut short keeps what it measured), and at the end a copy of the first two under
tests/benchmarks/results/ named by the suite and the card (a GPU run only: commit it with the
BENCHMARKS.md rows it backs). Jobs write their own JSON into a scratch directory.

``--suite NAME`` (tests/benchmarks/suites.py) picks what runs; ``components``, the default, is the
two-lane plan on 2 GPUs:

    lane GPU 0:  matmul -> full_attention -> ipc_push (the denominators, samplers, same-device push)
    lane GPU 1:  matmul -> block_diffusion -> lora_push -> learner_1gpu
    then:        push -> async -> learner_2gpu

With one GPU the lanes run one after the other and the 2-GPU jobs are skipped; another suite runs its
jobs one after another, skipping those that need more GPUs than there are. ``--tiny`` runs a suite
on the CPU at toy shapes (gloo), which is how it is rehearsed before GPU time is spent.

``--quick`` (components only) is the short re-measure: fewer and shorter runs per job
(full_attention/block_diffusion ``--quick``; learner_1gpu: ZeRO-2 as the project runs it and with
overlap_comm (2t), checkpointing off, micro-batches of 2, 3 and 4 groups, 2 timed steps, one
profiled step of 2t, on GPU 0 after full_attention; push: 2 repetitions; ipc_push: 4 layers, 2
repetitions). Combine with ``--only`` to run some jobs alone.

A job that fails or times out is recorded as such and the next one starts; a job that exits 0 but
recorded a failed part (its ``errors``) or no result is ``failed`` too, and any failed, timed-out or
deadline-skipped job makes the run exit 1 (a table of what did run is still written); a global deadline
(``--deadline-s``) shortens the last timeouts so the whole run ends in time.

    python3 tests/benchmarks/run_all.py --out runs/bench/components        # 2 GPUs
    python3 tests/benchmarks/run_all.py --suite sampler --out runs/bench/sampler
    .venv/bin/python tests/benchmarks/run_all.py --suite sampler --tiny --out /tmp/sampler   # CPU rehearsal
    .venv/bin/python tests/benchmarks/run_all.py --rehearsal --out /tmp/bench      # components, fewest reps
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import suites  # noqa: E402

# NVLink multicast stays off (NCCL, torch's symmetric memory, NVSHMEM): every child process
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
            "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


@dataclass
class Job:
    name: str
    script: str
    args: list[str]
    gpus: list[int]  # CUDA devices it uses ([] on CPU)
    timeout_s: float
    peak_from: str | None = None  # the matmul job whose rate is this job's denominator
    record: dict = field(default_factory=dict)


# --quick: (timeout s, extra arguments) of each job that has a short form
QUICK = {
    "full_attention": (120, ["--quick"]),
    "block_diffusion": (120, ["--quick"]),
    "learner_1gpu": (
        150,
        [
            "--stages",
            "2,2t",
            "--checkpointing",
            "off",
            "--micro-batch-groups",
            "2,3,4",
            "--steps",
            "2",
            "--profile",
            "2t",
        ],
    ),
    "push": (45, ["--reps", "2"]),
    "ipc_push": (60, ["--layers", "4", "--reps", "2"]),
}


# --rehearsal (the CPU check that `make test` runs: tests/benchmarks/test_rehearsal.py): every job of the
# plan, at the tiny shapes, with the fewest repetitions that still run each of its code paths (after
# --quick's arguments; the last of a repeated flag wins)
REHEARSAL = {
    "matmul_gpu0": ["--reps", "3"],
    "matmul_gpu1": ["--reps", "3"],
    "learner_1gpu": [
        "--stages",
        "2,3o",
        "--checkpointing",
        "on",
        "--micro-batch-groups",
        "2",
        "--steps",
        "1",
        "--profile",
        "2",
    ],
    "learner_2gpu": ["--stages", "3", "--checkpointing", "off", "--steps", "1"],
    "push": ["--reps", "1"],
    "async": ["--steps", "2", "--skip", "1"],
    "lora_push": ["--reps", "1", "--rank", "4"],
}


def device_list(indices: list[int], visible: Optional[str]) -> str:
    """CUDA_VISIBLE_DEVICES for a part planned on GPU ``indices`` of the GPUs this runner sees: the
    indices count within an inherited CUDA_VISIBLE_DEVICES (a runner started with "2,3" gives its
    part [0, 1] the devices 2 and 3, not the neighbour's 0 and 1)."""
    if not visible or not visible.strip():
        return ",".join(str(g) for g in indices)
    devices = [d.strip() for d in visible.split(",") if d.strip()]
    if max(indices) >= len(devices):
        raise ValueError(f"GPU {max(indices)} planned, but CUDA_VISIBLE_DEVICES={visible} shows {len(devices)}")
    return ",".join(devices[g] for g in indices)


def plan(n_gpus: int, tiny: bool, work: Path, quick: bool = False, rehearsal: bool = False
         ) -> tuple[list[list[Job]], list[Job], dict[str, str]]:
    """(parallel lanes, jobs after the lanes, skipped job -> reason)."""
    tiny, quick = tiny or rehearsal, quick or rehearsal
    t = ["--tiny"] if tiny else []
    # a shared 2-core CPU is slower than a GPU at toy shapes; a rehearsal in a test run shares it with more
    scale = 3.0 if rehearsal else 1.5 if tiny else 1.0
    skipped: dict[str, str] = {}

    def job(name, script, gpus, timeout, extra=(), peak=None):
        if quick and name in QUICK:
            timeout, more = QUICK[name]
            extra = [*extra, *more]
        if rehearsal:
            extra = [*extra, *REHEARSAL.get(name, [])]
        return Job(name, script, [*t, *extra, "--out", str(work / f"{name}.json")], gpus, timeout * scale, peak)

    if n_gpus >= 2 or (n_gpus == 0 and tiny):
        g0, g1 = ([0], [1]) if n_gpus else ([], [])
        both = [0, 1] if n_gpus else []
        lane0 = [job("matmul_gpu0", "bench_matmul.py", g0, 90),
                 job("full_attention", "bench_full_attention.py", g0, 300, peak="matmul_gpu0"),
                 job("ipc_push", "bench_ipc_push.py", g0, 180)]
        lane1 = [job("matmul_gpu1", "bench_matmul.py", g1, 90),
                 job("block_diffusion", "bench_block_diffusion.py", g1, 180, peak="matmul_gpu1"),
                 job("lora_push", "bench_lora_push.py", g1, 240, ["--engine"]),
                 job("learner_1gpu", "bench_learner.py", g1, 240, ["--world", "1"], peak="matmul_gpu1")]
        after = [job("push", "bench_push.py", both, 150), job("async", "bench_async.py", both, 240),
                 job("learner_2gpu", "bench_learner.py", both, 240, ["--world", "2"], peak="matmul_gpu0")]
        if quick:  # the learner's shorter form fits after full_attention on GPU 0: both lanes end together
            learner = lane1.pop()
            lane0.append(job("learner_1gpu", "bench_learner.py", g0, 240, ["--world", "1"], peak="matmul_gpu0"))
            del learner
        lanes = [lane0, lane1] if n_gpus else [lane0 + lane1]
        return lanes, after, skipped
    if n_gpus == 1:
        lane = [job("matmul_gpu0", "bench_matmul.py", [0], 90),
                job("full_attention", "bench_full_attention.py", [0], 300, peak="matmul_gpu0"),
                job("block_diffusion", "bench_block_diffusion.py", [0], 180, peak="matmul_gpu0"),
                job("lora_push", "bench_lora_push.py", [0], 240, ["--engine"]),
                job("ipc_push", "bench_ipc_push.py", [0], 180),
                job("learner_1gpu", "bench_learner.py", [0], 240, ["--world", "1"], peak="matmul_gpu0")]
        for name in ("learner_2gpu", "push", "async"):
            skipped[name] = "needs 2 GPUs"
        return [lane], [], skipped
    raise SystemExit("no CUDA device: run with --tiny (toy shapes on the CPU) to check the suite")


def plan_suite(name: str, n_gpus: int, tiny: bool, work: Path) -> tuple[list[list[Job]], list[Job], dict[str, str]]:
    """A named suite's plan: its jobs one after another in one lane, those needing more than ``n_gpus``
    GPUs skipped and named; ``tiny`` adds ``--tiny`` and each job's rehearsal arguments (on a machine
    without CUDA every job runs on the CPU, ``n_gpus`` then the plan being rehearsed)."""
    chosen = suites.suite("run_all", name)
    if name == "components":
        raise ValueError("components is run_all's own plan (plan())")
    cpu = tiny and not _has_cuda()
    lane, skipped = [], {}
    for spec in chosen.jobs:
        if max(spec.gpus) >= n_gpus:
            skipped[spec.name] = f"needs {max(spec.gpus) + 1} GPUs"
            continue
        args = [*(["--tiny"] if tiny else []), *spec.args, *(spec.tiny if tiny else ()),
                "--out", str(work / f"{spec.name}.json")]
        lane.append(Job(spec.name, spec.script, args, [] if cpu else list(spec.gpus),
                        spec.timeout_s * (3.0 if tiny else 1.0), spec.peak))
    return [lane], [], skipped


def _has_cuda() -> bool:
    import torch  # no CUDA context in this process: device_count reads the driver only

    return torch.cuda.device_count() > 0


def select(lanes: list[list[Job]], after: list[Job], skipped: dict[str, str], only: str | None):
    """The plan restricted to the jobs named in ``only`` (a comma list; the matmul jobs always run:
    they are the denominators); the others are added to ``skipped``."""
    if not only:
        return lanes, after, skipped
    names = set(only.split(","))
    for job in [j for lane in lanes for j in lane] + after:
        if job.name not in names and not job.name.startswith("matmul"):
            skipped[job.name] = "not in --only"
    lanes = [[j for j in lane if j.name not in skipped] for lane in lanes]
    return lanes, [j for j in after if j.name not in skipped], skipped


class Runner:
    def __init__(self, out: Path, deadline_s: float, n_gpus: int, tiny: bool) -> None:
        self.out, self.t0, self.deadline = out, time.monotonic(), time.monotonic() + deadline_s
        self.work = Path(tempfile.mkdtemp(prefix="stabledrl-bench-"))  # the jobs' own JSON files
        self.n_gpus, self.tiny = n_gpus, tiny
        self.log_file = open(out / "run.log", "w", buffering=1)
        self.lock = threading.Lock()
        self.jobs: dict[str, Job] = {}
        self.skipped: dict[str, str] = {}
        self.suite = "components"

    def say(self, text: str) -> None:
        line = f"[{time.monotonic() - self.t0:7.1f}s] {text}"
        with self.lock:
            print(line, flush=True)
            self.log_file.write(line + "\n")

    def run(self, job: Job) -> None:
        self.jobs[job.name] = job
        left = self.deadline - time.monotonic()
        if left < 30:
            job.record = {"status": "skipped", "reason": f"deadline: {left:.0f} s left"}
            self.say(f"SKIP {job.name}: {job.record['reason']}")
            return
        timeout = min(job.timeout_s, left)
        args = list(job.args)
        if job.peak_from:
            args += ["--peak-from", str(self.work / f"{job.peak_from}.json")]
        env = dict(os.environ, **SAFE_ENV)
        if job.gpus:
            env["CUDA_VISIBLE_DEVICES"] = device_list(job.gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
        cmd = [suites.python(), str(HERE / job.script), *args]
        self.say(f"START {job.name} on {'GPU ' + ','.join(map(str, job.gpus)) if job.gpus else 'CPU'} "
                 f"(timeout {timeout:.0f} s): {' '.join(cmd[1:])}")
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                cwd=HERE.parents[1], start_new_session=True, errors="replace")
        reader = threading.Thread(target=self._pump, args=(job.name, proc), daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=timeout)
            status = "ok" if rc == 0 else "failed"
        except subprocess.TimeoutExpired:
            stop_group(proc)
            rc, status = proc.wait(), "timeout"
        reader.join(timeout=10)
        wall = time.monotonic() - start
        result = self._read(job)
        status = job_status(status, result)
        job.record = {"status": status, "rc": rc, "wall_s": round(wall, 1), "timeout_s": round(timeout, 1),
                      "result": result}
        errors = (result or {}).get("errors") or {}
        self.say(f"END {job.name}: {status} (rc {rc}) in {wall:.0f} s"
                 + (f"; failed parts: {', '.join(errors)}" if errors else "")
                 + ("; wrote no result" if result is None else ""))
        self.snapshot()

    def failures(self) -> dict[str, str]:
        """Every job that did not finish cleanly, with its status: failed, timeout, or skipped for
        the deadline or a dependency that did not finish (a job left out by the plan or by --only
        is not a failure). The run exits non-zero when this is not empty."""
        out = {name: job.record.get("status", "not run") for name, job in self.jobs.items()
               if job.record.get("status") != "ok"}
        return {name: status for name, status in out.items() if name not in self.skipped}

    def snapshot(self) -> tuple[dict, str]:
        """Write results.json and table.md as they stand (after every job, and at the end)."""
        import report

        with self.lock:
            records = {name: job.record for name, job in self.jobs.items() if job.record}
            records.update({name: {"status": "skipped", "reason": why} for name, why in self.skipped.items()})
            data = {"suite": self.suite, "finished": dt.datetime.now().isoformat(timespec="seconds"),
                    "gpus": self.n_gpus, "tiny": self.tiny, "wall_s": round(time.monotonic() - self.t0, 1),
                    "jobs": records}
            _write(self.out / "results.json", json.dumps(data, indent=1))
            try:
                table = report.table(data)
            except Exception as exc:  # noqa: BLE001 - the raw results are written already
                table = f"(table failed: {exc!r}; see results.json)"
            _write(self.out / "table.md", table + "\n")
        return data, table

    def _pump(self, name: str, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            line = line.rstrip()
            with self.lock:
                self.log_file.write(f"[{name}] {line}\n")
                if _worth_echoing(line):
                    print(f"[{name}] {line[:300]}", flush=True)

    def run_plan(self, lanes: list[list[Job]], after: list[Job]) -> None:
        """Each lane in a thread of its own (its jobs one after another), then ``after`` in order."""
        threads = [threading.Thread(target=lambda lane=lane: [self.run(j) for j in lane]) for lane in lanes]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        for job in after:
            self.run(job)

    def _read(self, job: Job) -> dict | None:
        path = self.work / f"{job.name}.json"
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None


def job_status(status: str, result: dict | None) -> str:
    """A job that exited 0 is ``ok`` only if it wrote its result and no part of it failed: a part
    whose error the script recorded and carried on from makes the job ``failed`` all the same."""
    if status == "ok" and (result is None or (result.get("errors") or {})):
        return "failed"
    return status


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _worth_echoing(line: str) -> bool:
    """Progress and errors reach the console; library warnings go to run.log only."""
    noisy = ("Warning", "warn(", "warnings.warn", "[WARNING]", "return func(", "deprecated", "[transformers]")
    return not any(n in line for n in noisy)


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line, a suite's arguments first (suites.expand)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="components", help=f"what runs: {', '.join(suites.RUN_ALL)} (suites.py)")
    ap.add_argument("--tiny", action="store_true", help="toy shapes (the suite's CPU rehearsal)")
    ap.add_argument("--out", default=os.environ.get("OUT") or None, help="default runs/bench/SUITE")
    ap.add_argument("--deadline-s", type=float, default=None,
                    help="the whole run ends within this (components 510, --quick 190; other suites 7200)")
    ap.add_argument("--only", default=None, help="comma list of job names to run (others skipped)")
    ap.add_argument("--quick", action="store_true", help="components: the short re-measure (the module docstring)")
    ap.add_argument("--rehearsal", action="store_true",
                    help="components at the tiny shapes with the fewest repetitions (the CPU check `make test` runs)")
    ap.add_argument("--no-copy", action="store_true", help="no copy of the record under tests/benchmarks/results/")
    ap.add_argument("--prompt-lengths-from", default=None,
                    help="graph_pool: a JSONL of prompts to take the lengths from (e.g. GSM8K's train.jsonl)")
    ap.add_argument("--gpus", type=int, default=None,
                    help="GPUs to schedule for (default: all visible); with --tiny on a CPU, the plan to rehearse")
    return ap.parse_args(suites.expand("run_all", argv))


def main() -> None:
    a = parse(sys.argv[1:])
    chosen = suites.suite("run_all", a.suite)
    if a.suite != "components" and (a.quick or a.rehearsal):
        raise SystemExit(f"--quick and --rehearsal are the components suite's; --suite {a.suite} --tiny rehearses it")
    a.tiny = a.tiny or a.rehearsal
    default_deadline = 1200.0 if a.rehearsal else 190.0 if a.quick else 510.0 if a.suite == "components" else 7200.0
    a.deadline_s = a.deadline_s or default_deadline
    out = Path(a.out or Path("runs") / "bench" / a.suite)
    out.mkdir(parents=True, exist_ok=True)
    import torch  # no CUDA context in this process: device_count reads the driver only

    n_gpus = torch.cuda.device_count()
    if a.gpus is not None:
        if a.gpus > n_gpus and not a.tiny:
            raise SystemExit(f"--gpus {a.gpus}: only {n_gpus} visible")
        n_gpus = a.gpus
    if a.tiny and not torch.cuda.device_count() and a.gpus is None and a.suite != "components":
        n_gpus = chosen.min_gpus  # a CPU rehearsal of the plan for the suite's own GPUs
    if not a.tiny and n_gpus < chosen.min_gpus:
        raise SystemExit(f"--suite {a.suite} needs {chosen.min_gpus} GPUs, {n_gpus} here; --tiny rehearses it on a CPU")
    runner = Runner(out, a.deadline_s, n_gpus, a.tiny)
    runner.suite = a.suite
    runner.say(f"stabledrl benchmarks: suite {a.suite}, {n_gpus} GPU(s), torch {torch.__version__}, tiny={a.tiny}, "
               f"quick={a.quick}, deadline {a.deadline_s:.0f} s, out={out}")
    if a.suite == "components":
        planned = plan(n_gpus, a.tiny, runner.work, a.quick, a.rehearsal)
    else:
        planned = plan_suite(a.suite, n_gpus, a.tiny, runner.work)
    lanes, after, skipped = select(*planned, a.only)
    if a.prompt_lengths_from:
        for job in [j for lane in lanes for j in lane] + after:
            if job.script == "bench_full_attention.py":
                job.args += ["--prompt-lengths-from", a.prompt_lengths_from]
    runner.skipped = skipped
    runner.run_plan(lanes, after)
    name = a.suite + ("-quick" if a.quick else "")
    finish(runner, name, copy=not (a.no_copy or a.tiny))
    failed = runner.failures()
    if failed:
        runner.say("FAILED: " + ", ".join(f"{name} ({status})" for name, status in failed.items()))
        sys.exit(1)


def stop_group(
    proc: subprocess.Popen, ladder: tuple[tuple[int, float], ...] = ((signal.SIGTERM, 10), (signal.SIGKILL, 10))
) -> None:
    """Signal ``proc``'s process group (the job and the processes it started) with each signal of
    ``ladder`` in turn, waiting its seconds, until the process has exited."""
    for sig, wait in ladder:
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def finish(runner: Runner, name: str, copy: bool = True) -> None:
    """The final results.json and table.md (the table is printed last), and their copies under
    tests/benchmarks/results/ (suites.keep)."""
    import report

    data, table = runner.snapshot()
    shutil.rmtree(runner.work, ignore_errors=True)
    if copy:
        shape = suites.RUN_ALL[runner.suite].shape
        kept = suites.keep(runner.out, suites.record_name(name, shape, report.card(data), data["gpus"]), "table.md")
        runner.say(f"copied results.json and table.md to {kept}.*")
    runner.say(f"wrote {runner.out}/results.json, table.md, run.log")
    print("\n" + table, flush=True)


if __name__ == "__main__":
    main()
