"""Runs d1's diffu-GRPO (``diffu-grpo/diffu_grpo_train.py`` -> ``DiffuGRPOTrainer``, TRL's GRPOTrainer and
the HF Trainer, DeepSpeed ZeRO-2 through accelerate, generation and training on the same GPUs one after the
other) at its own GSM8K settings, with timing hooks, on a random checkpoint in LLaDA's released layout.

d1's code is not part of this project: ``--peer-root`` is a checkout of github dllm-reasoning/d1 (fetched by
whoever runs the benchmark). Its training script runs unchanged, from its own ``__main__`` (TrlParser over
its DiffuGRPOConfig and TRL's ModelConfig), with the arguments of its ``slurm_scripts/gsm_base.sbatch``
(``--num_iterations 12 --dataset gsm8k``) and a copy of its ``slurm_scripts/train.yaml`` (LoRA r 128,
alpha 64, dropout 0.05; 6 generations, per-device batch 6, 2 accumulation steps, lr 3e-6, beta 0.04,
epsilon 0.5, gen 256, block 32, 128 diffusion steps, random masking with p_mask_prompt 0.15) in which only
``model_path``, ``output_dir``, ``run_name``, ``max_steps`` (a fixed, short run), ``report_to: none``,
``mask_id`` (the checkpoint's; 126336 at LLaDA-8B's shape, as d1's default) and the ``--set`` overrides
(the CPU rehearsal's short generation) change. The harness only

- serves ``datasets.load_dataset("openai/gsm8k", "main")`` from ``--data`` (JSONL prompt/answer, the
  system benchmark's generated rows, whose answers end "#### N" as GSM8K's do) through a stub ``datasets``
  module (Dataset with map/shuffle/select/filter over a list of rows; TRL imports the types), so d1's own
  ``get_gsm8k_questions`` builds its prompts and its five GSM8K reward functions score them;
- stubs ``wandb`` (d1 imports it at module level; ``report_to: none``);
- drops the 4-bit quantization: d1 builds a bitsandbytes NF4 config unconditionally; bitsandbytes is not on
  the GPU machine and the project's recipe keeps the base in bf16, so ``BitsAndBytesConfig`` returns None
  here and the base loads in bf16;
- gives the checkpoint LLaDA's model code: ``modeling_llada.py`` and ``configuration_llada.py`` of the
  StableDRL release's ``networks/`` (``--model-code``), whose one changed line (the release imports its
  configuration as ``networks.configuration_llada``) is put back to the public file's relative import,
  and ``auto_map`` in config.json, as the released checkpoint has, for d1's ``trust_remote_code`` load
  (the CPU rehearsal's character tokenizer also gets a plain chat template: it has none);
- seeds d1's mask draws with the integer value of its 0-d seed tensors (``set_seed(int(seed))``): Python
  3.11 and later refuse a tensor in ``random.seed``, which d1's Python 3.10 accepted; torch, which draws
  the masks, took the same integer there;
- drops the HF Trainer's empty optimizer parameter group before the learning-rate scheduler is made:
  DeepSpeed (0.19 here) removes it from the optimizer afterwards, and current torch's schedulers then
  fail on the mismatch at the first step (torch 2.6, d1's, zipped the two without checking);
- records timing events (peer_events.py) around d1's ``DiffuGRPOTrainer.generate`` (each call: its rows,
  rows x max_completion_length tokens), its scoring without a gradient (``_get_per_token_logps``: the old
  policy's and the reference's log-probabilities) and every optimizer step (global optimizer step hooks:
  with gradient accumulation 2 an optimizer step is two micro-steps), with the allocator's peak, and
  counts every forward of its model (``get_logits``: rows, T, its phase) for the roofline.

With ``num_iterations`` 12 a round is one generation (per GPU: 2 accumulation steps x 6 rows, in calls of
``generation_batch_size`` 6) and 12 optimizer steps over the same rows; the rows count once.

    accelerate launch --config_file PEER/diffu-grpo/accelerate.yaml --num_processes 2 \\
        tests/benchmarks/peers/peer_d1.py --peer-root PEER --model-dir CKPT --data rows.jsonl \\
        --steps 24 --events DIR --work DIR
"""
from __future__ import annotations

import argparse
import importlib.machinery
import json
import os
import random
import runpy
import sys
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import peer_events  # noqa: E402


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer-root", required=True, help="a checkout of d1 (its diffu-grpo/ folder is run)")
    ap.add_argument("--model-dir", required=True, help="random LLaDA checkpoint (released layout)")
    ap.add_argument("--model-code", default=None,
                    help="folder with LLaDA's modeling_llada.py and configuration_llada.py "
                    "(default: PEER/../StableDRL/networks)")
    ap.add_argument("--data", required=True, help="JSONL rows with prompt and answer")
    ap.add_argument("--steps", type=int, default=24, help="optimizer steps (2 rounds of mu = 12)")
    ap.add_argument("--events", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--device", default="cuda", help="cpu: the rehearsal (one process, no DeepSpeed)")
    ap.add_argument("--set", action="append", default=[], help="train.yaml override key=value (yaml value)")
    return ap.parse_args()


# ---- the stub ``datasets`` module ---------------------------------------------------------------------
class Dataset(list):
    """The few ``datasets.Dataset`` methods d1's data code calls, over a list of row dicts."""

    @classmethod
    def from_list(cls, rows):
        return cls(dict(r) for r in rows)

    @property
    def column_names(self):
        return list(self[0]) if self else []

    def map(self, fn, *args, **kwargs):
        return Dataset({**row, **fn(row)} for row in self)  # new columns join the row's, as datasets' map

    def filter(self, fn, *args, **kwargs):
        return Dataset(row for row in self if fn(row))

    def shuffle(self, seed=None, **kwargs):
        rows = list(self)
        random.Random(seed).shuffle(rows)
        return Dataset(rows)

    def select(self, indices, **kwargs):
        return Dataset(self[i] for i in indices)


class IterableDataset:  # TRL checks isinstance against it; never constructed here
    pass


def stub_datasets(rows: list[dict]) -> None:
    mod = types.ModuleType("datasets")
    mod.__spec__ = importlib.machinery.ModuleSpec("datasets", None)
    mod.Dataset, mod.IterableDataset, mod.DatasetDict = Dataset, IterableDataset, dict
    mod.Value = lambda *a, **k: None

    def load_dataset(path, name=None, *args, split=None, **kwargs):
        if path != "openai/gsm8k":
            raise RuntimeError(f"no dataset download here ({path})")
        data = Dataset({"question": r["prompt"], "answer": r["answer"]} for r in rows)
        return data if split else {"train": data}

    mod.load_dataset = load_dataset
    mod.concatenate_datasets = lambda parts, **k: Dataset(r for p in parts for r in p)
    sys.modules["datasets"] = mod


def stub_wandb() -> None:
    mod = types.ModuleType("wandb")
    mod.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    mod.run = None
    sys.modules["wandb"] = mod
    os.environ["WANDB_DISABLED"] = "true"  # transformers and TRL then never look for it


# ---- the run ------------------------------------------------------------------------------------------
def main() -> None:
    a = parse()
    root = Path(a.peer_root).resolve() / "diffu-grpo"
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    rec = peer_events.Recorder(a.events, rank)
    rows = [json.loads(line) for line in Path(a.data).read_text().splitlines() if line.strip()]

    stub_wandb()
    stub_datasets(rows)
    import torch
    import transformers
    import yaml

    code = Path(a.model_code) if a.model_code else Path(a.peer_root).resolve().parent / "StableDRL" / "networks"
    model_dir = model_view(Path(a.model_dir), code, work / "llada-model", rank)
    mask_id = json.loads((model_dir / "config.json").read_text()).get("mask_token_id", 126336)

    cfg = yaml.safe_load((root / "slurm_scripts" / "train.yaml").read_text())
    cfg.update(model_path=str(model_dir), output_dir=str(work / "checkpoints"), run_name="peer_d1",
               max_steps=a.steps, report_to="none", mask_id=mask_id)
    for item in a.set:
        key, value = item.split("=", 1)
        cfg[key] = yaml.safe_load(value)
    config = work / "train.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rec.write(event="config", config=cfg, world=world, transformers=transformers.__version__)

    sys.path.insert(0, str(root))
    os.chdir(root)  # d1 runs from its diffu-grpo folder
    import diffu_grpo_trainer

    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if a.device == "cuda" else a.device)
    release_generate = diffu_grpo_trainer.DiffuGRPOTrainer.generate

    def timed_generate(self, model, prompt, *args, **kwargs):
        peer_events.sync(device)
        t0 = time.time()
        rec.generating = True
        try:
            out = release_generate(self, model, prompt, *args, **kwargs)
            peer_events.sync(device)
        finally:
            rec.generating = False
        rows_ = int(prompt.shape[0])
        rec.generated(t0, time.time(), rows_, rows_ * int(out.shape[1] - prompt.shape[1]))
        # its sampler calls the model itself: one full forward of the canvas per step, the steps split evenly
        # over the blocks (d1's generate: max(1, steps // blocks) a block; no classifier-free guidance here)
        named = dict(zip(("steps", "gen_length", "block_length"), args), **kwargs)
        steps, gen, block = (int(named.get(k, d)) for k, d in (("steps", 128), ("gen_length", 128),
                                                               ("block_length", 128)))
        rec.generating = True
        rec.forward((rows_, int(prompt.shape[1]) + gen), times=max(1, steps // (gen // block)) * (gen // block))
        rec.generating = False
        return out

    diffu_grpo_trainer.DiffuGRPOTrainer.generate = timed_generate
    release_logits, release_logps = (diffu_grpo_trainer.DiffuGRPOTrainer.get_logits,
                                     diffu_grpo_trainer.DiffuGRPOTrainer._get_per_token_logps)

    def counted_logits(self, model, batch, *args, **kwargs):  # every forward of d1's model
        rec.forward(batch)
        return release_logits(self, model, batch, *args, **kwargs)

    def timed_logps(self, *args, **kwargs):  # without a gradient: the old policy's and the reference's
        if torch.is_grad_enabled():
            return release_logps(self, *args, **kwargs)
        peer_events.sync(device)
        t0 = time.time()
        out = release_logps(self, *args, **kwargs)
        peer_events.sync(device)
        rec.scored(time.time() - t0)
        return out

    diffu_grpo_trainer.DiffuGRPOTrainer.get_logits = counted_logits
    diffu_grpo_trainer.DiffuGRPOTrainer._get_per_token_logps = timed_logps
    release_set_seed = diffu_grpo_trainer.set_seed
    # d1 seeds each mask draw with a 0-d tensor; Python >= 3.11's random.seed refuses one (d1's 3.10 hashed
    # it); torch and numpy take its integer value, as they did there
    diffu_grpo_trainer.set_seed = lambda seed, *args, **kwargs: release_set_seed(int(seed), *args, **kwargs)

    from transformers.trainer import Trainer

    release_create_optimizer = Trainer.create_optimizer

    def create_optimizer(self):
        # DeepSpeed drops the optimizer's empty parameter groups (the HF Trainer's no-decay group: LoRA
        # trains no bias or norm) after the scheduler has one learning rate per group; torch's schedulers
        # now zip the two strictly and stop at the first step. Dropping them here first leaves every
        # trained parameter's group and learning rate as they were
        optimizer = release_create_optimizer(self)
        optimizer.param_groups[:] = [g for g in optimizer.param_groups if g["params"]]
        return optimizer

    Trainer.create_optimizer = create_optimizer
    rec.record_optimizer_steps(device)
    # the base in bf16 (module docstring): d1's script builds the 4-bit config from this name (on the
    # module as it is now: an import above puts a new transformers module object in sys.modules)
    sys.modules["transformers"].BitsAndBytesConfig = lambda *args, **kwargs: None

    sys.argv = ["diffu_grpo_train.py", "--config", str(config), "--model_path", str(model_dir),
                "--num_iterations", str(cfg.get("num_iterations", 12)), "--dataset", "gsm8k",
                "--run_name", "peer_d1", "--output_dir", str(work / "checkpoints")]
    try:
        runpy.run_path(str(root / "diffu_grpo_train.py"), run_name="__main__")
    finally:
        rec.write(event="end", t=time.time())


PLAIN_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}assistant: {% endif %}")


def model_view(source: Path, code: Path, view: Path, rank: int) -> Path:
    """The checkpoint as d1 loads it (``AutoModel``, ``trust_remote_code``): peer_events.checkpoint_view
    with LLaDA's model code and ``auto_map`` in config.json (module docstring). The released tokenizer's
    chat template stays; the CPU rehearsal's character tokenizer has none, and d1 formats its prompts as
    one user turn: it gets ``PLAIN_TEMPLATE``."""

    def edit(name: str, config: dict) -> bool:
        if name == "tokenizer_config.json":
            config.setdefault("chat_template", PLAIN_TEMPLATE)
            return True
        if name == "config.json":
            config["auto_map"] = {"AutoConfig": "configuration_llada.LLaDAConfig",
                                  "AutoModel": "modeling_llada.LLaDAModelLM",
                                  "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM"}
            config.setdefault("architectures", ["LLaDAModelLM"])
            return True
        return False

    view = peer_events.checkpoint_view(source, view, rank, edit)
    (view / "configuration_llada.py").write_text((code / "configuration_llada.py").read_text())
    modeling = (code / "modeling_llada.py").read_text()
    (view / "modeling_llada.py").write_text(modeling.replace("from networks.configuration_llada import",
                                                             "from .configuration_llada import"))
    return view


if __name__ == "__main__":
    main()
