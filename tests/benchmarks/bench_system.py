"""The system benchmark: the real job (``python -m stabledrl train`` = ``stabledrl train``, a
shipped config plus overrides) on random weights at the family's real shape, measured from
outside and from inside.

Inside: every actor's own clock (``time/<actor>/*`` in the job's metrics.jsonl: generate, score,
reward, push stage / receive for a rollout worker; train, push, checkpoint, checkpoint write for a
learner rank; idle = wall - the main thread's busy seconds; common/actor_time.py), the
coordinator's step / train / push times, perf/mfu against the measured matmul rate
(``--peak-from``, bench_matmul's JSON: the job's run.peak_tflops is set to it). Outside:
nvidia-smi every 200 ms (each actor's GPU busy fraction and memory), the time from the command's
start to its first step. The report (system_report.py) covers the steps after ``--skip``.

The overrides are the fewest that make the shipped config run here: the model directory (a random
checkpoint in the family's released layout, random_checkpoint.py), the data paths (generated
JSONL rows with the config's column names), ranks and workers (``--ranks``, ``--workers``: the
4-GPU stand-in of an 8-GPU config), ``run.steps``, the output directory, a checkpoint at
``--checkpoint-at`` (no final checkpoint or export), ``eval.num_prompts`` (time), ``run.peak_tflops``
and progress/TensorBoard off. ``--set key=value`` adds more (the variants of a tuning run).
``--resume-check`` then runs ``train --resume RUN_DIR`` to the same last step: it must continue
from the checkpoint (the log's "resumed at step k") and finish.

``--tiny`` swaps the shape for the family's tiny preset at the same layout and runs on the CPU
(gloo, 0.5 CPU per actor) with a shorter generation, G = 4 and 2 groups per step: the same code
path, in a minute (tests/benchmarks/test_bench_system.py). ``--engine-only`` measures the rollout
engine alone on one GPU with the job's sampler settings and request size (the reference of the
in-job rollout throughput).

    python tests/benchmarks/bench_system.py --config deploy/configs/llada8b_1node.yaml \\
        --model-dir /tmp/ckpt/llada-8b --ranks 3 --workers 1 --steps 5 --checkpoint-at 4 --resume-check \\
        --peak-from matmul.json --out system_llada.json
    python tests/benchmarks/bench_system.py --tiny --config deploy/configs/llada8b_1node.yaml --ranks 2 \\
        --workers 1 --steps 3 --checkpoint-at 2 --resume-check --out /tmp/system.json
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import benchlib as bl
import run_all
import suites
import system_report as report
import yaml

SHAPE_OF = {"llada": "llada-8b", "sdar": "sdar-8b"}
TINY_SHAPE_OF = {"llada": "tiny-llada", "sdar": "tiny-sdar"}
# --tiny: the CPU stand-in of the same job (shorter canvas, smaller groups; everything else as shipped)
TINY = {"llada": ["sampler.gen_length=32", "sampler.steps=32"], "sdar": ["sampler.gen_length=16"]}
TINY_COMMON = ["algorithm.group_size=4", "algorithm.groups_per_step=2", "algorithm.micro_batch_size=4",
               "cluster.learner.num_gpus=0", "cluster.rollout.num_gpus=0", "cluster.learner.num_cpus=0.5",
               "cluster.rollout.num_cpus=0.5", "cluster.local_num_cpus=4", "weights.backend=gloo",
               "learner.dist_timeout_s=300", "cluster.start_timeout_s=300", "rollout.request_timeout_s=300",
               "weights.timeout_s=120"]
WORDS = ("how many apples does the farmer sell if each basket holds twelve and she fills seven baskets on "
         "monday and five on tuesday then gives away three what is the total cost of the tickets").split()


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="a shipped job config (deploy/configs/*.yaml)")
    ap.add_argument("--tiny", action="store_true", help="the family's tiny preset on the CPU (see the docstring)")
    ap.add_argument("--model-dir", default=None, help="random checkpoint directory (written there if missing)")
    ap.add_argument("--ranks", type=int, default=None, help="learner.num_ranks (default: the config's)")
    ap.add_argument("--workers", type=int, default=None, help="rollout.num_workers (default: the config's)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--skip", type=int, default=2, help="first steps left out of the averages")
    ap.add_argument("--checkpoint-at", type=int, default=None, help="save one checkpoint after this step")
    ap.add_argument("--eval-prompts", type=int, default=32, help="eval.num_prompts (0: no held-out evaluation)")
    ap.add_argument("--resume-check", action="store_true", help="then `train --resume` the run to its last step")
    ap.add_argument("--profile-step", type=int, default=None, help="torch.profiler over this step of learner rank 0")
    ap.add_argument("--set", action="append", default=[], help="extra override key=value (repeatable)")
    ap.add_argument("--peak-from", default=None, help="bench_matmul JSON: MFU against its measured rate")
    ap.add_argument("--engine-only", action="store_true", help="the rollout engine alone (one GPU), no job")
    ap.add_argument("--work", default=None, help="scratch directory (runs, data; default: a temporary one)")
    ap.add_argument("--keep-run", action="store_true", help="keep the run directory (its checkpoints are large)")
    ap.add_argument("--timeout-s", type=float, default=1800.0,
                    help="longest the job and its resume may run together (the resume keeps 40%% of it)")
    ap.add_argument("--name", default="system")
    ap.add_argument("--out", default=None)
    return ap.parse_args()


class Stopped(BaseException):
    """SIGTERM from the runner, or the job's time is up: stop it, keep what was measured (a
    BaseException, so that no part's error handler takes it for the part's own failure)."""


def _stop(*_):
    raise Stopped()


def main() -> None:
    a = parse()
    signal.signal(signal.SIGTERM, _stop)
    res = bl.Result(a.name, a.out, vars(a), probe=not a.tiny)
    work = Path(a.work or tempfile.mkdtemp(prefix="stabledrl-system-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        raw = yaml.safe_load(Path(a.config).read_text())
        family = raw["model"].get("family") or "llada"
        model_dir = ensure_checkpoint(a, family, work, res)
        data = write_task_data(raw["task"], work)
        overrides = job_overrides(a, family, model_dir, data, work)
        res.put("overrides", {"config": a.config, "overrides": overrides})
        failed = []
        if a.engine_only:
            with res.part("engine"):
                res.put("engine", engine_reference(a, overrides))
        else:
            deadline = time.monotonic() + a.timeout_s  # the resume needs ~140 s at 8B (start-up, load, one step)
            budget = min(0.75 * a.timeout_s, a.timeout_s - 140) if a.resume_check else a.timeout_s
            with res.part("job"):
                run_and_report(
                    a, res, ["train", "--overwrite", "--config", a.config, *overrides], work / "run", "job", budget
                )
            failed = [p for p in ("job",) if (res.data["parts"].get(p) or {}).get("rc", 1) != 0]
        if a.resume_check and not a.engine_only and "job" in res.data["parts"]:
            with res.part("resume"):  # one held-out prompt: the evaluation runs, briefly
                resume = ["train", "--resume", str(work / "run"), f"run.steps={a.steps}", "eval.num_prompts=1"]
                figures = run_and_report(a, res, resume, work / "run", "resume", deadline - time.monotonic(),
                                         resumed=True)
                res.put("resume_check", resume_verdict(a, work / "resume.log", figures))
            failed += [] if res.data["parts"].get("resume_check", {}).get("continued") else ["resume"]
        if failed or res.data["errors"]:
            raise SystemExit(f"failed: {failed + list(res.data['errors'])}")
    except Stopped:
        res.note("stopped by SIGTERM (the runner's timeout); parts above are what was measured")
        raise SystemExit(1) from None
    finally:
        if not a.keep_run:
            shutil.rmtree(work / "run" / "checkpoints", ignore_errors=True)


# ---- inputs -----------------------------------------------------------------------------------
def ensure_checkpoint(a: argparse.Namespace, family: str, work: Path, res: bl.Result) -> Path:
    """The random checkpoint: ``--model-dir`` if it holds one, else written there (or under work)."""
    import random_checkpoint

    shape = (TINY_SHAPE_OF if a.tiny else SHAPE_OF)[family]
    directory = Path(a.model_dir) if a.model_dir else work / shape
    if (directory / "model.safetensors.index.json").is_file():
        return directory
    info = random_checkpoint.write_random_checkpoint(shape, directory, device=bl.device(), shard_gb=5.0)
    res.put("checkpoint", info)
    return directory


def write_task_data(task: dict, work: Path) -> dict[str, Path]:
    """JSONL rows in the config's own column names (train 256 rows, held-out 64): prompts of
    96-160 characters (about 128 tokens with the character tokenizer, as the component
    benchmarks' prompts), numeric answers."""
    rng = random.Random(0)
    out = {}
    for split, source, n in (("train", task.get("source"), 256), ("held_out", task.get("held_out_source"), 64)):
        if not source or source.get("kind") != "file":
            continue
        columns = {"prompt": "prompt", "answer": "answer", **(source.get("columns") or {})}
        lines = []
        for i in range(n):
            words, text = [], ""
            target = rng.randint(96, 160)
            while len(text) < target:
                words.append(rng.choice(WORDS))
                text = " ".join(words)
            answer = str(rng.randint(2, 999))
            row = {
                columns["prompt"]: f"{text} ({i})?",
                columns["answer"]: f"the answer is \\boxed{{{answer}}} #### {answer}",
            }
            lines.append(json.dumps(row))
        path = work / f"{split}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        out[split] = path
    return out


def job_overrides(a: argparse.Namespace, family: str, model_dir: Path, data: dict[str, Path], work: Path) -> list[str]:
    o = [f"model.path={model_dir}", f"run.steps={a.steps}", f"run.output_dir={work / 'run'}",
         "run.save_final_checkpoint=false", "run.export_final=false", "run.progress=false", "run.tensorboard=false",
         f"run.checkpoint_every={a.checkpoint_at or 0}"]
    if "train" in data:
        o.append(f"task.source.path={data['train']}")
    if a.eval_prompts > 0:
        o.append(f"eval.num_prompts={a.eval_prompts}")
        if "held_out" in data:
            o.append(f"task.held_out_source.path={data['held_out']}")
    else:  # no held-out rows: no evaluation
        o.append("task.held_out_source=null")
    if a.ranks:
        o.append(f"learner.num_ranks={a.ranks}")
    if a.workers:
        o.append(f"rollout.num_workers={a.workers}")
    peak = bl.read_peak_tflops(a.peak_from)
    if peak:
        o.append(f"run.peak_tflops={peak:.6g}")  # a busy CPU measures ~0.01: never round it to 0
    if a.tiny:
        o += TINY[family] + TINY_COMMON
    return o + list(a.set)


# ---- the job ----------------------------------------------------------------------------------
def run_and_report(a: argparse.Namespace, res: bl.Result, args: list[str], run_dir: Path, part: str,
                   timeout_s: float, resumed: bool = False) -> dict:
    """Run ``python -m stabledrl *args`` with the GPUs sampled; put ``part`` (its exit, wall,
    the report's figures) and return the figures. A SIGTERM stops the job and still reports."""
    log = run_dir.parent / f"{part}.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(bl.REPO), os.environ.get("PYTHONPATH")])),
               RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1", RAY_AUTH_MODE="disabled")
    if a.profile_step and not resumed:
        env.update(STABLEDRL_PROFILE_STEP=str(a.profile_step), STABLEDRL_PROFILE_DIR=str(run_dir.parent / "profile"))
    samples = run_dir.parent / f"{part}_gpu.csv"
    started = time.time()
    record: dict = {"command": " ".join(["stabledrl", *args])}
    with GpuSampler(samples):
        rc, stopped = run_logged([suites.python(), "-m", "stabledrl", *args], env, log, timeout_s)
    record.update(rc=rc, stopped=stopped, wall_s=time.time() - started)
    records = [r for r in _read_jsonl(run_dir / "metrics.jsonl") if not resumed or r.get("time", 0) >= started]
    figures = report.analyse(records, report.read_gpu_samples(str(samples)), skip=0 if resumed else a.skip,
                             started_at=started, peak_tflops=bl.read_peak_tflops(a.peak_from),
                             checkpoint_at=None if resumed else a.checkpoint_at)
    record["figures"] = figures
    record["problems"] = report.check(figures) if figures.get("steps") else ["no step finished"]
    record["log_tail"] = _tail(log, 40)
    profile = run_dir.parent / "profile"
    if profile.is_dir() and not resumed:
        record["learner_profile"] = [json.loads(p.read_text()) for p in sorted(profile.glob("*.json"))]
    res.put(part, record)
    print(report.markdown(part, figures), flush=True)
    if stopped:
        raise Stopped()
    return figures


def run_logged(cmd: list[str], env: dict, log: Path, timeout_s: float) -> tuple[int, bool]:
    """Run ``cmd`` in a session of its own, its output to ``log`` and to our stdout; on timeout or
    SIGTERM the whole session is stopped (a local Ray instance lives in the job's process group).
    Returns (exit code, stopped early)."""
    with open(log, "w", buffering=1) as f:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                cwd=bl.REPO, start_new_session=True, errors="replace")

        def pump() -> None:
            for line in proc.stdout:
                f.write(line)
                print("   | " + line.rstrip()[:300], flush=True)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=max(1.0, timeout_s))
            reader.join(timeout=10)
            return rc, False
        except (Stopped, subprocess.TimeoutExpired):
            # SIGINT first (the CLI shuts Ray down), then SIGTERM, SIGKILL, within the runner's 10 s grace
            run_all.stop_group(proc, ((signal.SIGINT, 5), (signal.SIGTERM, 2), (signal.SIGKILL, 2)))
            reader.join(timeout=5)
            return proc.wait(), True


def resume_verdict(a: argparse.Namespace, log: Path, figures: dict) -> dict:
    """The resumed run continued from the checkpoint and reached the last step."""
    text = log.read_text() if log.is_file() else ""
    line = next((x for x in text.splitlines() if "resumed at step" in x), "")
    resumed_at = int(line.split("resumed at step")[1].split()[0]) if line else None
    last = max((s["step"] for s in figures.get("per_step", [])), default=None)
    return {"resumed_at_step": resumed_at, "expected": a.checkpoint_at, "last_step": last,
            "continued": resumed_at == a.checkpoint_at and last == a.steps}


class GpuSampler:
    """nvidia-smi's utilisation and memory of every GPU every 200 ms into a CSV (no-op without it)."""

    def __init__(self, path: Path) -> None:
        self.path, self.proc = path, None

    def __enter__(self) -> "GpuSampler":
        import torch

        if shutil.which("nvidia-smi") and torch.cuda.is_available():
            self.proc = subprocess.Popen(
                [
                    "nvidia-smi",
                    "--query-gpu=timestamp,index,utilization.gpu,memory.used",
                    "--format=csv,noheader,nounits",
                    "-lms",
                    "200",
                ],
                stdout=open(self.path, "w"),
                stderr=subprocess.DEVNULL,
            )
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


# ---- the engine alone -----------------------------------------------------------------------
def engine_reference(a: argparse.Namespace, overrides: list[str]) -> dict:
    """tokens/s of the rollout engine alone on one device: the job's sampler, model and request
    size (prompts_per_request x G rows of the job's prompts), one warm-up request (captures the
    CUDA graphs) then one timed."""
    import torch

    from stabledrl.common.config.job import load_job_config
    from stabledrl.common.models import load_policy
    from stabledrl.common.tasks import build_task, load_task_data
    from stabledrl.rollout.engine import TorchRolloutEngine
    from stabledrl.rollout.workflow import encode_prompt

    cfg = load_job_config(a.config, overrides)
    dev = bl.device()
    policy, tokenizer = load_policy(cfg.model.model_copy(update={"gradient_checkpointing": False}), device=dev)
    engine = TorchRolloutEngine(policy)
    task = build_task(cfg.task)
    rows = load_task_data(cfg.task).train
    n, g = cfg.rollout.prompts_per_request, cfg.algorithm.group_size
    out = {"rows": n * g, "sampler": cfg.sampler.model_dump()}
    for k, name in enumerate(("warmup", "timed")):
        prompts = [encode_prompt(tokenizer, task, rows[k * n + q]) for q in range(n) for _ in range(g)]
        seeds = torch.arange(len(prompts)) + 1000 * k
        result, secs = bl.timed(lambda: engine.generate(prompts, seeds, cfg.sampler), dev)
        out[name] = {"seconds": secs, "tokens": result.tokens_generated, "forwards": result.num_forwards,
                     "tokens_per_s": result.tokens_generated / secs}
    out["tokens_per_s"] = out["timed"]["tokens_per_s"]
    out["peak_memory_gib"] = bl.peak_memory_gib(dev)
    return out


def _read_jsonl(path: Path) -> list[dict]:
    out = []
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _tail(path: Path, n: int) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return []


if __name__ == "__main__":
    main()
