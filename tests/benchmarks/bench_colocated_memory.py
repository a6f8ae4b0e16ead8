"""The colocated job's memory at depth: the StableDRL recipe as committed (``cluster.colocate``: a learner
rank and a rollout worker sharing every GPU, the worker viewing its rank's parameters: ``weights.ipc``
auto) on a random checkpoint of LLaDA-8B's width at ``--layers`` layers, for ``--steps`` steps, and the peak memory
of every GPU against the StableDRL release's at the same depth.

    python tests/benchmarks/bench_colocated_memory.py --layers 24 --steps 6 --out $OUT/memory   # one H200
    python tests/benchmarks/bench_colocated_memory.py --tiny --steps 2 --out /tmp/memory           # CPU check

The job runs through the peer benchmark's project loop (peers/run_peers.py: the recipe as committed, its
task source the generated rows, ``groups_per_step`` = GPUs x ``--groups``), so its record is the same as a
table row's. Memory per GPU: nvidia-smi's ``memory.used`` sampled every 200 ms over the whole job (both
processes, their CUDA contexts and allocator caches: what has to fit), and each actor's allocator peak
(``max_memory_allocated``). The release's figure is its own allocator peak on one H200, measured outside these
records (``RELEASE_PEAK_GIB``); a peer run of the same depth (run_peers.py --loops peer) measures it
again beside. ``weights.ipc=copy`` (``--set``) gives the job as it was before views (three copies of the
weights on each GPU).

Writes ``memory.json`` (the run's record, the verdict) and ``memory.md``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "peers"))
sys.path.insert(0, str(HERE))

import run_peers  # noqa: E402
from peers_table import RELEASE_PEAK_GIB  # noqa: E402


def verdict(record: dict, layers: int, steps: int, card_gib: float | None) -> dict:
    """Whether the job ran its steps and what each GPU held at its peak, beside the release's."""
    f = record.get("figures") or {}
    actors = record.get("actors") or {}
    out = {"layers": layers, "steps_asked": steps, "steps_done": f.get("steps", 0),
           "gpu_peak_gib": f.get("gpu_memory_used_max_gib"), "allocator_peak_gib": f.get("peak_memory_gib"),
           "actors_allocator_peak_gib": {name: a.get("peak_memory_gib") for name, a in actors.items()},
           "release_peak_gib": RELEASE_PEAK_GIB.get(layers), "card_gib": card_gib}
    out["ran"] = record.get("rc") == 0 and out["steps_done"] >= steps
    peak = out["gpu_peak_gib"]
    out["fits"] = bool(out["ran"] and (peak is None or card_gib is None or peak < card_gib))
    return out


def markdown(v: dict, card: dict, host: str, overrides: list[str]) -> str:
    fmt = lambda x: "—" if x is None else f"{x:.1f}"  # noqa: E731
    actors = ", ".join(f"{k} {fmt(x)}" for k, x in sorted(v["actors_allocator_peak_gib"].items()))
    return (f"Colocated memory, LLaDA-8B's width at {v['layers']} layers, {card['name']} x {card['count']} "
            f"({host}); overrides {' '.join(overrides)}\n\n"
            "| steps | peak per GPU (nvidia-smi) GiB | allocator peaks GiB | release's allocator peak GiB | "
            "ran and fits |\n|---|---|---|---|---|\n"
            f"| {v['steps_done']} of {v['steps_asked']} | {fmt(v['gpu_peak_gib'])} | {actors} | "
            f"{fmt(v['release_peak_gib'])} | {'yes' if v['fits'] else 'NO'} |\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--steps", type=int, default=6, help="steps of the job (the first is not timed)")
    ap.add_argument("--groups", type=float, default=0.5,
                    help="the release's rounds a step, over 4 (0.5: 2 groups of 16 a GPU; the learner's micro-batches "
                    "and the worker's requests are the full step's)")
    ap.add_argument("--set", action="append", default=[], help="more overrides key=value")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    out = Path(a.out)
    peers = run_peers.parse(["--peer-root", str(out / "none"), "--out", str(out), "--pairs", "stabledrl", "--loops",
                             "release_sampler", "--layers", str(a.layers), "--project-skip", "1",
                             "--cycles", str(a.steps - 1), "--runs", "1", "--round-scale", str(a.groups),
                             *(["--tiny"] if a.tiny else [])])
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    n_gpus = run_peers.gpu_count(peers)
    run_peers.matmul_rate(peers, work)
    ckpt = run_peers.checkpoint(peers, work, None if a.tiny else a.layers)
    run_peers.rows(work)
    spec = run_peers.pair_spec("stabledrl", n_gpus, a.groups)
    record = run_peers.run_project(peers, "stabledrl", spec, "release_sampler", list(a.set), ckpt, work / "job", n_gpus)
    card = run_peers.card()
    card_gib = None
    try:
        import torch

        card_gib = torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - the record only
        pass
    v = verdict(record, ckpt["layers"], a.steps, card_gib)
    host = __import__("socket").gethostname()
    (out / "memory.json").write_text(json.dumps({"verdict": v, "card": card, "host": host, "checkpoint": ckpt,
                                                 "record": record}, indent=1, default=str))
    (out / "memory.md").write_text(markdown(v, card, host, record.get("overrides", [])))
    print((out / "memory.md").read_text(), end="")
    return 0 if v["fits"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
