"""DeepSpeed's universal checkpoint against the project's re-sharding (learner/reshard.py), on CPU.

A checkpoint is written by the project's learner engine at one learner shape (ranks, ZeRO stage)
after two updates, then resumed at another shape in two ways:

    reshard     LearnerEngine.load_checkpoint: it sees the other shape and reads every
                parameter's fp32 master and Adam moments from the shards where they lie
                (learner/reshard.py), with nothing written before
    universal   ``python -m deepspeed.checkpoint.ds_to_universal`` converts the tag into one file
                per parameter and state (a second copy on disk), then the engine loads it with
                DeepSpeed's ``checkpoint.load_universal``

Each resume is checked against the state at the save: every trained parameter's fp32 master and
both Adam moments, gathered with ``deepspeed.utils.safe_get_full_*`` on the saving and on the
loading engine, element for element, and Adam's step count; and timed (the conversion, the
load). A way that fails says how.

    python tests/benchmarks/compare_reshard.py [--hidden 64] [--layers 2] [--out results.json]

Writes a JSON list, one entry per (scenario, way), and prints a table. Gloo process groups on
this machine (one process per rank); nothing outside the repository but the packages.
"""
from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Optional

import torch
import torch.multiprocessing as mp

VOCAB, LENGTH, ROWS = 97, 12, 4
KEYS = ("fp32", "exp_avg", "exp_avg_sq")
# (name, saved at: ranks, ZeRO stage, LoRA; resumed at: ranks, ZeRO stage)
SCENARIOS = [
    ("2 ranks ZeRO-2 -> 1 rank ZeRO-2", (2, 2, False), (1, 2)),
    ("2 ranks ZeRO-2 -> 1 rank ZeRO-3", (2, 2, False), (1, 3)),
    ("1 rank ZeRO-3 -> 2 ranks ZeRO-3", (1, 3, False), (2, 3)),
    ("2 ranks ZeRO-3 -> 2 ranks ZeRO-2", (2, 3, False), (2, 2)),
    ("2 ranks ZeRO-2 LoRA -> 1 rank ZeRO-2 LoRA", (2, 2, True), (1, 2)),
    ("2 ranks ZeRO-2 LoRA -> 1 rank ZeRO-3 LoRA", (2, 2, True), (1, 3)),
]


def learner_config(ranks: int, stage: int, lora: bool) -> Any:
    from stabledrl.common.config.learner import DeepSpeedConfig, LearnerConfig, LoraConfig, OptimizerConfig

    return LearnerConfig(
        num_ranks=ranks,
        optimizer=OptimizerConfig(lr=1e-2, betas=(0.9, 0.99), eps=1e-3, weight_decay=0.1, grad_clip=1.0),
        deepspeed=DeepSpeedConfig(zero_stage=stage, dtype="fp32", param_persistence_threshold=0),
        lora=LoraConfig(rank=4, alpha=8) if lora else None,
    )


def token_loss(model: Any, mb: dict) -> tuple[torch.Tensor, dict]:
    logits = model(mb["input_ids"]).logits
    nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), mb["targets"].flatten(), reduction="sum")
    return nll / mb["denominator"], {}


def micro_batches(step: int, rank: int, ranks: int) -> list[dict]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    mb = {"input_ids": torch.randint(3, VOCAB, (ROWS, LENGTH), generator=g),
          "targets": torch.randint(3, VOCAB, (ROWS, LENGTH), generator=g)}
    return [{**mb, "denominator": float(ROWS * LENGTH * ranks)}]


def full_state(engine: Any) -> dict[str, dict[str, torch.Tensor]]:
    """Every trained parameter's fp32 master and Adam moments, whole (collective under ZeRO)."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    out = {}
    for name, p in engine.engine.module.named_parameters():
        if p.requires_grad:
            out[name] = {"fp32": safe_get_full_fp32_param(p).clone(),
                         "exp_avg": safe_get_full_optimizer_state(p, "exp_avg").clone(),
                         "exp_avg_sq": safe_get_full_optimizer_state(p, "exp_avg_sq").clone()}
    return out


def adam_steps(engine: Any) -> list[float]:
    return sorted({float(s["step"]) for s in engine.engine.optimizer.optimizer.state.values() if "step" in s})


def build(rank: int, ranks: int, port: int, stage: int, lora: bool, shape: dict) -> Any:
    from stabledrl.common.models.presets import build_tiny_policy
    from stabledrl.learner.engine import LearnerEngine
    from stabledrl.learner.group import init_learner_group

    torch.set_num_threads(1)
    init_learner_group("127.0.0.1", port, rank, ranks, backend="gloo", timeout_s=300)
    return LearnerEngine(build_tiny_policy("llada", vocab_size=VOCAB, seed=0, **shape),
                         learner_config(ranks, stage, lora))


def save_rank(rank: int, ranks: int, port: int, stage: int, lora: bool, shape: dict, directory: str) -> None:
    from stabledrl.common.trust.checkpoint_files import FORMAT
    from stabledrl.coordinator.runtime.checkpoint import write_state

    engine = build(rank, ranks, port, stage, lora, shape)
    for step in (1, 2):
        engine.train_step(micro_batches(step, rank, ranks), token_loss)
    engine.save_checkpoint(directory, {"step": 2}, tag="step2")
    state = full_state(engine)
    if rank == 0:
        write_state(Path(directory) / "step2", {"format": FORMAT, "step": 2, "config": {}, "parameter_shapes": {}})
        torch.save({"state": state, "adam_steps": adam_steps(engine)}, Path(directory) / "saved_state.pt")


def load_rank(rank: int, ranks: int, port: int, stage: int, lora: bool, shape: dict, directory: str, way: str,
              result: str) -> None:
    import torch.distributed as dist

    engine = build(rank, ranks, port, stage, lora, shape)
    dist.barrier()
    t0 = time.perf_counter()
    error = ""
    try:
        if way == "reshard":
            engine.load_checkpoint(directory, tag="step2")
        else:
            engine.engine._config.load_universal_checkpoint = True  # DeepSpeed's checkpoint.load_universal
            path, _ = engine.engine.load_checkpoint(directory, tag="step2", load_optimizer_states=True,
                                                    load_lr_scheduler_states=False, load_module_strict=not lora)
            if path is None:
                raise FileNotFoundError(f"no universal checkpoint under {directory}")
    except Exception as e:  # noqa: BLE001 - what fails is the finding
        error = describe(e)
    seconds = time.perf_counter() - t0
    flags = torch.tensor([1.0 if error else 0.0])
    dist.all_reduce(flags)
    if flags.item():  # a rank failed: the others cannot gather
        if error:
            torch.save({"rank": rank, "error": error, "load_s": seconds}, f"{result}.rank{rank}")
        return
    state, steps = full_state(engine), adam_steps(engine)
    times = [torch.tensor([seconds]) for _ in range(ranks)]
    dist.all_gather(times, torch.tensor([seconds]))
    if rank == 0:
        torch.save({"state": state, "adam_steps": steps, "load_s": max(t.item() for t in times)}, result)


def describe(e: BaseException) -> str:
    """The error in one line, with the line of code that raised it (an assert says nothing else)."""
    where = traceback.extract_tb(e.__traceback__)[-1]
    text = str(e).splitlines()[0][:200] if str(e) else ""
    return f"{type(e).__name__}{': ' + text if text else ''} at {Path(where.filename).name}:{where.lineno} " \
           f"`{(where.line or '').strip()[:160]}`"


def run_ranks(target: Any, ranks: int, *args: Any) -> None:
    with socket.socket() as probe:  # free now: the spawned rank 0 binds it (a port held here could not be)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.spawn(target, args=(ranks, port, *args), nprocs=ranks, join=True)


def compare(saved: dict, loaded: dict) -> dict[str, Any]:
    """Exactness of ``loaded`` against ``saved``: every parameter and state bit for bit, and the largest difference."""
    a, b = saved["state"], loaded["state"]
    if a.keys() != b.keys():
        return {"exact": False, "why": f"parameters differ: {sorted(a.keys() ^ b.keys())[:3]}"}
    diff = max(float((a[n][k] - b[n][k]).abs().max()) if a[n][k].numel() else 0.0 for n in a for k in KEYS)
    equal = all(torch.equal(a[n][k], b[n][k]) for n in a for k in KEYS)
    return {"exact": equal and saved["adam_steps"] == loaded["adam_steps"], "max_abs_diff": diff,
            "adam_steps": loaded["adam_steps"], "parameters": len(a)}


def convert(tag_dir: Path, out_dir: Path) -> tuple[float, int, str]:
    """(seconds, bytes written, error) of DeepSpeed's conversion to a universal checkpoint."""
    t0 = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                          str(tag_dir), "--output_folder", str(out_dir / "step2"), "--num_extract_workers", "1",
                          "--num_merge_workers", "1", "--inject_missing_state"],
                         capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if run.returncode:
        last = [line for line in (run.stderr or run.stdout).splitlines() if line.strip()][-1:]
        return seconds, 0, f"ds_to_universal exit {run.returncode}: {last[0][:300] if last else ''}"
    return seconds, sum(p.stat().st_size for p in out_dir.rglob("*") if p.is_file()), ""


def scenario(name: str, saved_at: tuple, resumed_at: tuple, shape: dict, work: Path) -> list[dict[str, Any]]:
    (ranks, stage, lora), (ranks2, stage2) = saved_at, resumed_at
    directory = work / "ckpt"
    run_ranks(save_rank, ranks, stage, lora, shape, str(directory))
    saved = torch.load(directory / "saved_state.pt", weights_only=False)
    tag_bytes = sum(p.stat().st_size for p in (directory / "step2").iterdir() if p.is_file())
    out = []
    for way in ("reshard", "universal"):
        row: dict[str, Any] = {"scenario": name, "way": way, "checkpoint_bytes": tag_bytes}
        source = directory
        if way == "universal":
            universal = work / "universal"
            row["convert_s"], row["converted_bytes"], error = convert(directory / "step2", universal)
            if error:
                out.append({**row, "error": error})
                continue
            source = universal
        result = work / f"{way}.pt"
        try:
            run_ranks(load_rank, ranks2, stage2, lora, shape, str(source), way, str(result))
        except Exception as e:  # noqa: BLE001 - a rank that died: the last line of its traceback
            lines = [line for line in str(e).splitlines() if line.strip()]
            out.append({**row, "error": f"a rank died: {lines[-1][:300] if lines else type(e).__name__}"})
            continue
        failures = sorted(work.glob(f"{way}.pt.rank*"))
        if failures:
            out.append({**row, **{k: v for k, v in torch.load(failures[0]).items() if k != "rank"}})
            continue
        loaded = torch.load(result, weights_only=False)
        out.append({**row, "load_s": loaded["load_s"], **compare(saved, loaded)})
    return out


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=64, help="hidden size of the tiny LLaDA (its MLP: twice that)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--only", default=None, help="run the scenarios whose name contains this")
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    a = ap.parse_args(argv)
    shape = {"hidden_size": a.hidden, "intermediate_size": 2 * a.hidden, "num_hidden_layers": a.layers,
             "num_attention_heads": 4, "num_key_value_heads": 4}
    rows: list[dict[str, Any]] = []
    for name, saved_at, resumed_at in SCENARIOS:
        if a.only and a.only not in name:
            continue
        with tempfile.TemporaryDirectory(prefix="compare-reshard-") as work:
            try:
                rows += scenario(name, saved_at, resumed_at, shape, Path(work))
            except Exception:  # noqa: BLE001 - the save itself failed: say so and go on
                rows.append({"scenario": name, "way": "save", "error": traceback.format_exc().splitlines()[-1]})
        for row in rows[-2:]:
            print(json.dumps(row), flush=True)
    if a.out:
        a.out.write_text(json.dumps({"shape": shape, "rows": rows}, indent=1) + "\n")
    print(f"\n{'scenario':44} {'way':9} {'exact':5} {'convert s':>9} {'load s':>7}  note")
    for r in rows:
        note = r.get("error", "") or f"max |diff| {r.get('max_abs_diff', 0):.3g}, {r.get('parameters')} parameters"
        print(f"{r['scenario']:44} {r['way']:9} {str(r.get('exact', '-')):5} {r.get('convert_s', 0):9.2f} "
              f"{r.get('load_s', float('nan')):7.2f}  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
