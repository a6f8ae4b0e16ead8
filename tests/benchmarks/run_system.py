"""The system benchmark: random 8B checkpoints, the denominators (matmul rate, raw broadcast, the
rollout engine alone), then the shipped configs as real jobs, in priority order, each part in its
own process with its own timeout inside a global deadline. A part that fails (its exit code, or a
sub-part it recorded as failed), times out or is skipped for one that did not finish makes the run
exit 1. After every part ``--out`` holds ``results.json`` (every part's full record), ``summary.md``
(the targets and each job's per-actor table) and ``run.log`` (all output): a run cut short keeps
what it measured. ``--suite NAME`` (tests/benchmarks/suites.py) picks the parts and options of one
table of BENCHMARKS.md.

4 GPUs (the stand-in of the 8-GPU configs: 3 learner ranks + 1 rollout worker, since 2 ZeRO-3
ranks of 8B with AdamW need ~64 GiB each before activations):

    lane GPU 3:     ckpt_llada -> ckpt_sdar                  random checkpoints, released layout
    lane GPU 2:     matmul -> engine_llada (after ckpt_llada) measured peak; engine alone
    lane GPU 0+1:   push                                      raw broadcast vs the push, 16 GB
    then:           system_llada -> lora_llada -> system_trado -> variants   the jobs (+ resume check)

8 GPUs or more: the same lanes, and the jobs on GPUs 0-7 with the configs' own 4 learner ranks and
4 rollout workers, as shipped.

``lora_llada`` is LLaDA-8B's job with learner.lora (rank 128, alpha 64) for 2 steps: each learner
rank's peak GPU memory (learner/peak_gpu_gb/rank<r>) and the in-job push of the adapters
(time/weight_push, time/<actor>/push*).

2 GPUs: the parts run one after another; a job takes both GPUs with 1 learner rank and 1 rollout
worker. One 80 GB card cannot hold a full-parameter 8B learner (bf16 weights and gradients, fp32
master weights and two AdamW moments: ~16 bytes per parameter, 128 GB for LLaDA-8B's 8.02B), so
the full-parameter jobs take the family's width with ``SHORT_LAYERS`` layers (``ckpt_*_short``:
LLaDA 11 of 32 layers = 3,435,229,184 parameters, 55 GB of states; SDAR 11 of 36 = 3,367,074,560);
``lora_llada`` keeps all 32 layers (the base frozen in bf16, 16 GB), and so does ``offload_llada``:
the full-parameter 8B job on one learner GPU with ZeRO-2 and ``learner.deepspeed.offload_optimizer:
cpu`` (bf16 weights and gradients on the GPU, 32 GB; fp32 master weights and moments, 96 GB, and
the AdamW step on the host), 2 steps (the second timed), to set against ``system_llada``'s 11-layer stand-in.

``--parts`` picks and orders them (default: the suite's, else everything for llada, then trado);
parts whose inputs are missing are skipped. ``--tiny`` runs the same parts on the CPU at the tiny
shapes, one after another (the rehearsal); ``--plan-gpus 2`` plans for 2 GPUs on a larger machine,
or on the CPU with ``--tiny``.

    python3 tests/benchmarks/run_system.py --suite llada --out runs/bench/llada
    python3 tests/benchmarks/run_system.py --parts ckpt_llada_short,matmul,system_llada --out runs/bench/system
    .venv/bin/python tests/benchmarks/run_system.py --suite llada --tiny --out /tmp/llada
    .venv/bin/python tests/benchmarks/run_system.py --tiny --plan-gpus 2 --out /tmp/system2
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run_all  # noqa: E402
import suites  # noqa: E402
import system_report  # noqa: E402

CONFIGS = {"llada": "deploy/configs/llada8b_1node.yaml", "trado": "deploy/configs/trado8b_1node.yaml"}
# learner settings measured against the shipped default (short jobs: 3 steps, no eval, no checkpoint)
VARIANTS = {
    "variant_prefetch_5e7": ["learner.deepspeed.prefetch_bucket_size=50000000"],
    "variant_micro_batch_32": ["algorithm.micro_batch_size=32"],
    "variant_draw_batch_1": ["estimator.draw_batch=1"],
}
DEFAULT_PARTS = ("ckpt_llada,matmul,push,engine_llada,system_llada,lora_llada,ckpt_sdar,system_trado,"
                 "variant_prefetch_5e7,variant_micro_batch_32")
DEFAULT_PARTS_2GPU = ("ckpt_llada_short,matmul,push,system_llada,ckpt_llada,engine_llada,lora_llada,ckpt_sdar_short,"
                      "system_trado")
# 2 GPUs: the layers of a full-parameter job's model at the family's width (the module docstring); tiny: 1 of 2
SHORT_LAYERS = {"llada": 11, "sdar": 11}
LORA = ["learner.lora.rank=128", "learner.lora.alpha=64"]
# the full-parameter 8B job on one learner GPU: fp32 master weights and AdamW moments on the host
OFFLOAD = ["learner.deepspeed.zero_stage=2", "learner.deepspeed.offload_optimizer=cpu"]


@dataclass
class Part(run_all.Job):
    after: tuple[str, ...] = ()  # parts that must have ended first (any status)


def plan(parts: list[str], tiny: bool, work: Path, records: Path, n_gpus: int,
         release_tokenizer: bool = False, devices: bool = True, checkpoint_at: int = 3, profile: bool = True,
         system_timeout_s: float = 450, steps: int = 5, resume: bool = True,
         job_set: tuple[str, ...] = (), short_set: tuple[str, ...] = ()) -> tuple[list[list[Part]], list[Part]]:
    """(parallel lanes, then the parts that take every GPU), in the order of ``parts``, for
    ``n_gpus`` (4, or 2: one after another; see the module docstring); checkpoints and runs go
    under ``work``, each part's JSON record under ``records``. ``devices``: the parts get GPU
    indices (False: a CPU rehearsal of the plan). ``job_set``: overrides for the full jobs,
    ``short_set`` for the short ones (lora_llada, the offload jobs, the variants)."""
    if n_gpus not in (0, 2) and n_gpus < 4:
        raise SystemExit(f"the system benchmark plans for 4 or more GPUs or for 2, not {n_gpus}")
    two = n_gpus == 2
    t = ["--tiny"] if tiny else []
    scale = 3.0 if tiny else 1.0
    shape = {"llada": "tiny-llada" if tiny else "llada-8b", "sdar": "tiny-sdar" if tiny else "sdar-8b"}
    ckpt = {family: work / shape[family] for family in shape}
    short_layers = {family: 1 if tiny else layers for family, layers in SHORT_LAYERS.items()}
    ckpt.update({f"{family}_short": work / f"{shape[family]}-{short_layers[family]}l" for family in shape})

    def gpus(four: list[int], two_gpus: list[int]) -> list[int]:
        return (two_gpus if two else four) if devices and n_gpus else []

    if two:
        ranks_workers = ["--ranks", "1", "--workers", "1"]
    elif n_gpus >= 8 and not tiny:  # the one-node configs as shipped: their own 4 ranks + 4 workers
        ranks_workers = []
    else:
        ranks_workers = ["--ranks", "2", "--workers", "1"] if tiny else ["--ranks", "3", "--workers", "1"]

    def part(name, script, args, gpu_list, timeout, peak=None, after=()):
        return Part(name, script, [*args, "--out", str(records / f"{name}.json")], gpu_list, timeout * scale, peak,
                    after=tuple(after))

    def system(name, family, config, extra, timeout, steps, full_parameter=True):
        model = f"{family}_short" if two and full_parameter else family  # what one 80 GB learner rank holds
        return part(name, "bench_system.py",
                    [*t, "--config", config, "--model-dir", str(ckpt[model]), *ranks_workers, "--steps", str(steps),
                     "--work", str(work / name), "--timeout-s", str(timeout * scale - 25), "--name", name, *extra],
                    gpus(list(range(8)) if n_gpus >= 8 else [0, 1, 2, 3], [0, 1]), timeout, peak="matmul",
                    after=[f"ckpt_{model}"])

    def checkpoint(family, short):
        name = f"ckpt_{family}{'_short' if short else ''}"
        layers = ["--layers", str(short_layers[family])] if short else []
        return part(name, "random_checkpoint.py", ["--shape", shape[family], "--dir", str(ckpt[name[5:]]), *layers,
                                                   *tok], gpus([3], [0]), 120)

    # the save after step 3 leaves steps 4 and 5 for its background write before the run ends
    full = ["--checkpoint-at", str(checkpoint_at), *(["--resume-check"] if resume else []),
            *(["--profile-step", "2"] if profile else []), "--eval-prompts", "16", *(f"--set={o}" for o in job_set)]
    short = ["--eval-prompts", "0", "--skip", "1", *(f"--set={o}" for o in short_set)]
    tok = ["--release-tokenizer"] if release_tokenizer else []  # real shapes always take the released tokenizer
    known = {
        **{p.name: p for p in (checkpoint(f, s) for f in ("llada", "sdar") for s in (False, True))},
        "matmul": part("matmul", "bench_matmul.py", t, gpus([2], [0]), 60),
        "push": part("push", "bench_push.py", [*t, "--reps", "2"], gpus([0, 1], [0, 1]), 120),
        "engine_llada": part("engine_llada", "bench_system.py",
                             [*t, "--engine-only", "--config", CONFIGS["llada"], "--model-dir", str(ckpt["llada"]),
                              *ranks_workers, "--work", str(work / "engine_llada")], gpus([2], [0]), 120,
                             after=["ckpt_llada"]),
        "system_llada": system("system_llada", "llada", CONFIGS["llada"], full, system_timeout_s, steps),
        "lora_llada": system("lora_llada", "llada", CONFIGS["llada"], [*short, *(f"--set={o}" for o in LORA)], 360, 2,
                             full_parameter=False),
        # 2 steps, the second timed: at 8B the first step alone takes ~3 minutes on an H100
        "offload_llada": system("offload_llada", "llada", CONFIGS["llada"], [*short, *(f"--set={o}" for o in OFFLOAD)],
                                440, 2, full_parameter=False),
        # the same with 32-row micro-batches: half the gradient copies to the host per update (the shipped
        # 16 left 48 GiB of the learner's card free)
        "offload_llada_mb32": system("offload_llada_mb32", "llada", CONFIGS["llada"],
                                     [*short, *(f"--set={o}" for o in [*OFFLOAD, "algorithm.micro_batch_size=32"])],
                                     440, 2, full_parameter=False),
        "system_trado": system("system_trado", "sdar", CONFIGS["trado"], full, system_timeout_s, steps),
    }
    for name, overrides in VARIANTS.items():
        known[name] = system(name, "llada", CONFIGS["llada"], [*short, *(f"--set={o}" for o in overrides)], 200, 3)
    unknown = [p for p in parts if p not in known]
    if unknown:
        raise SystemExit(f"unknown parts {unknown}; known: {', '.join(known)}")
    chosen = [known[p] for p in parts]
    if tiny or n_gpus < 4:  # one lane: everything in the order given
        return [], chosen
    lanes = [[p for p in chosen if p.gpus == [3]], [p for p in chosen if p.gpus == [2]],
             [p for p in chosen if p.gpus == [0, 1]]]
    return [lane for lane in lanes if lane], [p for p in chosen if len(p.gpus) >= 4]


class SystemRunner(run_all.Runner):
    """run_all's runner (one process per part, its timeout, the global deadline) with part
    dependencies, and results.json + summary.md as the record."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ended: dict[str, threading.Event] = {}
        self.plan_gpus = self.n_gpus  # the GPUs the parts were planned for (--plan-gpus)

    def run(self, job: Part) -> None:
        for name in job.after:
            if name in self.ended:
                self.ended[name].wait()
        try:
            if any(self.jobs.get(n) and self.jobs[n].record.get("status") != "ok" for n in job.after):
                job.record = {"status": "skipped", "reason": f"needs {', '.join(job.after)}, which did not finish"}
                self.jobs[job.name] = job
                self.say(f"SKIP {job.name}: {job.record['reason']}")
                self.snapshot()
                return
            super().run(job)
        finally:
            self.ended[job.name].set()

    def snapshot(self):
        with self.lock:
            records = {name: job.record for name, job in self.jobs.items() if job.record}
            data = {"suite": self.suite, "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "gpus": self.n_gpus,
                    "tiny": self.tiny, "plan_gpus": self.plan_gpus, "wall_s": round(time.monotonic() - self.t0, 1),
                    "parts": records}
            run_all._write(self.out / "results.json", json.dumps(data, indent=1, default=str))
            try:
                text = summary(data)
            except Exception as exc:  # noqa: BLE001 - the raw results are written already
                text = f"(summary failed: {exc!r}; see results.json)"
            run_all._write(self.out / "summary.md", text + "\n")
        return data, text


def summary(data: dict) -> str:
    """The system job's targets (one row each, from this run only) and each job's table."""
    parts = {k: v for k, v in data["parts"].items()}
    res = lambda name: (parts.get(name) or {}).get("result") or {}  # noqa: E731
    got = lambda name, *keys: _dig(res(name), "parts", *keys)  # noqa: E731
    lines = [f"# System benchmark ({data['gpus']} GPUs, planned for {data.get('plan_gpus', data['gpus'])}"
             f"{', tiny CPU rehearsal' if data['tiny'] else ''}, {data['wall_s']:.0f} s)", "",
             "| part | status | wall s |", "|---|---|---|"]
    for name, p in parts.items():
        errors = ", ".join((p.get("result") or {}).get("errors") or {})
        lines.append(f"| {name} | {p.get('status')}{' (' + errors + ')' if errors else ''} | {p.get('wall_s', '')} |")
    peak = got("matmul", "matmul", "tflops_median")
    env = (res("matmul").get("environment") or {})
    lines += ["", f"Card: {env.get('gpu')}; measured matmul {_f(peak, '{:.3g}')} TFLOP/s."]
    for name in [n for n in parts if n.startswith("ckpt_")]:
        written = got(name, "write") or {}
        if written.get("parameters"):
            lines.append(f"Model {name}: {written.get('shape')}, {written.get('layers') or 'all'} layers, "
                         f"{written['parameters']:,} parameters.")
    lines += ["", "| target | measured | goal |", "|---|---|---|"]
    raw = got("push", "raw_buckets_512mb", "median_s") or got("push", "raw_per_tensor", "median_s")
    raw_gib = got("push", "weights", "gib")
    model_gib = {"system_llada": "ckpt_llada", "system_trado": "ckpt_sdar"}
    engine = got("engine_llada", "engine", "tokens_per_s")
    for name in ("system_llada", "system_trado"):
        f = got(name, "job", "figures") or {}
        if not f.get("steps"):
            continue
        timed = set(f["timed_steps"])
        push = [s["time/weight_push"] for s in f["per_step"] if s["step"] in timed and s.get("time/weight_push")]
        push_med = sorted(push)[len(push) // 2] if push else None
        # the raw broadcast scaled to this job's bytes (the push benchmark sends LLaDA-8B's 16 GB)
        short = "_short" if data.get("plan_gpus", data["gpus"]) == 2 else ""
        gib = (got(model_gib[name] + short, "write") or {}).get("gib")
        raw_here = raw * gib / raw_gib if raw and gib and raw_gib else None
        busy = ", ".join(f"{a} {_f(v.get('gpu_busy_fraction'), '{:.0%}')}" for a, v in f["actors"].items())
        lines += [
            f"| {name}: learner MFU (perf/mfu at the measured rate) | {_f(f.get('learner_mfu'), '{:.1%}')} | >= 40% |",
            f"| {name}: in-job push / raw broadcast of the same {_f(gib, '{:.1f}')} GiB | {_f(push_med, '{:.3f}')} s / "
            f"{_f(raw_here, '{:.3f}')} s = "
            f"{_f(push_med / raw_here if push_med and raw_here else None, '{:.1f}')}x"
            # the spread: a staged push shares the worker's GPU with its generation, so steps differ
            f"{f' (timed steps {min(push):.3f}-{max(push):.3f} s)' if len(push) > 1 else ''} | <= 1.5x |",
            f"| {name}: step after the checkpoint / plain step (wall; training) | "
            f"{_f(f.get('step_after_checkpoint_ratio'), '{:.2f}')}x; "
            f"{_f(f.get('train_after_checkpoint_ratio'), '{:.2f}')}x (against {f.get('step_plain_steps')} step(s) "
            "before the save)"
            " | <= 1.1x |",
            f"| {name}: GPU busy per actor | {busy} | >= 70% each |",
        ]
        joins = _join_waits(f.get("push_by_actor_s") or {})
        if joins:  # a push's time spent before its first byte (the rest is the transfer itself)
            lines.append(f"| {name}: of each push, waiting for the other end to join (learner ranks / workers) | "
                         f"{joins} | - |")
        if name == "system_llada":
            rate = f.get("rollout_tokens_per_s_generating")
            lines.append(
                f"| {name}: rollout tokens/s in the job / engine alone | "
                f"{_f(rate, '{:.0f}')} / {_f(engine, '{:.0f}')} = "
                f"{_f(rate / engine if rate and engine else None, '{:.0%}')} | >= 70% |"
            )
        verdict = got(name, "resume_check")
        if verdict is None:
            continue  # --no-resume-check
        lines.append(f"| {name}: `train --resume` continued from the checkpoint | {verdict.get('continued')} "
                     f"(resumed at {verdict.get('resumed_at_step')}, last step {verdict.get('last_step')}) | yes |")
    lora = got("lora_llada", "job", "figures") or {}
    if lora.get("steps"):
        full_push = (got("system_llada", "job", "figures") or {}).get("push_s_median")
        peaks = lora.get("learner_peak_gpu_gb") or lora.get("learner_peak_rss_gb") or {}
        kind = "GPU" if lora.get("learner_peak_gpu_gb") else "host RSS"
        by_actor = ", ".join(f"{k} {v:.2f}" for k, v in (lora.get("push_by_actor_s") or {}).items())
        lines += [f"| lora_llada (r 128, alpha 64): learner peak {kind} GB per rank | "
                  f"{', '.join(f'{r} {v:.1f}' for r, v in peaks.items()) or 'n/a'} | fits the card |",
                  f"| lora_llada: in-job push per step (median) / system_llada's full push | "
                  f"{_f(lora.get('push_s_median'), '{:.2f}')} s / {_f(full_push, '{:.2f}')} s (per actor: "
                  f"{by_actor or 'n/a'}) | smaller |"]
    base = got("system_llada", "job", "figures") or {}
    off = got("offload_llada", "job", "figures") or {}
    if off.get("steps"):
        layers = lambda name: (got(name, "write") or {}).get("layers")  # noqa: E731
        stand_in = "ckpt_llada_short" if layers("ckpt_llada_short") else "ckpt_llada"
        lines.append(
            f"| offload_llada (8B full-parameter, ZeRO-2, optimizer on the host): train s, MFU; learner peak GPU / "
            f"RSS GB | {_f(off.get('train_s_median'), '{:.1f}')} s, {_f(off.get('learner_mfu'), '{:.1%}')}; "
            f"{_f(max((off.get('learner_peak_gpu_gb') or {'-': None}).values(), key=lambda v: v or 0), '{:.1f}')} / "
            f"{_f(max((off.get('learner_peak_rss_gb') or {'-': None}).values(), key=lambda v: v or 0), '{:.1f}')} "
            f"(system_llada at {layers(stand_in) or 'all'} layers: {_f(base.get('train_s_median'), '{:.1f}')} s, "
            f"{_f(base.get('learner_mfu'), '{:.1%}')}) | runs on 2 GPUs |")
    for name in [n for n in parts if n.startswith("variant_")]:
        f = got(name, "job", "figures") or {}
        if f.get("steps"):
            lines.append(
                f"| {name} ({', '.join(VARIANTS.get(name, []))}): learner step, MFU, push | "
                f"{_f(f.get('train_s_median'), '{:.1f}')} s, {_f(f.get('learner_mfu'), '{:.1%}')}, "
                f"{_f(f.get('push_s_median'), '{:.3f}')} s (shipped: {_f(base.get('train_s_median'), '{:.1f}')} s, "
                f"{_f(base.get('learner_mfu'), '{:.1%}')}, {_f(base.get('push_s_median'), '{:.3f}')} s) "
                "| the faster wins |"
            )
    for name in [n for n in parts if n.startswith(("system_", "lora_", "offload_", "variant_"))]:
        for part in ("job", "resume"):
            figures = got(name, part, "figures")
            if figures:
                lines += ["", system_report.markdown(f"{name} / {part}", figures).rstrip()]
                problems = got(name, part, "problems")
                if problems:
                    lines.append(f"problems: {problems}")
        for prof in got(name, "job", "learner_profile") or []:
            top = ", ".join(f"{k['name'][:40]} {k['share_of_busy']:.0%}" for k in (prof.get("top_kernels") or [])[:5])
            lines.append(
                f"\nlearner rank {prof['rank']} step {prof['step']} under torch.profiler "
                f"({prof.get('window', 'whole step')}): {prof['wall_s']:.1f} s wall, "
                f"device busy {_f(prof.get('device_busy_fraction'), '{:.0%}')}, {prof['kernels']} kernels, "
                f"{prof['host_aten_ops']} host ops; top kernels: {top or 'n/a (CPU)'}"
            )
    return "\n".join(lines)


def card(data: dict) -> str:
    """The card the parts measured on (the first part that recorded one)."""
    for part in data["parts"].values():
        gpu = _dig(part, "result", "environment", "gpu")
        if gpu:
            return gpu
    return "unknown"


def _dig(d, *keys):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _join_waits(by_actor: dict[str, float]) -> str:
    """'max learner push_wait / max worker push_stage_wait' seconds a push, from a job's
    push_by_actor_s; '' when the record predates those clocks."""
    learner = [v for k, v in by_actor.items() if k.endswith("/push_wait")]
    worker = [v for k, v in by_actor.items() if k.endswith("/push_stage_wait")]
    if not learner and not worker:
        return ""
    return f"{_f(max(learner, default=None), '{:.3f}')} s / {_f(max(worker, default=None), '{:.3f}')} s"


def _f(x, fmt: str) -> str:
    return "n/a" if x is None else fmt.format(x)


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line, a suite's arguments first (suites.expand)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default=None, help=f"one of {', '.join(suites.RUN_SYSTEM)} (suites.py): its parts and "
                    "options")
    ap.add_argument("--tiny", action="store_true", help="the tiny shapes on the CPU (rehearsal)")
    ap.add_argument("--parts", default=None, help="comma list, in priority order (default: the suite's; without one "
                    "DEFAULT_PARTS, on 2 GPUs DEFAULT_PARTS_2GPU)")
    ap.add_argument("--plan-gpus", type=int, default=None,
                    help="plan for this many GPUs (4+ or 2; default: the GPUs here); with --tiny only the plan changes")
    ap.add_argument("--deadline-s", type=float, default=540.0)
    ap.add_argument("--work", default=None, help="checkpoints and runs (default: /dev/shm when it has room, else /tmp)")
    ap.add_argument("--out", default=os.environ.get("OUT") or None, help="default runs/bench/system (or the suite's)")
    ap.add_argument("--release-tokenizer", action="store_true",
                    help="--tiny: the released tokenizers (chat templates) instead of the character one (slower)")
    ap.add_argument("--checkpoint-at", type=int, default=3, help="the full jobs save after this step (of --steps)")
    ap.add_argument("--steps", type=int, default=5, help="the full jobs' steps (system_llada, system_trado)")
    ap.add_argument("--no-resume", action="store_true", help="the full jobs without their `train --resume` check")
    ap.add_argument("--job-set", action="append", default=[],
                    help="an override key=value for the full jobs (repeatable), e.g. learner.checkpoint.reserve=false")
    ap.add_argument("--short-set", action="append", default=[],
                    help="an override key=value for the short jobs (lora_llada, offload_llada*, the variants), "
                         "e.g. weights.backend=nccl")
    ap.add_argument("--no-profile", action="store_true", help="the full jobs run without the profiled step")
    ap.add_argument("--no-copy", action="store_true", help="no copy of the suite's record in tests/benchmarks/results/")
    ap.add_argument("--system-timeout-s", type=float, default=450.0, help="each full job's limit (job + resume)")
    return ap.parse_args(suites.expand("run_system", argv))


def main() -> None:
    a = parse(sys.argv[1:])
    out = Path(a.out or Path("runs") / "bench" / (a.suite or "system"))
    out.mkdir(parents=True, exist_ok=True)
    import torch

    n_gpus = torch.cuda.device_count()
    if not n_gpus and not a.tiny:
        raise SystemExit("no CUDA device: run with --tiny to rehearse on the CPU")
    plan_gpus = n_gpus if a.plan_gpus is None else a.plan_gpus
    if n_gpus and plan_gpus > n_gpus:
        raise SystemExit(f"--plan-gpus {plan_gpus}: only {n_gpus} GPU(s) here")
    chosen = suites.suite("run_system", a.suite) if a.suite else None
    if chosen:
        parts = a.parts or (chosen.parts_2gpu if plan_gpus == 2 else chosen.parts)
    else:
        parts = a.parts or (DEFAULT_PARTS_2GPU if plan_gpus == 2 else DEFAULT_PARTS)
    runner = SystemRunner(out, a.deadline_s, n_gpus, a.tiny)
    runner.plan_gpus = plan_gpus
    work = Path(a.work) if a.work else scratch(a.tiny)
    work.mkdir(parents=True, exist_ok=True)
    lanes, after = plan([p for p in parts.split(",") if p], a.tiny, work, runner.work, plan_gpus, a.release_tokenizer,
                        devices=n_gpus > 0, checkpoint_at=a.checkpoint_at, profile=not a.no_profile,
                        system_timeout_s=a.system_timeout_s, steps=a.steps, resume=not a.no_resume,
                        job_set=tuple(a.job_set), short_set=tuple(a.short_set))
    for part in [p for lane in lanes for p in lane] + after:
        runner.ended[part.name] = threading.Event()
    runner.suite = a.suite or "system"
    runner.say(f"system benchmark: suite {runner.suite}, {n_gpus} GPU(s), planned for {plan_gpus}, "
               f"torch {torch.__version__}, tiny={a.tiny}, deadline {a.deadline_s:.0f} s, work {work}, parts {parts}")
    runner.run_plan(lanes, after)
    data, text = runner.snapshot()
    if a.suite and not (a.tiny or a.no_copy):
        shape = chosen.shape_2gpu if plan_gpus == 2 else chosen.shape
        kept = suites.keep(out, suites.record_name(f"system-{a.suite}", shape, card(data), plan_gpus), "summary.md")
        runner.say(f"copied results.json and summary.md to {kept}.*")
    runner.say(f"wrote {out}/results.json, summary.md, run.log")
    print("\n" + text, flush=True)
    failed = runner.failures()
    if failed:
        runner.say("FAILED: " + ", ".join(f"{name} ({status})" for name, status in failed.items()))
        sys.exit(1)


def scratch(tiny: bool) -> Path:
    """/dev/shm (checkpoints load from memory) when it has room for two 8B checkpoints, else /tmp;
    the jobs' own checkpoints (~110 GB at 8B) go under the same directory and are removed after
    each job's resume check."""
    shm = Path("/dev/shm")
    if not tiny and shm.is_dir() and os.statvfs(shm).f_bavail * os.statvfs(shm).f_frsize > 200 * 2**30:
        return shm / "stabledrl-system"
    return Path("/tmp/stabledrl-system")


if __name__ == "__main__":
    main()
