"""Runs the StableDRL release's own training loop (``train.py`` -> ``training/training_loop_spg_snis.py``,
FSDP through accelerate, generation and training on the same GPUs one after the other) at its own
GSM8K config, with timing hooks, on a random checkpoint in LLaDA's released layout.

The release's code is not part of this project: ``--peer-root`` is a checkout of it (fetched by
whoever runs the benchmark). Nothing of its training math is changed; the harness only

- writes a copy of ``configs/gsm8k_math_spg_snis.yaml`` with the model and tokenizer paths, the run
  directory, ``total_steps`` (a fixed, short run) and the data loader replaced (below);
- replaces the dataset download: GSM8K-like rows from ``--data`` (JSONL prompt/answer, the
  system benchmark's generated rows) through the release's own collate function, reward and
  infinite sampler (its ``datasets`` and ``math_verify`` imports are stubbed: the reward compares
  the extracted answer as a string);
- records timing events (peer_events.py) around the release's sampler (``generate_spg``), its scoring
  (``generate_and_score_completions_spg`` less the sampler) and every optimizer step (global optimizer
  step hooks, settled before and after), with the allocator's peak, and counts every forward of its
  model (``LLaDASVPO.forward``: rows, T, its phase) for the roofline;
- ``--device cpu`` passes that device to the loop (the CPU rehearsal; the release defaults to cuda);
- wandb is made unimportable (the release then skips it, as it does when wandb is missing).

    accelerate launch --config_file PEER/configs/accelerate/fsdp.yaml --num_processes 2 \\
        tests/benchmarks/peers/peer_stabledrl.py --peer-root PEER --model-dir CKPT --data rows.jsonl \\
        --steps 4 --events DIR --work DIR
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import peer_events  # noqa: E402


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer-root", required=True, help="a checkout of the StableDRL release")
    ap.add_argument(
        "--model-dir", required=True, help="random LLaDA checkpoint (released layout; its path names llada)"
    )
    ap.add_argument("--data", required=True, help="JSONL rows with prompt and answer")
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps (the release's total_steps + 1)")
    ap.add_argument("--events", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--set", action="append", default=[], help="config override section.key=value (yaml value)")
    return ap.parse_args()


ROWS: list[dict] = []


def gsm8k_like_loader(batch_size: int = 1, num_workers: int = 0, **_):
    """The release's data loader contract, (iterable loader, reward): generated rows through the
    release's own collate function and reward; each rank takes every world-th row, endlessly (the
    release's InfiniteSampler does the same, but its constructor no longer runs on torch >= 2.6)."""
    import itertools

    import torch
    from torch_utils import distributed as dist

    before = sys.modules.get("datasets", ...)
    stub_modules()
    try:
        from dataloaders import math as release_data
    finally:  # the stub only serves this import (transformers probes for the real package)
        if before is ...:
            del sys.modules["datasets"]
        else:
            sys.modules["datasets"] = before

    items = [{"problem": r["prompt"], "answer": r["answer"], "source": "gsm8k", "use_boxed": True} for r in ROWS]
    rank, world = dist.get_rank(), dist.get_world_size()
    sampler = (i % len(items) for i in itertools.count(rank, world))
    loader = torch.utils.data.DataLoader(items, collate_fn=release_data.collate_fn_mixed, batch_size=batch_size,
                                         sampler=sampler, num_workers=0)
    return loader, release_data.reward_mixed


def stub_modules() -> None:
    datasets = types.ModuleType("datasets")
    for name in ("load_dataset", "concatenate_datasets", "interleave_datasets"):
        setattr(datasets, name, lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no dataset download here")))
    sys.modules["datasets"] = datasets
    mv = types.ModuleType("math_verify")
    mv.parse = lambda s, *a, **k: str(s).split("boxed{")[-1].split("}")[0].strip()
    mv.verify = lambda gold, pred, *a, **k: gold == pred
    sys.modules["math_verify"] = mv


def datasets_or_absent() -> None:
    """Mark ``datasets`` absent where the one on the path does not import (the release's pinned one on a
    machine without its own dependencies): accelerate's data loader imports any it finds."""
    try:
        import datasets  # noqa: F401
    except ImportError:
        sys.modules["datasets"] = None  # find_spec answers None: transformers and accelerate skip it


def main() -> None:
    a = parse()
    datasets_or_absent()
    sys.modules.setdefault("peer_stabledrl", sys.modules[__name__])  # the config names the loader by module
    import torch
    import yaml

    root = Path(a.peer_root).resolve()
    sys.path.insert(0, str(root))
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    rec = peer_events.Recorder(a.events, rank)
    sys.modules["wandb"] = None  # import fails: the release runs without it
    ROWS.extend(json.loads(line) for line in Path(a.data).read_text().splitlines() if line.strip())
    device = torch.device(a.device)

    # the directory's name holds "llada", which the release's tokenizer set-up keys on
    model_dir = peer_events.checkpoint_view(Path(a.model_dir), work / "llada-model", rank)
    cfg = yaml.safe_load((root / "configs" / "gsm8k_math_spg_snis.yaml").read_text())
    cfg["network_kwargs"]["pretrained_model_name_or_path"] = str(model_dir)
    cfg["tokenizer_kwargs"]["pretrained_model_name_or_path"] = str(model_dir)
    cfg["data_loader_kwargs"] = {"class_name": "peer_stabledrl.gsm8k_like_loader",
                                 "batch_size": cfg["data_loader_kwargs"].get("batch_size", 1)}
    cfg["training_args"]["total_steps"] = a.steps - 1  # the loop runs total_steps + 1 optimizer steps
    cfg["training_args"]["run_dir"] = str(work / "runs")
    for item in a.set:
        key, value = item.split("=", 1)
        section, field = key.split(".", 1)
        cfg[section][field] = yaml.safe_load(value)
    config = work / "peer_config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    rec.write(event="config", config=cfg, world=int(os.environ.get("WORLD_SIZE", "1")))

    import networks.llada_svpo as svpo
    import training.training_loop_spg_snis as loop

    release_generate = svpo.generate_spg

    def timed_generate(model, prompt, *args, **kwargs):
        peer_events.sync(device)
        t0 = time.time()
        rec.generating = True
        try:
            out = release_generate(model, prompt, *args, **kwargs)
            peer_events.sync(device)
        finally:
            rec.generating = False
        gen_length = kwargs.get("gen_length", args[1] if len(args) > 1 else 128)
        rec.generated(t0, time.time(), int(prompt.shape[0]), int(prompt.shape[0]) * int(gen_length))
        return out

    svpo.generate_spg = timed_generate  # generate_and_score_completions_spg calls it by module name
    release_score = loop.generate_and_score_completions_spg

    def timed_score(*args, **kwargs):
        """The release's generation, rewards and old-policy scoring: what is not generation is scoring."""
        peer_events.sync(device)
        t0, gen_before = time.time(), rec.generate_s
        out = release_score(*args, **kwargs)
        peer_events.sync(device)
        rec.scored(time.time() - t0 - (rec.generate_s - gen_before))
        return out

    loop.generate_and_score_completions_spg = timed_score  # the loop calls it by its own module's name
    release_forward = svpo.LLaDASVPO.forward

    def counted_forward(self, *args, **kwargs):
        rec.forward(args[0] if args else kwargs["input_ids"])
        return release_forward(self, *args, **kwargs)

    svpo.LLaDASVPO.forward = counted_forward  # every forward of the release's model, in any phase
    release_loop = loop.training_loop

    def loop_on_device(*args, **kwargs):
        kwargs["device"] = device
        return release_loop(*args, **kwargs)

    loop.training_loop = loop_on_device

    rec.record_optimizer_steps(device)

    os.chdir(root)  # the release resolves its modules from its own root
    import train as release_train

    try:
        release_train.main.main(["--config", str(config)], standalone_mode=False)
    finally:
        rec.write(event="end", t=time.time())


if __name__ == "__main__":
    main()
