"""`stabledrl eval`: held-out accuracy of a trained policy, outside a training job.

    stabledrl eval --config deploy/configs/quickstart.yaml --model runs/quickstart/final_model --k 4 eval.temperature=1
    stabledrl eval --config deploy/configs/quickstart.yaml --checkpoint runs/quickstart/checkpoints
    stabledrl eval --config runs/lora/config.yaml --adapter runs/lora/final_adapter   # onto the config's model

The policy is loaded in this process (CUDA when available). The rows are the config's held-out
rows (the first ``--num-prompts``, default eval.num_prompts), sampled with the run's sampler
section (at eval.temperature when it is set) and scored by ``stabledrl.rollout.evaluate.evaluate`` with
per-sample seeds from eval.seed: the
same function and seeds as the job's own evaluation, so the same weights give the same pass@1
that the job logged as eval/pass@1.

``--model`` takes a model directory (run.export_final writes one: output_dir/final_model;
safetensors, nothing executed); the job's exports (final_model, a LoRA run's final_adapter) also
hold its sealed config (``stabledrl_config.yaml``), which ``--model`` / ``--adapter`` read when
no ``--config`` is given. ``--checkpoint`` takes a DeepSpeed checkpoint the job wrote
(output_dir/checkpoints, a tag under it, or the run's output_dir): the architecture and tokenizer
come from the config's model section and the weights from DeepSpeed's ZeRO-2/3 consolidation. The
tag is checked as a resume checks it (``stabledrl.common.trust.checkpoint_files.verify_tag``: its manifest, every
file's size, no pickle naming anything beyond tensors and DeepSpeed's classes) and DeepSpeed reads
it under torch's restricted unpickler: a tampered file is refused, naming it, before it can run.

LoRA: a LoRA job's checkpoint holds only its adapters; they go onto the config's model, held
unmerged (common/models/lora.py) and rounded from the fp32 masters to the learner's dtype, which
is the policy the job's learner and rollout workers computed (the merged export rounds W + s·B·A
to the weights' dtype). ``--adapter`` puts a PEFT adapter folder onto the base (``--model``, else
the config's model) the same way: a LoRA run's output_dir/final_adapter, or any PEFT LoRA folder
of the base (d1's checkpoints, written on LLaDA's own code, too).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

import torch

from stabledrl.common.config.base import ConfigError
from stabledrl.common.trust.checkpoint_files import CheckpointError, read_latest, restricted_unpickling, verify_tag
from stabledrl.common.trust.seal import EXPORT_CONFIG
from stabledrl.common.config.job import JobConfig
from stabledrl.common.models import load_policy
from stabledrl.common.models.adapter_folder import Adapters, hold, read_adapter_folder
from stabledrl.learner.lora import ADAPTER
from stabledrl.learner.zero import resolve_dtype
from stabledrl.common.sandbox.scorer import RewardFailureRate, RewardScorer
from stabledrl.common.tasks import load_task_data
from stabledrl.rollout.engine import TorchRolloutEngine
from stabledrl.rollout.evaluate import evaluate


def describe(cfg: JobConfig, model_dir: Optional[str | Path], checkpoint: Optional[str | Path],
             adapter: Optional[str | Path]) -> str:
    """The evaluated policy in words: ``model DIR``, ``checkpoint DIR``, ``adapter DIR on model DIR``."""
    if checkpoint is not None:
        return f"checkpoint {checkpoint}"
    base = model_dir or (cfg.model.path if cfg.model.preset is None else f"preset {cfg.model.preset}")
    return f"model {base}" if adapter is None else f"adapter {adapter} on model {base}"


def carried_config(*exports: str) -> str:
    """The job config an export carries (``--adapter`` / ``--model EXPORT`` without --config): the
    first of ``exports`` that holds one."""
    if not exports:
        raise ConfigError("eval: --config is required (except with --regrade-d1, or with --model / --adapter EXPORT: "
                          "what the job exported carries its config)")
    for export in exports:
        if (Path(export) / EXPORT_CONFIG).is_file():
            return str(Path(export) / EXPORT_CONFIG)
    raise ConfigError(f"eval: {' and '.join(exports)} carr{'y' if len(exports) > 1 else 'ies'} no {EXPORT_CONFIG} (not "
                      "an export of this project, or one by an older version): pass --config, the job config it was "
                      "trained with")


def resolve_checkpoint(path: str | Path) -> tuple[Path, str]:
    """(directory holding ``latest``, tag) for a run's output_dir, its checkpoints/ or one tag."""
    path = Path(path)
    for directory, tag in ((path / "checkpoints", None), (path, None), (path.parent, path.name)):
        latest = directory / "latest"
        if tag is not None and (directory / tag).is_dir() and latest.is_file():
            return directory, tag
        if tag is None and latest.is_file():
            return directory, read_latest(directory)
    raise CheckpointError(f"--checkpoint {path}: no DeepSpeed checkpoint (a directory with a 'latest' file, "
                            "a tag under one, or a run's output_dir holding checkpoints/)")


def checkpoint_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The fp32 weights of a learner checkpoint, consolidated over ZeRO shards, by parameter name.
    The tag is verified first, as a resume verifies it (``stabledrl.common.trust.checkpoint_files.verify_tag``): every
    checkpoint an evaluation reads, the protocol's too, comes through here."""
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    directory, tag = resolve_checkpoint(path)
    verify_tag(directory / tag)
    with restricted_unpickling():
        return get_fp32_state_dict_from_zero_checkpoint(str(directory), tag=tag)


def load_eval_policy(cfg: JobConfig, *, model_dir: Optional[str | Path] = None,
                     checkpoint: Optional[str | Path] = None, adapter: Optional[str | Path] = None,
                     device: Optional[str] = None) -> tuple[Any, Any]:
    """(policy, tokenizer) from an exported directory, from a checkpoint of ``cfg``'s model, or
    from a PEFT adapter folder onto a base (``model_dir``, else ``cfg``'s model)."""
    if checkpoint is not None and (model_dir is not None or adapter is not None):
        raise ValueError("a checkpoint holds its own weights (and a LoRA job's its adapters): no model_dir or adapter")
    if model_dir is None and checkpoint is None and adapter is None:
        raise ValueError("give model_dir, checkpoint or adapter")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if checkpoint is None:
        model = cfg.model if model_dir is None else \
            cfg.model.model_copy(update={"path": Path(model_dir), "preset": None, "preset_shape": None})
        policy, tokenizer = load_policy(model)
        if adapter is not None:
            hold(policy, read_adapter_folder(adapter, policy.spec.name))
        return policy.to(device), tokenizer
    policy, tokenizer = load_policy(cfg.model)  # the architecture and tokenizer; weights come next
    state = checkpoint_weights(checkpoint)
    if cfg.learner.lora is not None:
        return hold(policy, checkpoint_adapters(cfg, state, checkpoint)).to(device), tokenizer
    names = dict(policy.named_parameters())
    missing, unknown = sorted(set(names) - set(state)), sorted(set(state) - set(names))
    if missing or unknown:
        raise CheckpointError(f"--checkpoint {checkpoint} does not fit the config's model: {len(missing)} parameters "
                         f"missing (e.g. {missing[:2]}), {len(unknown)} unknown (e.g. {unknown[:2]})")
    with torch.no_grad():
        for name, param in names.items():
            if param.shape != state[name].shape:
                raise CheckpointError(f"--checkpoint {checkpoint}: {name} has shape {tuple(state[name].shape)}, "
                                 f"the config's model {tuple(param.shape)}")
            param.copy_(state[name])
    return policy.to(device), tokenizer


def checkpoint_adapters(cfg: JobConfig, state: dict[str, torch.Tensor], checkpoint: str | Path) -> Any:
    """A LoRA job's adapters from its consolidated checkpoint (peft's names: ``model.<module>.lora_A.
    default.weight``, fp32 masters), rounded to the dtype its learner computed in (learner.deepspeed.dtype;
    auto: bf16 where the learner ran on GPUs), by module path in the transformers model."""
    lora = cfg.learner.lora
    trained = resolve_dtype(cfg.learner.deepspeed.dtype,
                            torch.device("cuda" if cfg.cluster.learner.num_gpus > 0 else "cpu"))
    suffixes = {f".lora_A.{ADAPTER}.weight": 0, f".lora_B.{ADAPTER}.weight": 1}
    halves: dict[str, list[Any]] = {}
    for name, tensor in state.items():
        suffix = next((s for s in suffixes if name.endswith(s)), None)
        if suffix is None or not name.startswith("model."):
            raise CheckpointError(f"--checkpoint {checkpoint}: {name!r} is no LoRA adapter, yet the config trains "
                                  "LoRA (learner.lora): is this the config the checkpoint was written with?")
        halves.setdefault(name[len("model."):-len(suffix)], [None, None])[suffixes[suffix]] = tensor.to(trained)
    if not halves or any(t is None for pair in halves.values() for t in pair):
        raise CheckpointError(f"--checkpoint {checkpoint}: no complete LoRA adapters (A and B of each module)")
    return Adapters(lora.rank, lora.alpha, {path: (a, b) for path, (a, b) in halves.items()})


def evaluate_policy(cfg: JobConfig, policy: Any, tokenizer: Any, *, k: int = 1, num_prompts: Optional[int] = None,
                    samples_per_prompt: Optional[int] = None) -> Any:
    """pass@1 and pass@k on the config's held-out rows (EvalResult); n = max(k, samples_per_prompt
    or eval.samples_per_prompt) samples per prompt. RewardFailureRate once the reward failed too
    often (task.reward.max_failed_fraction), as a job stops."""
    for name, value in (("num_prompts", num_prompts), ("samples_per_prompt", samples_per_prompt), ("k", k)):
        if value is not None and value < 1:  # a negative count would slice from the end
            raise ConfigError(f"{name} must be at least 1, got {value}")
    data = load_task_data(cfg.task, tokenizer=tokenizer)
    rows = data.held_out[: num_prompts or cfg.eval.num_prompts]
    if not rows:
        raise ValueError("the config's task has no held-out rows (set task.held_out or task.held_out_source)")
    n = max(k, samples_per_prompt or cfg.eval.samples_per_prompt)
    inline = cfg.task.reward.resolved_isolation == "inline"
    with RewardScorer(cfg.task, data.task) if inline else RewardScorer(cfg.task) as scorer:  # the job's sandbox
        result = evaluate(TorchRolloutEngine(policy), rows, data.task, tokenizer, cfg.eval.sampler_for(cfg.sampler), n,
                          cfg.eval.seed, ks=sorted({1, k}), eos_token_id=policy.eos_token_id, scorer=scorer,
                          failure_check=cfg.task)
    if result.stopped:  # the reward failed too often: no accuracy to report
        raise RewardFailureRate(result.stopped)
    return result


def eval_command(cfg: JobConfig, *, model_dir: Optional[str] = None, checkpoint: Optional[str] = None,
                 adapter: Optional[str] = None, k: int = 1, num_prompts: Optional[int] = None,
                 samples_per_prompt: Optional[int] = None, out: Optional[str] = None, show: int = 0) -> dict[str, Any]:
    """Load, evaluate, print one line per pass@k (and ``show`` example completions); write JSON to ``out``."""
    policy, tokenizer = load_eval_policy(cfg, model_dir=model_dir, checkpoint=checkpoint, adapter=adapter)
    result = evaluate_policy(
        cfg, policy, tokenizer, k=k, num_prompts=num_prompts, samples_per_prompt=samples_per_prompt
    )
    source = describe(cfg, model_dir, checkpoint, adapter)
    print(f"stabledrl eval: {source}, {result.num_prompts} held-out prompts x {result.samples_per_prompt} samples "
          f"({result.time_s:.1f} s)")
    for key, value in sorted(result.pass_at.items()):
        print(f"  pass@{key}: {100 * value:.2f}%")
    print(f"  mean correctness: {100 * result.mean_correctness:.2f}%")
    for texts in result.completions[:show]:
        print(f"  e.g. {texts[:4]}")
    record = {"source": source, "num_prompts": result.num_prompts, "samples_per_prompt": result.samples_per_prompt,
              **{f"pass@{key}": v for key, v in result.pass_at.items()}, "mean_correctness": result.mean_correctness,
              "scoring_failures": result.scoring_failures, "time_s": result.time_s}
    if out:
        Path(out).write_text(json.dumps(record, indent=2) + "\n")
    return record
