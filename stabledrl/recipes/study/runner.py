"""Running a study: one warm start, one Ray instance, every (method, seed) run through the
coordinator's own Driver, ``concurrency`` runs at a time.

    study = load_study_config("deploy/configs/study_cpu.yaml")
    result = run_study(study)        # output_dir/METHOD/seedN/metrics.jsonl (+ table, figure: report.py)

Runs go in seed-major order (every method's seed 0, then seed 1, ...), so a study cut short by
its deadline still compares the methods on the same seeds. With concurrency K > 1 the runs are
dealt round-robin to K *lanes*: driver processes attached to the same Ray instance, each in its
own Ray namespace (a job's placement groups and named actors are per namespace), each running
its runs one after another. With K = 1 the one lane is this process. Every finished, stopped or
failed run appends one line to ``output_dir/outcomes.jsonl``; a failed run does not stop the others.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from stabledrl.common.job_log import labelled, show_log
from stabledrl.coordinator.driver import DeadlineReached, Driver
from stabledrl.recipes.stages import JOB_STAGES
from stabledrl.recipes.study.config import StudyConfig, run_config, warmstart_config
from stabledrl.recipes.warmstart import warm_start
from stabledrl.coordinator.runtime.watchdog import watch_descendants
from stabledrl.recipes.study.report import load_study_file

log = logging.getLogger(__name__)
OUTCOMES = "outcomes.jsonl"
# a lane process; not `-m stabledrl.recipes.study.runner`, which the package has imported already (runpy warns)
LANE_ENTRY = "import sys; from stabledrl.recipes.study.runner import main; sys.exit(main(sys.argv[1:]))"


@dataclass
class RunOutcome:
    method: str
    seed: int
    status: str  # "finished" | "stopped" (deadline) | "failed" | "not started"
    wall_s: float = 0.0
    error: str = ""


@dataclass
class StudyResult:
    outcomes: list[RunOutcome] = field(default_factory=list)
    warmstart_s: float = 0.0
    wall_s: float = 0.0
    model_path: Optional[Path] = None

    @property
    def statuses(self) -> dict[tuple[str, int], str]:
        return {(o.method, o.seed): o.status for o in self.outcomes}


def run_study(study: StudyConfig, *, study_file: Optional[Path] = None) -> StudyResult:
    """Warm-start once, then every run (module docstring). Ray is started here (a local instance,
    or the cluster RAY_ADDRESS names) unless this process is already connected. ``study_file``:
    the study's JSON (report.save_study_config), which lane processes read; needed for K > 1."""
    import ray

    t_start = time.time()
    result = StudyResult()
    result.model_path = shared_warm_start(study)
    result.warmstart_s = time.time() - t_start
    deadline = t_start + study.deadline_s if study.deadline_s else None
    (study.output_dir / OUTCOMES).unlink(missing_ok=True)
    own_ray = not ray.is_initialized()
    if own_ray:
        start_ray(warmstart_config(study))
    try:
        lanes = min(study.concurrency, len(study.runs))
        if lanes == 1:
            run_lane(study, study.runs, result.model_path, deadline)
        else:
            if study_file is None:
                raise ValueError("concurrency > 1 needs the study file the lane processes read (save_study_config)")
            run_lane_processes(study, lanes, study_file, result.model_path, deadline,
                               ray.get_runtime_context().gcs_address)
    finally:
        if own_ray:
            ray.shutdown()
    result.outcomes = read_outcomes(study)
    result.wall_s = time.time() - t_start
    return result


def run_lane(study: StudyConfig, runs: Sequence[tuple[str, int]], model_path: Path,
             deadline: Optional[float]) -> None:
    """The runs of one lane, one after another, in this process's Ray connection."""
    for method, seed in runs:
        if deadline is not None and time.time() > deadline:
            outcome = RunOutcome(method, seed, "not started")
        else:
            outcome = run_one(study, method, seed, model_path, deadline)
        with (study.output_dir / OUTCOMES).open("a") as f:  # one short line per write: no interleaving
            f.write(json.dumps(asdict(outcome)) + "\n")


def run_one(study: StudyConfig, method: str, seed: int, model_path: Path, deadline: Optional[float]) -> RunOutcome:
    cfg = run_config(study, method, seed, model_path=model_path)
    name = f"{method}/seed{seed}"
    t0 = time.time()
    try:
        with labelled(f"[{name}] "):  # every line of the run names it
            run = Driver(cfg, deadline=deadline, stages=JOB_STAGES).run()
    except DeadlineReached as e:
        log.info(f"[{name}] stopped: {e}")
        return RunOutcome(method, seed, "stopped", time.time() - t0, str(e))
    except Exception as e:  # one run's failure is reported; the study goes on
        log.info(f"[{name}] failed: {type(e).__name__}: {e}")
        return RunOutcome(method, seed, "failed", time.time() - t0, f"{type(e).__name__}: {e}")
    after = "n/a" if run.after is None else f"{100 * run.after.pass_at_1:.1f}%"
    log.info(f"[{name}] done: {run.steps} steps in {time.time() - t0:.0f} s, held-out pass@1 {after}")
    return RunOutcome(method, seed, "finished", time.time() - t0)


def run_lane_processes(study: StudyConfig, lanes: int, study_file: Path, model_path: Path,
                       deadline: Optional[float], address: str) -> None:
    """K lane processes (``runner.main`` in a fresh interpreter), run i going to lane i mod K;
    their output goes to this process's stdout, line by line."""
    repo = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))}
    procs = []
    for lane in range(lanes):
        cmd = [sys.executable, "-c", LANE_ENTRY, "--study", str(study_file), "--model", str(model_path),
               "--address", address, "--lane", str(lane), "--lanes", str(lanes)]
        if deadline is not None:
            cmd += ["--deadline", repr(deadline)]
        procs.append(subprocess.Popen(cmd, env=env, cwd=os.getcwd()))
    codes = [p.wait() for p in procs]
    if any(codes):
        print(f"study: lane exit codes {codes} (see the lines above)", flush=True)


def read_outcomes(study: StudyConfig) -> list[RunOutcome]:
    """The outcome of every run, in the study's order ('not started' where a lane left none)."""
    path = study.output_dir / OUTCOMES
    found = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                o = RunOutcome(**json.loads(line))
                found[(o.method, o.seed)] = o
    return [found.get(run, RunOutcome(run[0], run[1], "not started")) for run in study.runs]


def shared_warm_start(study: StudyConfig) -> Path:
    """The one warm-started model every run starts from (cached by content hash), or the job's
    own model directory when the job has no warmstart section."""
    cfg = warmstart_config(study)
    if cfg.warmstart is None:
        if cfg.model.path is None:
            raise ValueError("job: a study needs a model directory (model.path) or a warmstart section; "
                             "a random preset would give every method nothing to learn from")
        return Path(cfg.model.path)

    t0 = time.time()
    path = warm_start(cfg)
    log.info(f"warm start: {path} ({time.time() - t0:.1f} s)")
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the SFT's cached blocks are the actors' now
    return Path(path)


def start_ray(cfg, address: Optional[str] = None, namespace: Optional[str] = None) -> None:
    """Join ``address`` (a lane), the cluster RAY_ADDRESS names, or start a local instance. The
    repository goes on the workers' PYTHONPATH, so actors import it without an install."""
    import logging

    import ray

    repo = str(Path(__file__).resolve().parents[3])
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(filter(None, [repo, os.environ.get("PYTHONPATH")])))
    if address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=address, namespace=namespace, log_to_driver=True, logging_level=logging.WARNING)
        return
    ray.init(address="local", num_cpus=cfg.cluster.local_num_cpus, include_dashboard=False, log_to_driver=True,
             logging_level=logging.WARNING)

    watch_descendants()  # the instance ends with this process, however it ends


def main(argv: Optional[list[str]] = None) -> int:
    """A lane process: its share of the study's runs, in its own Ray namespace."""
    ap = argparse.ArgumentParser(description="one lane of a stabledrl study (started by run_study)")
    ap.add_argument("--study", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--address", required=True)
    ap.add_argument("--lane", type=int, required=True)
    ap.add_argument("--lanes", type=int, required=True)
    ap.add_argument("--deadline", type=float, default=None)
    a = ap.parse_args(argv)
    import ray

    study = load_study_file(a.study)
    start_ray(None, address=a.address, namespace=f"stabledrl-study-lane{a.lane}")
    undo = show_log()  # a lane's lines go to its stdout, which the study's process reads line by line
    try:
        run_lane(study, study.runs[a.lane :: a.lanes], Path(a.model), a.deadline)
    finally:
        undo()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
