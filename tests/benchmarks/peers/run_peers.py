"""The peer benchmark: the releases' own training loops against ``stabledrl train`` on the same GPUs,
the same model shape (a random checkpoint in LLaDA's released layout) and the same settings.

Pairs (``--pairs``):

- ``stabledrl``: the StableDRL release (train.py, FSDP through accelerate, generation and training
  on every GPU one after the other; peer_stabledrl.py) at its GSM8K config (gen 256, 128 steps,
  block 32, 8 x 2 generations, mu = 2, SPG sandwich + SNIS) against
  deploy/configs/recipe_stabledrl_llada8b_gsm8k.yaml;
- ``d1``: d1's diffu-GRPO (diffu_grpo_train.py, TRL's GRPOTrainer, DeepSpeed ZeRO-2 through accelerate,
  generation and training on every GPU one after the other; peer_d1.py) at its train.yaml (LoRA r 128,
  mu = 12, 6 generations, 2 accumulation steps) against deploy/configs/recipe_d1_llada8b_gsm8k_lora.yaml.

Each pair runs three loops, one after another, each in its own process with its own timeout:
the peer; the project's recipe as shipped (its sampler is the release's: plain low-confidence
remasking, 128 steps, no cache; its decoder layers compiled, ``sampler.compile``) =
``<pair>_release_sampler``; the recipe with the shipped fast
paths (the 1-node configs' dual KV cache with threshold decoding at 0.9 and one step of
staleness, ``FAST``) = ``<pair>_fast``. Three more loops on request (``--loops``): ``colocated``, the
release sampler with ``cluster.colocate`` (a learner rank and a rollout worker on every GPU taking
turns, generation then training on all of them, as the releases run; ``COLOCATED``),
``colocated_fast`` (the same with the fast sampler, eta = 0), ``colocated_eager`` (``colocated`` with
the forward eager, ``sampler.compile=false``), and ``colocated_no_ckpt`` / ``colocated_fast_no_ckpt``
(the learner without activation checkpointing). The project's jobs run through the
system benchmark (bench_system.py: 1 learner rank + 1 rollout worker on 2 GPUs; colocated: one of
each per GPU) with the recipe's task source
replaced by the generated rows that the peer reads too, no held-out evaluation, and
``groups_per_step`` set so that a step trains as many samples as one round of the peer on all its
GPUs (StableDRL: GPUs x 4 accumulation rounds x 16; d1: GPUs x 2 accumulation steps x 6).

The peers' code is never part of this project: ``--peer-root`` holds checkouts (``StableDRL/``,
``d1/``), and ``--peer-pythonpath`` a directory of the older packages the releases pin (their
transformers 4.x), put first on the peer process's path only.

Figures (peer_events.py): samples trained per second per GPU, rollout tokens/s per GPU, learner
seconds per sample, time to first step, peak memory; and project / peer. After every part
``--out`` holds ``results.json`` and ``table.md``.

    python tests/benchmarks/peers/run_peers.py --peer-root /tmp/peers --peer-pythonpath /tmp/peerlib \\
        --layers 4 --out $OUT
    python tests/benchmarks/peers/run_peers.py --tiny --peer-root /tmp/peers --peer-pythonpath /tmp/peerlib --out /tmp/p
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
REPO = BENCH.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(BENCH))

import peer_events as pe  # noqa: E402
import yaml  # noqa: E402

# the shipped fast paths (deploy/configs/llada8b_1node.yaml): Fast-dLLM's dual cache, threshold decoding, eta = 1
# (the recipes compile the exact sampler's forward; the cached one runs eager)
SAMPLER_FAST = ["sampler.cache=dual", "sampler.threshold=0.9", "sampler.compile=false"]
FAST = SAMPLER_FAST + ["algorithm.max_staleness=1"]
# cluster.colocate: a learner rank and a rollout worker on every GPU, taking turns (eta = 0) as the releases' loops do
COLOCATED = ["cluster.colocate=true", "weights.backend=auto", "algorithm.max_staleness=0"]
VARIANTS = {"release_sampler": [], "fast": FAST, "colocated": COLOCATED, "colocated_fast": SAMPLER_FAST + COLOCATED,
            # the recipe's sampler with its forward eager: the before of sampler.compile
            "colocated_eager": COLOCATED + ["sampler.compile=false"],
            # the learner without activation checkpointing; at d1's 32 layers colocated on 80 GB it ran out
            # of memory at its second step (host G, 2026-11-27): for a learner on a GPU of its own
            "colocated_no_ckpt": COLOCATED + ["model.gradient_checkpointing=false"],
            "colocated_fast_no_ckpt": SAMPLER_FAST + COLOCATED + ["model.gradient_checkpointing=false"]}
TARGETS = {"release_sampler": 2.0, "colocated": 2.0, "fast": 5.0}


def pair_spec(name: str, n_gpus: int) -> dict:
    """What a pair runs; ``groups``: the project's groups_per_step that trains, per step, as many
    samples as one round of the peer (every GPU)."""
    g = max(1, n_gpus)
    if name == "stabledrl":
        return {"recipe": "deploy/configs/recipe_stabledrl_llada8b_gsm8k.yaml", "script": "peer_stabledrl.py",
                "groups": g * 4, "peer_dir": "StableDRL", "steps_per_round": 2,  # 4 rounds x 1 prompt x 16; mu = 2
                "peer_steps": 4, "accelerate_config": "configs/accelerate/fsdp.yaml",
                # the CPU rehearsal: one prompt a round, a generation of 2 blocks of 32 tokens in 8 steps
                "tiny": ["infer_kwargs.gen_length=64", "infer_kwargs.max_steps=8", "training_args.grad_accumulation=1"]}
    if name == "d1":
        return {"recipe": "deploy/configs/recipe_d1_llada8b_gsm8k_lora.yaml", "script": "peer_d1.py",
                "groups": g * 2, "peer_dir": "d1", "steps_per_round": 12,  # 6 rows x 2 accumulation / 6; mu = 12
                "peer_steps": 24, "accelerate_config": "diffu-grpo/accelerate.yaml",
                # the CPU rehearsal: 2 blocks of 32 tokens in 8 steps, fp32 (no DeepSpeed, no bf16 autocast)
                "tiny": ["max_completion_length=64", "diffusion_steps=8", "bf16=false"]}
    raise SystemExit(f"unknown pair {name!r} (stabledrl, d1)")


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer-root", required=True, help="directory holding the releases' checkouts")
    ap.add_argument("--peer-pythonpath", default=None, help="packages the releases pin, first on the peers' path")
    ap.add_argument("--pairs", default="stabledrl", help="comma list: stabledrl, d1")
    ap.add_argument("--loops", default="peer,release_sampler,fast", help="which of each pair's loops run")
    ap.add_argument("--tiny", action="store_true", help="tiny LLaDA on the CPU, short generations (the rehearsal)")
    ap.add_argument("--gpus", type=int, default=None, help="GPUs of every loop (default: all visible; tiny: 1)")
    ap.add_argument("--layers", type=int, default=None,
                    help="the width of LLaDA-8B at this many layers (default: full-parameter pairs need it; LoRA 32)")
    ap.add_argument("--peer-steps", type=int, default=None,
                    help="optimizer steps of the peer (default 2 rounds: StableDRL 4, d1 24)")
    ap.add_argument("--project-steps", type=int, default=3)
    ap.add_argument("--project-skip", type=int, default=1,
                    help="first steps of the project's loops left out of the figures (2: the first weight push too, "
                    "which allocates the push buffer, out of the timed steps)")
    ap.add_argument("--peer-port", type=int, default=29531,
                    help="the peer's accelerate main-process port (another for a second peer on the same host)")
    ap.add_argument("--peer-script", action="append", default=[], help="NAME=PATH: another harness for a peer (tests)")
    ap.add_argument("--part-timeout-s", type=float, default=300.0)
    ap.add_argument("--deadline-s", type=float, default=None, help="no part starts after this many seconds")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=k=v;k=v: another project loop (the recipe plus these overrides), compared with the peer")
    ap.add_argument("--merge", action="append", default=[],
                    help="results.json of an earlier run on the same card: its loops join the table (this run's win)")
    ap.add_argument("--work", default=None)
    ap.add_argument("--out", required=True)
    return ap.parse_args()


def main() -> None:
    a = parse()
    t_start = time.monotonic()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work or out / "work")
    work.mkdir(parents=True, exist_ok=True)
    n_gpus = gpu_count(a)
    results = {"args": vars(a), "card": card(), "n_gpus": n_gpus, "parts": {}, "rows": [], "merged": []}
    for path in a.merge:
        merge(results, json.loads(Path(path).read_text()), path)
    variants = dict(VARIANTS)
    for item in a.variant:
        name, sets = item.split("=", 1)
        variants[name] = [x for x in sets.split(";") if x]
    results["variants"] = variants
    scripts = dict(item.split("=", 1) for item in a.peer_script)
    loops = a.loops.split(",")
    ok = True

    def save() -> None:
        results["rows"] = table_rows(results)
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
        (out / "table.md").write_text(header(results) + pe.markdown(results["rows"]))

    def time_left() -> bool:
        return a.deadline_s is None or time.monotonic() - t_start < a.deadline_s

    for pair in a.pairs.split(","):
        spec = pair_spec(pair, n_gpus)
        ckpt = checkpoint(a, work)
        results["parts"][f"{pair}_checkpoint"] = ckpt
        data = rows(work)
        if "peer" in loops and time_left():
            script = Path(scripts.get(pair) or HERE / spec["script"])
            rec = run_peer(a, pair, spec, script, Path(ckpt["directory"]), data, work / f"{pair}_peer", n_gpus)
            results["parts"][f"{pair}_peer"] = rec
            ok &= rec["rc"] == 0
            save()
        for variant, sets in variants.items():
            if variant in loops and time_left():
                rec = run_project(a, pair, spec, variant, sets, Path(ckpt["directory"]), work / f"{pair}_{variant}",
                                  n_gpus)
                results["parts"][f"{pair}_{variant}"] = rec
                ok &= rec["rc"] == 0
                save()
    save()
    print(header(results) + pe.markdown(results["rows"]), flush=True)
    if not ok:
        raise SystemExit("a loop failed: see results.json")


# ---- inputs -----------------------------------------------------------------------------------
def gpu_count(a: argparse.Namespace) -> int:
    if a.tiny:
        return a.gpus or 1
    import torch

    return a.gpus or torch.cuda.device_count()


def card() -> dict:
    try:
        import torch

        if torch.cuda.is_available():
            return {"name": torch.cuda.get_device_name(0), "count": torch.cuda.device_count()}
    except Exception:  # noqa: BLE001 - the record only
        pass
    return {"name": "cpu", "count": 0}


def checkpoint(a: argparse.Namespace, work: Path) -> dict:
    """A random LLaDA checkpoint in the released layout (random_checkpoint.py): tiny on the CPU; else the
    family's width at ``--layers`` (full-parameter pairs need fewer than 32 on 80 GB cards), all 32 without."""
    import benchlib as bl
    import random_checkpoint

    shape = "tiny-llada" if a.tiny else "llada-8b"
    layers = None if (a.tiny or not a.layers) else a.layers
    directory = work / f"{shape}-{layers or 'all'}l"
    return random_checkpoint.write_random_checkpoint(shape, directory, device=bl.device(), layers=layers)


def rows(work: Path) -> Path:
    """The generated GSM8K-like rows the project's job reads too (bench_system.write_task_data)."""
    import bench_system

    path = work / "train.jsonl"
    if not path.is_file():
        bench_system.write_task_data({"source": {"kind": "file"}}, work)
    return path


# ---- the loops ----------------------------------------------------------------------------------
def run_peer(a: argparse.Namespace, pair: str, spec: dict, script: Path, ckpt: Path, data: Path, work: Path,
             n_gpus: int) -> dict:
    events = work / "events"
    steps = a.peer_steps or spec["peer_steps"]
    harness = [str(script), "--peer-root", str(Path(a.peer_root) / spec["peer_dir"]), "--model-dir", str(ckpt),
               "--data", str(data), "--steps", str(steps), "--events", str(events), "--work", str(work)]
    if a.tiny:  # one CPU process, a short generation (the pair's "tiny" overrides)
        cmd = [sys.executable, *harness, "--device", "cpu"]
        for s in spec["tiny"]:
            cmd += ["--set", s]
    else:  # the release's own accelerate config (FSDP; d1: DeepSpeed ZeRO-2), on this machine's GPUs
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(n_gpus),
               "--num_machines", "1", "--machine_rank", "0", "--main_process_port", str(a.peer_port),
               "--config_file", str(Path(a.peer_root) / spec["peer_dir"] / spec["accelerate_config"]), *harness]
    env = dict(os.environ)
    if a.peer_pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [a.peer_pythonpath, env.get("PYTHONPATH")]))
    env["PEER_LAUNCHED_AT"] = repr(time.time())
    work.mkdir(parents=True, exist_ok=True)
    rc, wall, stopped = run_logged(cmd, env, work / "peer.log", a.part_timeout_s)
    # the window: the peer's last round (its steps after the first round's)
    figures = pe.peer_figures(pe.read_events(events), n_gpus=n_gpus, skip=spec["steps_per_round"])
    print(f"[{pair}_peer] rc {rc} wall {wall:.0f}s {json.dumps(figures, default=str)[:600]}", flush=True)
    return {"command": " ".join(cmd), "rc": rc, "wall_s": wall, "stopped": stopped, "figures": figures,
            "log_tail": tail(work / "peer.log", 40)}


def project_config(recipe: str, work: Path) -> Path:
    """The recipe with a file task source (bench_system points it at its generated rows) and no
    published-protocol evaluation (it would read the benchmark's dataset)."""
    raw = yaml.safe_load((REPO / recipe).read_text())
    raw["task"]["source"] = {"kind": "file", "path": "rows.jsonl", "columns": {"prompt": "prompt", "answer": "answer"}}
    raw["task"].pop("held_out_source", None)
    # the generated rows through the byte-level stand-in tokenizer run to ~270 prompt tokens, where the
    # released tokenizer makes ~70: d1 keeps the last 200 (its max_prompt_length), the project reads them
    # whole rather than skipping them (its max_prompt_tokens): the longer prompt is the project's cost
    raw["task"]["max_prompt_tokens"] = max(raw["task"].get("max_prompt_tokens") or 0, 512)
    raw.setdefault("eval", {})["protocol"] = None
    path = work / Path(recipe).name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def run_project(a: argparse.Namespace, pair: str, spec: dict, variant: str, overrides: list[str], ckpt: Path,
                work: Path, n_gpus: int) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    config = project_config(spec["recipe"], work)
    record = work / "system.json"
    sets = ([] if a.tiny else [f"algorithm.groups_per_step={spec['groups']}"]) + list(overrides)
    # 1 learner rank + 1 worker on 2 GPUs; colocated: a rank and a worker on every GPU
    actors = str(max(1, n_gpus) if "cluster.colocate=true" in sets else 1)
    cmd = [sys.executable, str(BENCH / "bench_system.py"), "--config", str(config), "--model-dir", str(ckpt),
           "--ranks", actors, "--workers", actors, "--steps", str(a.project_steps), "--skip", str(a.project_skip),
           "--eval-prompts", "0",
           "--work", str(work / "job"), "--timeout-s", str(a.part_timeout_s - 20), "--name", f"{pair}_{variant}",
           "--out", str(record), *(["--tiny"] if a.tiny else [])]
    for s in sets:
        cmd += ["--set", s]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    rc, wall, stopped = run_logged(cmd, env, work / "project.log", a.part_timeout_s)
    data = json.loads(record.read_text()) if record.is_file() else {"parts": {}}
    job = data.get("parts", {}).get("job") or {}
    figures = pe.project_figures(job, n_gpus=n_gpus if not a.tiny else 1)
    print(f"[{pair}_{variant}] rc {rc} wall {wall:.0f}s {json.dumps(figures, default=str)[:600]}", flush=True)
    # each actor's own clock over the timed steps (the profile of where a step's time goes)
    actors = {name: {k: v for k, v in actor.items() if k in ("wall_s", "idle_s", "seconds", "busy_fraction",
                                                               "gpu_busy_fraction", "peak_memory_gib")}
              for name, actor in ((job.get("figures") or {}).get("actors") or {}).items()}
    return {
        "command": " ".join(cmd),
        "rc": rc,
        "wall_s": wall,
        "stopped": stopped,
        "figures": figures,
        "actors": actors,
        "step_s_median": (job.get("figures") or {}).get("step_s_median"),
        "overrides": sets,
        "job_problems": job.get("problems"),
        "log_tail": job.get("log_tail") or tail(work / "project.log", 40),
        "errors": data.get("errors"),
    }


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


# ---- the table ----------------------------------------------------------------------------------
def merge(results: dict, earlier: dict, path: str) -> None:
    """Take an earlier run's loops (same card and GPU count only: ratios never mix cards)."""
    if earlier.get("card", {}).get("name") != results["card"]["name"] or earlier.get("n_gpus") != results["n_gpus"]:
        results["merged"].append({"path": str(path), "skipped": f"measured on {earlier.get('card')} x "
                                  f"{earlier.get('n_gpus')}, not on {results['card']} x {results['n_gpus']}"})
        return
    results["parts"].update(earlier.get("parts", {}))
    results["variants"] = {**earlier.get("variants", {}), **results.get("variants", {})}
    results["merged"].append({"path": str(path), "parts": sorted(earlier.get("parts", {}))})


def table_rows(results: dict) -> list[dict]:
    """One row per loop that ran; the project's rows carry project / peer and the target (the
    release-sampler loops' 2x, colocated or not; every loop with the fast paths 5x)."""
    out = []
    pairs = sorted({k.split("_", 1)[0] for k in results["parts"]} & {"stabledrl", "d1"}, key=["stabledrl", "d1"].index)
    for pair in pairs:
        peer = results["parts"].get(f"{pair}_peer")
        if peer:
            out.append({"name": f"{pair} release (peer)", "figures": peer["figures"], "ratio": None})
        for key, rec in results["parts"].items():
            if not key.startswith(f"{pair}_") or key.endswith(("_peer", "_checkpoint")):
                continue
            variant = key[len(pair) + 1:]
            name = f"{pair}: stabledrl train, {variant.replace('_', ' ')}"
            failed = rec.get("rc") not in (0, None) or rec.get("stopped")
            if failed:  # its figures are whatever steps it finished: shown, never held against a target
                name += f" (FAILED: rc {rec.get('rc')}{', stopped' if rec.get('stopped') else ''})"
            ratio = pe.compare(rec["figures"], peer["figures"]) if peer and not failed else None
            out.append({"name": name, "figures": rec["figures"], "ratio": ratio, "failed": bool(failed),
                        "target": target(variant, results.get("variants", {}).get(variant))})
    return out


def target(variant: str, sets: Optional[list[str]]) -> float:
    """A loop's target: the named loops' own; another loop (``--variant``) is held to the release
    sampler's 2x when its overrides leave the recipe's sampler alone (no ``sampler.cache``), else
    (or when its overrides are unknown) to the fast paths' 5x."""
    if variant in TARGETS:
        return TARGETS[variant]
    fast = sets is None or any(s.startswith("sampler.cache=") for s in sets)
    return TARGETS["fast" if fast else "release_sampler"]


def header(results: dict) -> str:
    c = results["card"]
    return (f"Card: {c['name']} x {results['n_gpus']} used (every loop holds all of them). "
            f"Ratios: project / peer (> 1: the project is better).\n\n")


def ratio_of(results: dict, name: str) -> Optional[float]:
    row = next((r for r in results["rows"] if r["name"] == name), None)
    return (row.get("ratio") or {}).get("samples_per_s_per_gpu") if row else None


if __name__ == "__main__":
    main()
