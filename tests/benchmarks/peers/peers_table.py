"""The peer benchmark's table, written from its records (run_peers.py's results.json): each loop's
runs reduced to a median and a range, project / peer with its range, the roofline of each loop
(roofline.py) and the target each row is held to. ``python peers_table.py results.json`` writes the
table again from a record (the GPU run's, or several merged).

A loop's figure is the median over its runs that finished (exit 0, not stopped); its range is the
least and the most of them. project / peer is the ratio of the medians; its range pairs the worst
run of one side with the best of the other (the ratio no pairing of runs falls outside). A target:
the fast loops 5x; at the release's sampler 1.5x, or 90% of the ceiling's ratio where the ceiling is below 1.5x
(roofline.target). Every row names its layer count, and the header its card and host.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import peer_events as pe  # noqa: E402
import roofline as rl  # noqa: E402

FAST_TARGET = 5.0
# the StableDRL release's allocator peak on one H200 at LLaDA-8B's width, by layers (measured outside these
# records): the reference of a colocated job's memory where no release ran beside it
RELEASE_PEAK_GIB = {8: 57.2, 16: 80.9, 24: 104.7}
MEDIAN_FIGURES = pe.FIGURES + ("gpu_memory_used_max_gib",)


def finished(run: dict) -> bool:
    return run.get("rc") == 0 and not run.get("stopped") and bool(run.get("figures", {}).get("samples_per_s_per_gpu"))


def summarise(part: dict) -> dict:
    """A part's ``figures`` (the median of each over its finished runs; peak memory: the largest) and
    ``spread`` ((least, most) of each)."""
    runs = [r for r in part["runs"] if finished(r)]
    part["finished"] = len(runs)
    part["figures"], part["spread"] = {}, {}
    for key in MEDIAN_FIGURES:
        xs = [r["figures"][key] for r in runs if r["figures"].get(key) is not None]
        if xs:
            part["figures"][key] = max(xs) if "memory" in key else statistics.median(xs)
            part["spread"][key] = (min(xs), max(xs))
    return part


def is_fast(sets: Optional[list[str]]) -> bool:
    """A loop with the fast sampler (a cache): held to 5x; unknown overrides count as fast."""
    return sets is None or any(s.startswith("sampler.cache=") for s in sets)


def table_rows(results: dict) -> list[dict]:
    """One row per loop: the peer's, then each project loop's with project / peer, its range, its
    roofline and its target."""
    out = []
    matmul = results.get("matmul_tflops")
    parts = {k: v for k, v in results["parts"].items() if "runs" in v}
    for layers, pair in sorted({(p["layers"], p["pair"]) for p in parts.values()},
                               key=lambda x: (["stabledrl", "d1"].index(x[1]) if x[1] in ("stabledrl", "d1") else 9,
                                              x[0])):
        peer = parts.get(f"{pair}_L{layers}_peer")
        peer_roof = roofline_of(peer, matmul, ceiling=False) if peer else None
        if peer:
            out.append({"name": f"{pair} release (peer)", "layers": layers, "runs": len(peer["runs"]),
                        "finished": peer.get("finished", 0), "figures": peer.get("figures", {}),
                        "spread": peer.get("spread", {}), "ratio": None, "roofline": peer_roof})
        for part in parts.values():
            if part["pair"] != pair or part["layers"] != layers or part["loop"] == "peer":
                continue
            sets = results.get("variants", {}).get(part["loop"])
            roof = roofline_of(part, matmul)
            row = {"name": f"{pair}: stabledrl train, {part['loop'].replace('_', ' ')}", "layers": layers,
                   "runs": len(part["runs"]), "finished": part.get("finished", 0), "figures": part.get("figures", {}),
                   "spread": part.get("spread", {}), "roofline": roof, "ratio": None, "ratio_range": None}
            failed = [r for r in part["runs"] if not finished(r)]
            if failed:
                why = failed[-1].get("dry_run_error") or f"rc {failed[-1].get('rc')}" + (
                    ", stopped" if failed[-1].get("stopped") else "")
                row["name"] += f" ({len(failed)} of {len(part['runs'])} FAILED: {why})"
            ceiling_ratio = None
            if peer and peer.get("figures") and row["finished"]:
                row["ratio"] = pe.compare(row["figures"], peer["figures"])
                row["ratio_range"] = ratio_range(part, peer)
                ceiling = (roof or {}).get("ceiling_samples_per_s_per_gpu")
                base = peer["figures"].get("samples_per_s_per_gpu")
                ceiling_ratio = ceiling / base if ceiling and base else None
                row["ceiling_ratio"] = ceiling_ratio
            row["target"] = FAST_TARGET if is_fast(sets) else rl.target(ceiling_ratio)
            row["memory"] = memory_of(part, peer, pair, layers)
            # the most graphs any finished run compiled in its timed steps, per side (compiling that its
            # rates carry; common/compiling.py), and the timed steps that compiled in any of them
            done = [r for r in part["runs"] if finished(r)]
            counts = [r["figures"].get("compiles_timed") or {} for r in done]
            row["compiles_timed"] = {side: max((c.get(side) or 0.0 for c in counts), default=0.0)
                                     for side in ("rollout", "learner")}
            row["compiled_steps"] = sorted({s["step"] for r in done for s in r["figures"].get("per_step") or []
                                            if s["step"] in (r["figures"].get("timed_steps") or [])
                                            and any((s.get("compiles") or {}).values())})
            out.append(row)
    return out


def memory_of(part: dict, peer: Optional[dict], pair: str, layers: int) -> dict:
    """Each GPU's peak as nvidia-smi saw it (both processes of a colocated GPU, their contexts and
    caches), each actor's allocator peak, the release's beside it and (StableDRL) its figure from one H200."""
    runs = [r for r in part["runs"] if finished(r)]
    actors: dict[str, float] = {}
    for r in runs:
        for name, a in (r.get("actors") or {}).items():
            if a.get("peak_memory_gib"):
                actors[name] = max(actors.get(name, 0.0), a["peak_memory_gib"])
    release = (peer or {}).get("figures", {})
    return {"gpu_peak_gib": part.get("figures", {}).get("gpu_memory_used_max_gib"), "actors_gib": actors,
            "release_allocator_gib": release.get("peak_memory_gib"), "release_gpu_gib":
            release.get("gpu_memory_used_max_gib"),
            "release_h200_gib": RELEASE_PEAK_GIB.get(layers) if pair == "stabledrl" else None}


def ratio_range(part: dict, peer: dict) -> Optional[tuple[float, float]]:
    mine = [r["figures"]["samples_per_s_per_gpu"] for r in part["runs"] if finished(r)]
    theirs = [r["figures"]["samples_per_s_per_gpu"] for r in peer["runs"] if finished(r)]
    if not mine or not theirs:
        return None
    return min(mine) / max(theirs), max(mine) / min(theirs)


def roofline_of(part: dict, matmul: Optional[float], ceiling: bool = True) -> Optional[dict]:
    """The median over a part's finished runs of each run's rates and shares (roofline.py), of the
    matmul rate each was measured against (its own machine's, where recorded), of the completion
    positions its generation committed per row and forward, and (a project loop at the release's sampler) the ceiling
    of its FLOPs per sample, where its generation FLOPs are counted."""
    per_run = []
    for r in part["runs"]:
        raw = r.get("figures", {}).get("roofline") if finished(r) else None
        if not raw:
            continue
        flops, seconds, gpu_s = raw["flops"], raw["seconds"], raw["gpu_s"]
        rate = r.get("matmul_tflops") or matmul  # the run's own machine's rate, where recorded
        one = {**rl.rates(flops, seconds, rate), **{f"share_{k}": v for k, v in rl.shares(seconds, gpu_s).items()},
               "matmul_tflops": rate, "positions_per_row_forward": raw.get("positions_per_row_forward")}
        if ceiling and not raw.get("cached"):  # the ceiling is the release's sampler's
            one["ceiling_samples_per_s_per_gpu"] = rl.ceiling(flops, raw["samples"], rate)
        per_run.append(one)
    if not per_run:
        return None
    keys = sorted({k for one in per_run for k in one})
    return {k: statistics.median(xs) if (xs := [o[k] for o in per_run if o.get(k) is not None]) else None
            for k in keys}


def peer_roofline(figures: dict, shape: dict, lora: bool) -> Optional[dict]:
    """A peer run's roofline inputs: FLOPs of the forwards its harness counted, its GPU-seconds by activity."""
    if not figures.get("samples"):
        return None
    generate = (figures.get("forwards") or {}).get("generate") or {}
    return {"flops": rl.peer_flops(figures.get("forwards") or {}, shape, lora), "seconds": figures["seconds"],
            "gpu_s": figures["gpu_s"], "samples": figures["samples"],
            "positions_per_row_forward": per_row_forward(figures.get("tokens"), generate.get("rows"))}


def project_roofline(f: dict, shape: dict, config: Path, sets: list[str], rows: Path, n_gpus: int) -> Optional[dict]:
    """A project run's roofline inputs from its report (system_report.analyse: the timed steps'
    totals and every actor's seconds) and its config (what one sample's estimates cost)."""
    from stabledrl.common.config.job import load_job_config
    from stabledrl.common.estimators import distinct_iteration_masks
    from stabledrl.learner.losses import needs_whole_groups
    from stabledrl.learner.rl_batch import micro_batch_count
    from stabledrl.coordinator.decisions.step_metrics import forwards_per_estimate

    totals = f.get("timed_totals") or {}
    if not totals.get("samples"):
        return None
    cfg = load_job_config(str(config), [f"task.source.path={rows}", *sets])
    kl = getattr(cfg.loss, "kl_beta", 0.0) or getattr(getattr(cfg.loss, "base", None), "kl_beta", 0.0)
    mu, masks = cfg.algorithm.inner_iterations, getattr(cfg.estimator, "masks", "shared")
    # the learner's estimates without a gradient, per sample a step: a reference's (once with shared masks, else
    # once an iteration) and, under per-iteration masks, the old policy's and the reference's once per mask that a
    # micro-batch's iterations read (d1's counters: with 2 micro-batches a rank and update, 6 of 12; learner/worker.py)
    per_mask = float(mu)
    if masks == "per_iteration":  # a rank's micro-batches per update, cut as the learner cuts them
        groups = [cfg.algorithm.group_size] * max(1, cfg.algorithm.groups_per_step // max(1, n_gpus))
        units = micro_batch_count(groups, cfg.algorithm.micro_batch_size, needs_whole_groups(cfg.loss))
        per_mask = float(distinct_iteration_masks(units, mu))
    reference = 0.0 if not kl else (1.0 if masks == "shared" else per_mask)
    reference += per_mask if masks == "per_iteration" and mu > 1 else 0.0
    family_block = cfg.sampler.block_length or cfg.sampler.gen_length
    cached = cfg.sampler.resolved_cache(False) != "none"
    flops = rl.project_flops(totals, shape, gen_length=cfg.sampler.gen_length, block_length=family_block,
                             views=forwards_per_estimate(cfg.estimator), inner_iterations=mu,
                             lora=cfg.learner.lora is not None, reference_forwards=reference, cached=cached)
    seconds = {"generate": 0.0, "score": 0.0, "reward": 0.0, "learner": 0.0, "optimizer": 0.0,
               "learner_score": 0.0, "push": 0.0}
    for name, actor in (f.get("actors") or {}).items():
        sec = actor.get("seconds") or {}
        if name.startswith("rollout"):
            for k in ("generate", "score", "reward"):
                seconds[k] += sec.get(k, 0.0)
            seconds["push"] += sum(v for k, v in sec.items() if k.startswith("push") and k != "push_stage")
        else:
            seconds["optimizer"] += sec.get("train_optimizer", 0.0)
            seconds["learner_score"] += sec.get("train_score", 0.0)
            seconds["learner"] += sec.get("train", 0.0) - sec.get("train_optimizer", 0.0) - \
                sec.get("train_score", 0.0)
            seconds["push"] += sec.get("push", 0.0)
    return {"flops": flops, "seconds": seconds, "gpu_s": totals.get("step_s", 0.0) * max(1, n_gpus),
            "samples": totals["samples"], "cached": cached,
            "positions_per_row_forward": per_row_forward(totals["samples"] * cfg.sampler.gen_length,
                                                         totals.get("forward_rows"))}


def per_row_forward(positions: Optional[float], rows: Optional[float]) -> Optional[float]:
    """Completion positions committed per row and forward of generation: a fixed-step sampler's
    gen_length / steps; with threshold decoding what the forwards committed, a row that waits for its
    batch's block (a cached sampler's) counting its forwards too."""
    return positions / rows if positions and rows else None


def merge(results: dict, earlier: dict, path: str) -> None:
    """Take an earlier run's loops (same card and GPU count only: ratios never mix cards); a loop that an
    earlier merge brought too gets this record's runs after its own."""
    if earlier.get("card", {}).get("name") != results["card"]["name"] or earlier.get("n_gpus") != results["n_gpus"]:
        results["merged"].append({"path": str(path), "skipped": f"measured on {earlier.get('card')} x "
                                  f"{earlier.get('n_gpus')}, not on {results['card']} x {results['n_gpus']}"})
        return
    for key, part in earlier.get("parts", {}).items():  # each run keeps the matmul rate of its own machine
        for run in part.get("runs", []):
            run.setdefault("matmul_tflops", earlier.get("matmul_tflops"))
        mine = results["parts"].get(key)
        if mine is None or "runs" not in part or "runs" not in mine:
            results["parts"][key] = part
            continue
        # a loop in several merged records: its runs joined, numbered on
        for run in part["runs"]:
            mine["runs"].append({**run, "run": len(mine["runs"])})
        summarise(mine)
    results["variants"] = {**earlier.get("variants", {}), **results.get("variants", {})}
    results["merged"].append({"path": str(path), "parts": sorted(earlier.get("parts", {})),
                              "host": earlier.get("host"), "machine": earlier.get("machine")})


def header(results: dict) -> str:
    c = results["card"]
    hosts = sorted({results.get("host")} | {m.get("host") for m in results.get("merged", []) if m.get("host")})
    runs = [r for p in results.get("parts", {}).values() for r in p.get("runs", [])]
    rates = sorted({round(r["matmul_tflops"]) for r in runs if r.get("matmul_tflops")}) or (
        [round(results["matmul_tflops"])] if results.get("matmul_tflops") else [])
    machines = len({json.dumps(r["machine"], sort_keys=True) for r in runs if r.get("machine")})
    # runs from records older than the machine field leave it out
    count = "one machine" if machines == 1 else f"{machines} machines"
    unnamed = sum(1 for r in runs if not r.get("machine"))
    on = f"; {count} (boot id and GPU UUIDs)" if machines else ""
    if machines and unnamed:
        on += f", and {unnamed} run{'s' if unnamed > 1 else ''} of a record that kept no machine id"
    return (f"Card: {c['name']} x {results['n_gpus']} used (every loop holds all of them); host "
            f"{', '.join(h for h in hosts if h)}{on}; measured bf16 matmul rate "
            f"{' and '.join(map(str, rates)) + ' TFLOP/s' if rates else 'not measured'}"
            f"{' (each run against its own machine)' if len(rates) > 1 else ''}. Figures: median over a loop's "
            f"runs (range); ratios project / peer (> 1: the project is better).\n\n")


def _fmt(x: Any, digits: int = 2) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.{digits}f}" if abs(x) < 1000 else f"{x:,.0f}"
    return str(x)


def _cell(row: dict, key: str, digits: int) -> str:
    value, spread = row["figures"].get(key), row.get("spread", {}).get(key)
    if value is None:
        return "—"
    if spread and row.get("finished", 0) > 1:
        return f"{_fmt(value, digits)} ({_fmt(spread[0], digits)}-{_fmt(spread[1], digits)})"
    return _fmt(value, digits)


def _rate(x: Optional[float]) -> str:
    return "—" if x is None else f"{x:.3g}"


def _pct(x: Optional[float]) -> str:
    return "—" if x is None else f"{100 * x:.0f}%"


def markdown(rows: list[dict]) -> str:
    """The speed table, then the roofline table (the same rows)."""
    head = ("| loop | layers | runs | samples/s/GPU | rollout tok/s/GPU | learner s/sample | first step s | "
            "peak GiB (allocator / GPU) | samples/s ratio (range) (target) |\n|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        ratio = r.get("ratio")
        if ratio is not None:
            value, span, target = ratio.get("samples_per_s_per_gpu"), r.get("ratio_range"), r.get("target")
            spread = f" ({_fmt(span[0])}-{_fmt(span[1])})" if span and r.get("finished", 0) > 1 else ""
            cell = f"{_fmt(value)}×{spread} (≥ {_fmt(target)}×: {pe.verdict(value, target)})"
        elif "FAILED" in r["name"]:
            cell = "failed: not compared"
        else:
            cell = "peer" if "target" not in r else "—"
        f = r["figures"]
        lines.append(f"| {r['name']} | {r['layers']} | {r['finished']} of {r['runs']} | "
                     f"{_cell(r, 'samples_per_s_per_gpu', 3)} | {_cell(r, 'rollout_tokens_per_s_per_gpu', 0)} | "
                     f"{_cell(r, 'learner_s_per_sample', 3)} | {_cell(r, 'first_step_s', 1)} | "
                     f"{_fmt(f.get('peak_memory_gib'), 1)} / {_fmt(f.get('gpu_memory_used_max_gib'), 1)} | {cell} |")
    recompiled = [f"{r['name']} ({r['layers']} layers): rollout {c['rollout']:g}, learner {c['learner']:g}"
                  + (f" (at step {', '.join(map(str, r['compiled_steps']))})" if r.get("compiled_steps") else "")
                  for r in rows if any((c := r.get("compiles_timed") or {}).values())]
    if recompiled:
        lines += ["", "Graphs compiled during the timed steps, the most of any run (the rates above include the "
                  "compiling: a warm-up too short for the shapes the job meets, or shapes that keep recompiling): "
                  + "; ".join(recompiled) + "."]
    lines += ["", "| loop | layers | generate TFLOP/s (of matmul) | positions / row-forward | score TFLOP/s | "
              "learner TFLOP/s (of matmul) | shares: generate / score / learner / optimizer / push / reward / idle | "
              "ceiling samples/s/GPU (over the release) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        roof = r.get("roofline") or {}
        if not roof:
            continue
        shares = " / ".join(_pct(roof.get(f"share_{k}")) for k in
                            ("generate", "score", "learner", "optimizer", "push", "reward", "idle"))
        ceiling = _fmt(roof.get("ceiling_samples_per_s_per_gpu"), 3)
        if r.get("ceiling_ratio"):
            ceiling += f" ({_fmt(r['ceiling_ratio'])}×)"
        lines.append(f"| {r['name']} | {r['layers']} | {_rate(roof.get('generate_tflops'))} "
                     f"({_pct(roof.get('generate_of_matmul'))}) | {_fmt(roof.get('positions_per_row_forward'), 2)} | "
                     f"{_rate(roof.get('score_tflops'))} | "
                     f"{_rate(roof.get('learner_tflops'))} ({_pct(roof.get('learner_of_matmul'))}) | {shares} | "
                     f"{ceiling} |")
    lines += ["", "| loop | layers | peak per GPU (nvidia-smi) GiB | allocator peaks GiB | the release here: "
              "allocator / GPU GiB | the release on one H200 (allocator) GiB |", "|---|---|---|---|---|---|"]
    for r in rows:
        m = r.get("memory")
        if not m:
            continue
        actors = ", ".join(f"{k} {_fmt(v, 1)}" for k, v in sorted(m["actors_gib"].items())) or "—"
        lines.append(f"| {r['name']} | {r['layers']} | {_fmt(m['gpu_peak_gib'], 1)} | {actors} | "
                     f"{_fmt(m['release_allocator_gib'], 1)} / {_fmt(m['release_gpu_gib'], 1)} | "
                     f"{_fmt(m['release_h200_gib'], 1)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python peers_table.py RESULTS.json [MORE.json ...]: the later ones merged in
    record = json.loads(Path(sys.argv[1]).read_text())
    record.setdefault("merged", [])
    for path in sys.argv[2:]:
        merge(record, json.loads(Path(path).read_text()), path)
    record["rows"] = table_rows(record)
    print(header(record) + markdown(record["rows"]), end="")
