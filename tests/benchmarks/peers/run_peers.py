"""The peer benchmark: the releases' own training loops against ``stabledrl train`` on the same GPUs,
the same model shape (a random checkpoint in LLaDA's released layout, at ``--layers`` of LLaDA-8B's 32)
and the same settings.

Pairs (``--pairs``):

- ``stabledrl``: the StableDRL release (train.py, FSDP through accelerate, generation and training
  on every GPU one after the other; peer_stabledrl.py) at its GSM8K config (gen 256, 128 steps,
  block 32, 8 x 2 generations, mu = 2, SPG sandwich + SNIS, masks drawn afresh: ``independent``)
  against deploy/configs/recipe_stabledrl_llada8b_gsm8k.yaml;
- ``d1``: d1's diffu-GRPO (diffu_grpo_train.py, TRL's GRPOTrainer, DeepSpeed ZeRO-2 through accelerate;
  peer_d1.py) at its train.yaml (LoRA r 128, mu = 12, 6 generations, 2 accumulation steps) against
  deploy/configs/recipe_d1_llada8b_gsm8k_lora.yaml with d1's estimator on the project's side too
  (``PAIR_SETS``: a new prompt mask at every inner iteration, ``estimator.masks=per_iteration``, and
  d1's prompt truncation, the last 200 tokens, ``task.long_prompts=keep_last``).

Loops (``--loops``): ``peer``, the release; ``release_sampler``, the recipe as committed (the release's
sampler, its forward compiled; a learner rank and a rollout worker on every GPU taking turns, as the
releases run: ``cluster.colocate``); ``fast``, the same with the shipped fast sampler (``SAMPLER_FAST``);
``apart`` and ``apart_fast`` (1 learner rank and 1 worker, each on a GPU of its own; the fast one a step
ahead, ``FAST``); ``colocated``, ``colocated_fast``, ``colocated_eager``, ``colocated_no_ckpt``,
``colocated_fast_no_ckpt`` (the colocated variants named outright); ``fast_graph``, ``fast_graph_no_ckpt`` and
``fast_graph_compiled`` (``fast`` with the dual-cache step as a CUDA graph, ``sampler.cuda_graph``; the second
without activation checkpointing, the third with the step compiled before its capture, ``sampler.compile``);
``--variant NAME=k=v;k=v`` adds more.
The project's jobs run through the system benchmark (bench_system.py) with the recipe's task source
replaced by the generated rows the peer reads too, no held-out evaluation, and ``groups_per_step`` set
so that a step trains as many samples as one round of the peer on all its GPUs.
Before any loop runs, each project loop's config is validated with its overrides (the dry run): one
that does not validate is recorded as failed, naming the field, and never started.

Protocol: ``--cycles`` timed cycles per loop after the warm-up (a cycle: a round of the peer, a
generation and its mu updates; a step of the project), ``--runs`` runs of every loop in alternating
order (peer, project loops, peer, ...); ``--layers 8,16,24,32`` runs the series in one command. The
table gives each loop's median over its runs and the range; project / peer is the ratio of the
medians, its range the most and least favourable pairing of runs.

Every record states the layer count (read from the checkpoint's config, never null), the card, the
host and each loop's overrides. Figures (peer_events.py): samples trained per second per GPU, rollout
tokens/s per GPU, learner seconds per sample, time to first step, peak memory (the allocator's, and
every GPU's as nvidia-smi saw it); the roofline (roofline.py: achieved TFLOP/s of generation and of the
learner against the card's measured matmul rate, ``--peak-from`` or measured first; the wall-time
shares; the ceiling of the release's sampler); and project / peer. After every part ``--out`` holds
``results.json`` and ``table.md`` (peers_table.py).

``--suite NAME`` runs a named suite (tests/benchmarks/suites.py: the comparisons BENCHMARKS.md cites
and the depth budget's plans for one H200); a GPU run of a suite keeps its record in
tests/benchmarks/results/, named by the suite, the model shape and the card.

    python tests/benchmarks/peers/run_peers.py --suite stabledrl --peer-root /tmp/peers \\
        --peer-pythonpath /tmp/peerlib --out runs/bench/peers
    python tests/benchmarks/peers/run_peers.py --peer-root /tmp/peers --peer-pythonpath /tmp/peerlib \\
        --layers 8,16,24 --cycles 5 --runs 3 --loops peer,colocated --out $OUT
    python tests/benchmarks/peers/run_peers.py --tiny --peer-root /tmp/peers --peer-pythonpath /tmp/peerlib --out /tmp/p
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
REPO = BENCH.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(BENCH))

import peer_events as pe  # noqa: E402
import peers_table as pt  # noqa: E402
import suites  # noqa: E402
import yaml  # noqa: E402

from peers_plan import (  # noqa: E402,F401  (the plan: tests and the suites read these names here too)
    APART, COLOCATED, FAST, FULL_LAYERS, PAIR_SETS, SAMPLER_FAST, VARIANTS, pair_spec,
)


def parse(argv: Optional[list[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer-root", required=True, help="directory holding the releases' checkouts")
    ap.add_argument("--peer-pythonpath", default=None, help="packages the releases pin, first on the peers' path")
    ap.add_argument("--suite", default=None, help=f"one of {', '.join(suites.RUN_PEERS)} (suites.py): its pairs, "
                    "layers, loops and protocol")
    ap.add_argument("--pairs", default="stabledrl", help="comma list: stabledrl, d1")
    ap.add_argument("--loops", default="peer,release_sampler,fast", help="which of each pair's loops run, in order")
    ap.add_argument("--check-loops", default="",
                    help="comma list: project loops whose configs are only validated (the dry run), never started")
    ap.add_argument("--tiny", action="store_true", help="tiny LLaDA on the CPU, short generations (the rehearsal)")
    ap.add_argument("--gpus", type=int, default=None, help="GPUs of every loop (default: all visible; tiny: 1)")
    ap.add_argument("--layers", default=None,
                    help=f"comma list: LLaDA-8B's width at these layer counts, one series (default {FULL_LAYERS})")
    ap.add_argument("--cycles", type=int, default=5, help="timed cycles of every loop after its warm-up")
    ap.add_argument("--peer-cycles", type=int, default=None, help="timed rounds of the peer (default --cycles)")
    ap.add_argument("--runs", type=int, default=3, help="runs of every loop, in alternating order")
    ap.add_argument("--peer-warmup", type=int, default=1, help="rounds of the peer before its window")
    ap.add_argument("--project-skip", type=int, default=2,
                    help="first steps of the project's loops left out: the first compiles and captures, the "
                    "second carries the first weight push and meets a second prompt width, for which the compiled "
                    "forwards recompile once with dynamic sizes (a minute or more at 8B)")
    ap.add_argument("--project-steps", type=int, default=None,
                    help="steps of the project's loops, outright (default: --project-skip + --cycles)")
    ap.add_argument("--peer-steps", type=int, default=None,
                    help="optimizer steps of the peer, outright (default: rounds of --peer-warmup + its cycles)")
    ap.add_argument("--round-scale", type=float, default=1.0, help="StableDRL: rounds of the release a cycle (x4)")
    ap.add_argument("--peer-port", type=int, default=29531,
                    help="the peer's accelerate main-process port (another for a second peer on the same host)")
    ap.add_argument("--peer-script", action="append", default=[], help="NAME=PATH: another harness for a peer (tests)")
    ap.add_argument("--part-timeout-s", type=float, default=900.0)
    ap.add_argument("--deadline-s", type=float, default=None, help="no part starts after this many seconds")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=k=v;k=v: another project loop (the recipe plus these overrides), compared with the peer")
    ap.add_argument("--merge", action="append", default=[],
                    help="results.json of an earlier run on the same card: its loops join the table (this run's win)")
    ap.add_argument("--peak-from", default=None, help="bench_matmul JSON (default: measured first, GPUs only)")
    ap.add_argument("--work", default=None)
    ap.add_argument("--out", required=True)
    # the suite's arguments, then the command line's (which win: a CPU rehearsal's longer timeouts)
    a = ap.parse_args(suites.expand("run_peers", sys.argv[1:] if argv is None else list(argv)))
    a.layer_list = [int(x) for x in a.layers.split(",")] if a.layers else [None]
    return a


def main(argv: Optional[list[str]] = None) -> None:
    a = parse(argv)
    t_start = time.monotonic()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work or out / "work")
    work.mkdir(parents=True, exist_ok=True)
    n_gpus = gpu_count(a)
    results = {"args": {k: v for k, v in vars(a).items()}, "card": card(), "host": socket.gethostname(),
               "machine": machine(), "n_gpus": n_gpus, "parts": {}, "rows": [], "merged": [], "dry_runs": {}}
    results["matmul_tflops"] = matmul_rate(a, work)
    for path in a.merge:
        pt.merge(results, json.loads(Path(path).read_text()), path)
    variants = dict(VARIANTS)
    for item in a.variant:
        name, sets = item.split("=", 1)
        variants[name] = [x for x in sets.split(";") if x]
    results["variants"] = variants
    scripts = dict(item.split("=", 1) for item in a.peer_script)
    loops = [x for x in a.loops.split(",") if x]
    checked = [x for x in a.check_loops.split(",") if x]
    unknown = [x for x in loops + checked if x != "peer" and x not in variants]
    if unknown:
        raise SystemExit(f"unknown loops {unknown}: peer, {', '.join(variants)} or a --variant")
    ok = True

    def save() -> None:
        results["rows"] = pt.table_rows(results)
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
        (out / "table.md").write_text(pt.header(results) + pt.markdown(results["rows"]))

    def time_left() -> bool:
        return a.deadline_s is None or time.monotonic() - t_start < a.deadline_s

    for layers in a.layer_list:
        for pair in a.pairs.split(","):
            spec = pair_spec(pair, n_gpus, a.round_scale)
            ckpt = checkpoint(a, work, layers)
            results["parts"][f"{pair}_L{ckpt['layers']}_checkpoint"] = ckpt
            data = rows(work)
            ready = {loop: dry_run(pair, spec, variants[loop], work) for loop in loops + checked if loop != "peer"}
            ok &= not any(ready[loop] for loop in checked)
            results["dry_runs"].update({f"{pair}_L{ckpt['layers']}_{k}": v for k, v in ready.items()})
            for _ in range(a.runs):
                for loop in loops:  # alternating: every loop once, then every loop again
                    if not time_left():
                        break
                    key = f"{pair}_L{ckpt['layers']}_{loop}"
                    part = results["parts"].setdefault(key, {"pair": pair, "loop": loop, "layers": ckpt["layers"],
                                                             "runs": []})
                    run = len(part["runs"])  # numbered on from the runs of earlier commands (--merge)
                    try:
                        if loop == "peer":
                            script = Path(scripts.get(pair) or HERE / spec["script"])
                            rec = run_peer(a, pair, spec, script, ckpt, data, work / f"{key}_run{run}", n_gpus)
                        elif ready[loop]:  # the dry run refused the config: recorded, never started
                            rec = {"rc": 2, "dry_run_error": ready[loop], "figures": {"problem": ready[loop]},
                                   "overrides": PAIR_SETS[pair] + variants[loop]}
                        else:
                            rec = run_project(a, pair, spec, loop, variants[loop], ckpt, work / f"{key}_run{run}",
                                              n_gpus)
                    except Exception:  # noqa: BLE001 - a harness error fails the run, after the other loops
                        rec = {"rc": 1, "harness_error": traceback.format_exc()[-2000:], "figures": {}}
                        print(rec["harness_error"], file=sys.stderr, flush=True)
                    rec.update(run=run, host=results["host"], machine=results["machine"], card=results["card"],
                               layers=ckpt["layers"], matmul_tflops=results["matmul_tflops"])
                    part["runs"].append(rec)
                    pt.summarise(part)
                    ok &= rec["rc"] == 0
                    save()
    save()
    if a.suite and not a.tiny:  # a record of the suite on this card
        shape = suites.RUN_PEERS[a.suite].shape
        suites.keep(out, suites.record_name(f"peers-{a.suite}", shape, results["card"]["name"], n_gpus), "table.md")
    print(pt.header(results) + pt.markdown(results["rows"]), flush=True)
    if not ok:
        raise SystemExit("a loop failed: see results.json")


# ---- inputs -----------------------------------------------------------------------------------
def gpu_count(a: argparse.Namespace) -> int:
    if a.tiny:
        return a.gpus or 1
    import torch

    return a.gpus or torch.cuda.device_count()


def machine() -> dict:
    """What tells one machine from another where every host has the same name: the kernel's boot id
    and the GPUs' UUIDs (nvidia-smi), so that runs merged from several commands show whether they ran
    on one machine."""
    out: dict = {}
    try:
        out["boot_id"] = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        pass
    try:
        listed = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True,
                                text=True, timeout=30)
        out["gpus"] = [line.strip() for line in listed.stdout.splitlines() if line.strip()]
    except (OSError, subprocess.SubprocessError):
        out["gpus"] = []
    return out


def card() -> dict:
    try:
        import torch

        if torch.cuda.is_available():
            return {"name": torch.cuda.get_device_name(0), "count": torch.cuda.device_count()}
    except Exception:  # noqa: BLE001 - the record only
        pass
    return {"name": "cpu", "count": 0}


def matmul_rate(a: argparse.Namespace, work: Path) -> Optional[float]:
    """The card's bf16 matmul rate (TFLOP/s): ``--peak-from``, else measured now (bench_matmul.py;
    --tiny at its toy size on the CPU, so that the roofline's arithmetic runs in the rehearsal)."""
    import benchlib as bl

    path = a.matmul_json = a.peak_from or str(work / "matmul.json")
    if not a.peak_from:
        cmd = [suites.python(), str(BENCH / "bench_matmul.py"), "--out", path, *(["--tiny"] if a.tiny else [])]
        subprocess.run(cmd, cwd=REPO, capture_output=True, timeout=300)
    return bl.read_peak_tflops(path)


def checkpoint(a: argparse.Namespace, work: Path, layers: Optional[int]) -> dict:
    """A random LLaDA checkpoint in the released layout (random_checkpoint.py): tiny on the CPU, else
    LLaDA-8B's width at ``layers`` (all 32 without); the record names the layer count it holds."""
    import benchlib as bl
    import random_checkpoint
    from roofline import shape_of

    shape = "tiny-llada" if a.tiny else "llada-8b"
    layers = None if a.tiny else layers
    directory = work / f"{shape}-{layers or 'all'}l"
    info = random_checkpoint.write_random_checkpoint(shape, directory, device=bl.device(), layers=layers)
    info["layers"] = shape_of(directory)["layers"]  # explicit, whatever was asked
    info["shape_dims"] = shape_of(directory)
    return info


def rows(work: Path) -> Path:
    """The generated GSM8K-like rows the project's job reads too (bench_system.write_task_data)."""
    import bench_system

    path = work / "train.jsonl"
    if not path.is_file():
        bench_system.write_task_data({"source": {"kind": "file"}}, work)
    return path


def dry_run(pair: str, spec: dict, overrides: list[str], work: Path) -> Optional[str]:
    """The project loop's config with its overrides, validated (None: it would start), else why not."""
    from stabledrl.common.config.base import ConfigError
    from stabledrl.common.config.job import load_job_config

    config = project_config(spec["recipe"], work, pair)
    try:
        load_job_config(str(config), [f"task.source.path={work / 'train.jsonl'}", *PAIR_SETS[pair], *overrides])
    except (ConfigError, ValueError) as e:
        lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
        return "the config does not validate: " + (" ".join(lines[1:] or lines) or type(e).__name__)[:400]
    return None


def project_config(recipe: str, work: Path, pair: str = "stabledrl") -> Path:
    """The recipe with a file task source (bench_system points it at its generated rows) and no
    published-protocol evaluation (it would read the benchmark's dataset)."""
    raw = yaml.safe_load((REPO / recipe).read_text())
    raw["task"]["source"] = {"kind": "file", "path": "rows.jsonl", "columns": {"prompt": "prompt", "answer": "answer"}}
    raw["task"].pop("held_out_source", None)
    if pair != "d1":
        # the generated rows through the byte-level stand-in tokenizer run to ~270 prompt tokens, where the
        # released tokenizer makes ~70: read whole (the release reads them whole too)
        raw["task"]["max_prompt_tokens"] = max(raw["task"].get("max_prompt_tokens") or 0, 512)
    raw.setdefault("eval", {})["protocol"] = None
    path = work / f"{pair}_{Path(recipe).name}"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


# ---- the loops ----------------------------------------------------------------------------------
def run_peer(a: argparse.Namespace, pair: str, spec: dict, script: Path, ckpt: dict, data: Path, work: Path,
             n_gpus: int) -> dict:
    import bench_system

    events = work / "events"
    cycles = a.peer_cycles if a.peer_cycles is not None else a.cycles
    steps = a.peer_steps or (a.peer_warmup + cycles) * spec["steps_per_round"]
    harness = [str(script), "--peer-root", str(Path(a.peer_root) / spec["peer_dir"]), "--model-dir",
               ckpt["directory"], "--data", str(data), "--steps", str(steps), "--events", str(events),
               "--work", str(work)]
    sets = list(spec["tiny"] if a.tiny else spec["peer_sets"])
    if a.tiny:  # one CPU process, a short generation (the pair's "tiny" overrides)
        cmd = [suites.python(), *harness, "--device", "cpu"]
    else:  # the release's own accelerate config (FSDP; d1: DeepSpeed ZeRO-2), on this machine's GPUs
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(n_gpus),
               "--num_machines", "1", "--machine_rank", "0", "--main_process_port", str(a.peer_port),
               "--config_file", str(Path(a.peer_root) / spec["peer_dir"] / spec["accelerate_config"]), *harness]
    for s in sets:
        cmd += ["--set", s]
    env = dict(os.environ)
    if a.peer_pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [a.peer_pythonpath, env.get("PYTHONPATH")]))
    env["PEER_LAUNCHED_AT"] = repr(time.time())
    work.mkdir(parents=True, exist_ok=True)
    with bench_system.GpuSampler(work / "gpu.csv"):
        rc, wall, stopped = run_logged(cmd, env, work / "peer.log", a.part_timeout_s)
    # the window: the peer's rounds after its warm-up
    figures = pe.peer_figures(pe.read_events(events), n_gpus=n_gpus, skip=a.peer_warmup * spec["steps_per_round"])
    figures["gpu_memory_used_max_gib"] = gpu_peak(work / "gpu.csv")
    figures["roofline"] = pt.peer_roofline(figures, ckpt["shape_dims"], spec["lora"])
    print(f"[{pair}_peer] rc {rc} wall {wall:.0f}s {json.dumps(figures, default=str)[:600]}", flush=True)
    return {"command": " ".join(cmd), "rc": rc, "wall_s": wall, "stopped": stopped, "figures": figures,
            "overrides": [f"steps={steps}", *sets], "log_tail": tail(work / "peer.log", 40)}


def run_project(a: argparse.Namespace, pair: str, spec: dict, variant: str, overrides: list[str], ckpt: dict,
                work: Path, n_gpus: int) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    config = project_config(spec["recipe"], work, pair)
    record = work / "system.json"
    # tiny: a 2-layer model, which refuses a recipe's model.checkpointed_layers above its layers
    sets = (["model.checkpointed_layers=null"] if a.tiny else [f"algorithm.groups_per_step={spec['groups']}"]) + \
        PAIR_SETS[pair] + list(overrides)
    # colocated (the recipes as committed): a rank and a worker on every GPU; apart: 1 learner rank + 1 worker on 2
    actors = str(max(1, n_gpus) if colocated(config, sets, work) else 1)
    cmd = [suites.python(), str(BENCH / "bench_system.py"), "--config", str(config), "--model-dir", ckpt["directory"],
           "--ranks", actors, "--workers", actors, "--steps", str(a.project_steps or a.project_skip + a.cycles),
           "--skip", str(a.project_skip), "--eval-prompts", "0", "--work", str(work / "job"),
           "--timeout-s", str(a.part_timeout_s - 20), "--name", f"{pair}_{variant}", "--out", str(record),
           *(["--tiny"] if a.tiny else [])]
    if Path(a.matmul_json).is_file():
        cmd += ["--peak-from", a.matmul_json]
    for s in sets:
        cmd += ["--set", s]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    rc, wall, stopped = run_logged(cmd, env, work / "project.log", a.part_timeout_s)
    data = json.loads(record.read_text()) if record.is_file() else {"parts": {}}
    job = data.get("parts", {}).get("job") or {}
    f = job.get("figures") or {}
    figures = pe.project_figures(job, n_gpus=n_gpus if not a.tiny else 1)
    figures["gpu_memory_used_max_gib"] = max((x.get("gpu_memory_used_max_gib") or 0.0
                                              for x in (f.get("actors") or {}).values()), default=0.0) or None
    # the config as the job ran it, saved in its run folder (bench_system's ranks, workers and, on the CPU, its
    # tiny canvas); a job that never wrote it recorded no step to count either
    ran = work / "job" / "run" / "config.yaml"
    figures["roofline"] = pt.project_roofline(f, ckpt["shape_dims"], ran, [], work / "job" / "train.jsonl",
                                              n_gpus) if ran.is_file() else None
    print(f"[{pair}_{variant}] rc {rc} wall {wall:.0f}s {json.dumps(figures, default=str)[:600]}", flush=True)
    # each actor's own clock over the timed steps (the profile of where a step's time goes)
    actors = {name: {k: v for k, v in actor.items() if k in ("wall_s", "idle_s", "seconds", "busy_fraction",
                                                               "gpu_busy_fraction", "peak_memory_gib",
                                                               "gpu_memory_used_max_gib")}
              for name, actor in (f.get("actors") or {}).items()}
    return {"command": " ".join(cmd), "rc": rc, "wall_s": wall, "stopped": stopped, "figures": figures,
            "actors": actors, "step_s_median": f.get("step_s_median"), "overrides": sets,
            "job_problems": job.get("problems"), "log_tail": job.get("log_tail") or tail(work / "project.log", 40),
            "errors": data.get("errors")}


def colocated(config: Path, sets: list[str], work: Path) -> bool:
    """Whether the loop's config (the recipe and its overrides) shares each GPU between a rank and a worker.
    Read from the file and the overrides alone: the loop's other overrides (fewer groups a step than the
    recipe's ranks) validate only with the ranks bench_system gives the job."""
    value = (yaml.safe_load(config.read_text()).get("cluster") or {}).get("colocate", False)
    for s in sets:
        if s.startswith("cluster.colocate="):
            value = yaml.safe_load(s.split("=", 1)[1])
    return bool(value)


def gpu_peak(samples: Path) -> Optional[float]:
    """The largest memory.used of any GPU in nvidia-smi's samples (GiB), None without samples."""
    import system_report

    used = [m for _, _, _, m in system_report.read_gpu_samples(str(samples))]
    return max(used) / 1024 if used else None


def run_logged(cmd: list[str], env: dict, log: Path, timeout_s: float) -> tuple[int, float, bool]:
    """Run ``cmd`` in its own session, output to ``log``; on timeout stop the whole session."""
    import run_all

    t0 = time.time()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)
        try:
            return proc.wait(timeout=timeout_s), time.time() - t0, False
        except subprocess.TimeoutExpired:
            run_all.stop_group(proc, ((signal.SIGINT, 5), (signal.SIGTERM, 3), (signal.SIGKILL, 2)))
            return proc.wait(), time.time() - t0, True


def tail(path: Path, n: int) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return []


if __name__ == "__main__":
    main()
