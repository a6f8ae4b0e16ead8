"""`stabledrl train --dry-run`: the resolved config, what the run needs that is not here yet, and
what the run will do, without starting Ray or reading the model's weights or the data.

The output is the resolved config as YAML, then comment lines (``#``), so that the whole of it still
reads as YAML:

- inputs: the model (a preset, a local directory, or a hub id found or not in the local Hugging Face
  cache), the task's data and every evaluation benchmark's data; each one missing is named with the
  command that fetches it. Nothing is downloaded and nothing missing fails the dry run: the run
  itself refuses a missing model before any actor starts;
- plan: the GPUs and actors it starts, steps × optimizer updates, samples and generated tokens per
  step and in all, what it evaluates and when, and where it writes;
- departures: for a published recipe (the ``recipe`` section), the release it reproduces and each
  way this config still departs from it, one line each.

The sampler's layout against the policy's block size is checked when the model's config.json is
at hand (as ``train`` checks it); a layout that cannot work exits 2 like any bad config.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, TextIO

import yaml

from stabledrl.common.config.base import ConfigError
from stabledrl.common.config.job import JobConfig, check_resources
from stabledrl.common.models.job_check import check_sampler_layout
from stabledrl.common.models.families import CheckpointError
from stabledrl.common.models.model_dir import hub_cache_dir, resolve_model_dir
from stabledrl.common.tasks.protocols import PROTOCOLS
from stabledrl.common.tasks import build_task
from stabledrl.common.transport.plan import PushInputs, plan_push


@dataclass(frozen=True)
class Input:
    """One thing the run reads before it trains."""

    what: str  # e.g. "model", "task data", "eval gsm8k"
    name: str  # the model path / dataset / file
    present: bool
    note: str  # where it was found, or how to get it


def dry_run(cfg: JobConfig, out: Optional[TextIO] = None, err: Optional[TextIO] = None) -> int:
    """Print the resolved config, the inputs and the plan; 0, or 2 for a sampler layout the model refuses."""
    out, err = out or sys.stdout, err or sys.stderr
    print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), end="", file=out)
    inputs = [model_input(cfg), *data_inputs(cfg)]
    if inputs[0].present:
        try:
            check_sampler_layout(cfg)
        except ConfigError as e:
            print(f"stabledrl: {e}", file=err)
            return 2
    for line in report_lines(cfg, inputs):
        print(f"# {line}".rstrip(), file=out)
    return 0


def report_lines(cfg: JobConfig, inputs: list[Input]) -> list[str]:
    missing = [i for i in inputs if not i.present]
    lines = ["", "inputs:"]
    lines += [f"  {i.what}: {i.name}: {'found' if i.present else 'MISSING'}, {i.note}" for i in inputs]
    if missing:
        lines.append(f"{len(missing)} missing: fetch {'it' if len(missing) == 1 else 'them'} as shown before "
                     "`stabledrl train` (the job never downloads the model; a missing dataset it reads from the hub "
                     "only where the hub is reachable)")
    lines += ["", "plan:"] + [f"  {line}" for line in plan_lines(cfg)]
    return lines + departure_lines(cfg)


def departure_lines(cfg: JobConfig) -> list[str]:
    """A recipe's release and its remaining departures from it, one line each (none for other configs)."""
    if cfg.recipe is None:
        return []
    lines = ["", f"departures from the release ({cfg.recipe.release}): {len(cfg.recipe.departures)}"]
    return lines + [f"  - {line}" for line in cfg.recipe.departures]


# ---- inputs ------------------------------------------------------------------------------------
def model_input(cfg: JobConfig) -> Input:
    m = cfg.model
    if m.preset is not None:
        return Input("model", f"preset {m.preset}", True, "built in (random weights), nothing to fetch")
    try:
        where = resolve_model_dir(m.path, m.revision)
    except CheckpointError as e:
        return Input("model", str(m.path), False, _fetch_hint(str(e)))
    return Input("model", str(m.path), True, f"at {where}")


def data_inputs(cfg: JobConfig) -> list[Input]:
    found = [source_input("task data", cfg.task.source)]
    if getattr(cfg.task, "held_out_source", None) is not None:
        found.append(source_input("held-out data", cfg.task.held_out_source))
    protocol = cfg.eval.protocol
    if protocol is not None:
        spec = PROTOCOLS[protocol.name]
        for name, bench in protocol.benchmarks.items():
            default = spec.benchmarks[name]
            source = bench.source if bench.source is not None else default.source
            found.append(source_input(f"eval {name}", source, fetch=default.fetch if bench.source is None else ""))
    return found


def source_input(what: str, source: Any, fetch: str = "") -> Input:
    """Whether a data source (a config section or a task.source mapping) is readable here."""
    src = source if isinstance(source, dict) else source.model_dump()
    kind = src.get("kind", "file")
    if kind == "generated":
        return Input(what, "generated rows", True, "made from the seed, nothing to fetch")
    if kind == "file":
        path = Path(str(src["path"])).expanduser()
        if path.is_file():
            return Input(what, str(path), True, f"{path.stat().st_size:,} bytes")
        how = f"fetch: {fetch}" if fetch else "write or copy the file there (a path relative to the working directory)"
        return Input(what, str(path), False, f"no such file; {how}")
    dataset, config, split = str(src["dataset"]), src.get("config"), src.get("split", "train")
    label = dataset + (f" ({config})" if config else "") + f" [{split}]"
    if Path(dataset).expanduser().is_dir():
        return Input(what, label, True, "a save_to_disk directory")
    cached = hub_dataset_cached(dataset)
    if cached is not None:
        return Input(what, label, True, f"in the local cache {cached}")
    args = ", ".join(repr(a) for a in (dataset, config) if a is not None)
    return Input(what, label, False, "not in the local Hugging Face caches; the job reads it from the hub if it can "
                 f"reach it, offline fetch it first: python -c \"import datasets; datasets.load_dataset({args})\"")


def hub_dataset_cached(dataset: str) -> Optional[Path]:
    """The cache directory holding hub dataset ``dataset`` (the hub's download cache or the datasets
    library's prepared cache), or None. Reads directory names only."""
    org_name = dataset.split("/")
    candidates = [hub_cache_dir() / ("datasets--" + "--".join(org_name))]
    try:
        import datasets

        candidates.append(Path(datasets.config.HF_DATASETS_CACHE) / "___".join(org_name))
    except ImportError:  # pragma: no cover - datasets is a dependency
        pass
    for path in candidates:
        if path.is_dir() and any(path.iterdir()):
            return path
    return None


def _fetch_hint(message: str) -> str:
    """The fetch command of a missing-model message (model_dir.resolve_model_dir ends it with one)."""
    if ": hf download" in message or ": huggingface-cli download" in message:
        return "fetch: " + message.rsplit(": ", 1)[-1]
    return message


# ---- plan --------------------------------------------------------------------------------------
WEIGHT_PATHS = {"nccl": "an NCCL broadcast from the learner to the workers",
                "gloo": "a gloo broadcast from the learner to the workers",
                "object_store": "Ray's object store (learner rank 0 puts, every worker fetches)",
                "ipc": "each learner rank's GPU buffer, mapped by the worker on the same GPU (CUDA IPC)",
                "peer": ("each worker's read of the learner ranks' GPU memory with its copy engines (CUDA IPC, one "
                         "host)")}


def weights_line(cfg: JobConfig) -> str:
    """The weight push the driver will set up, from the plan it sets up (``plan_push``); where
    ``auto`` builds each push group by where its members run, both transports."""
    inputs = PushInputs.of(cfg)
    spread, near = plan_push(inputs), plan_push(inputs, one_host=True)
    how = "" if cfg.weights.backend != "auto" else " (weights.backend auto)"
    if near.backend != spread.backend:
        return (f"weights: pushed through {WEIGHT_PATHS[near.backend]} while every learner rank and rollout "
                f"worker runs on one host, else through {WEIGHT_PATHS[spread.backend]}{how}")
    if spread.views:
        return ("weights: read in place: each rollout worker's parameters are views of its learner rank's, on the GPU "
                f"they share (CUDA IPC; one copy of the weights a GPU, weights.ipc view){how}")
    return f"weights: pushed through {WEIGHT_PATHS[spread.backend]}{how}"


def push_plan_line(cfg: JobConfig) -> str:
    """The rest of the plan: which learner ranks send, whether the workers stage, what of a LoRA
    learner travels, and the bytes' dtype."""
    plan = plan_push(PushInputs.of(cfg))
    if plan.views:
        sent = "nothing is sent: every push checks the version the workers read"
    elif plan.sources > 1:
        sent = f"learner ranks 0..{plan.sources - 1} each send their own ZeRO-3 partitions"
    elif plan.sources == 1:
        sent = "learner rank 0 sends its parameters as they lie"
    elif plan.backend == "ipc":
        sent = "every learner rank copies what it sends, whole, into a buffer the worker on its device maps"
    else:
        sent = "learner rank 0 sends the full parameters (gathered first under ZeRO-3)"
    carried = {"none": "every parameter", "adapters": "the LoRA adapters A and B, held unmerged by the workers",
               "merged": "the adapted matrices, merged"}[plan.lora]
    staged = ("staged beside generation (weights.staging)" if plan.staged else
              "received between requests" if not plan.views else "")
    dtype = "the learner's dtype" if plan.transport.dtype == "keep" else plan.transport.dtype
    return "push plan: " + "; ".join(part for part in (sent, f"carries {carried}", f"on the wire in {dtype}", staged)
                                     if part)


def plan_lines(cfg: JobConfig) -> list[str]:
    a, r, learner, cluster, run = cfg.algorithm, cfg.rollout, cfg.learner, cfg.cluster, cfg.run
    gpus = learner.num_ranks * cluster.learner.num_gpus + r.num_workers * cluster.rollout.num_gpus
    if cluster.colocate:  # each worker on its learner rank's GPU
        gpus = learner.num_ranks * cluster.learner.num_gpus
    cpus = learner.num_ranks * cluster.learner.num_cpus + r.num_workers * cluster.rollout.num_cpus
    lora = learner.lora
    trains = (f"LoRA r {lora.rank} on {', '.join(lora.resolved_targets())}" if lora is not None
              else "every parameter")
    if lora is not None and lora.push == "merged":  # rollouts sample the merged weights, rounded
        trains += "; pushed merged into the weights' dtype: the rollout policy is the learner's rounded"
    samples = a.groups_per_step * a.group_size
    canvas = samples * cfg.sampler.gen_length
    updates = run.steps * a.inner_iterations
    per_rank = -(-a.groups_per_step // learner.num_ranks)
    lines = [
        (f"GPUs: {gpus:g} ({learner.num_ranks} learner ranks × {cluster.learner.num_gpus:g}, each shared with a "
         f"rollout worker: cluster.colocate), CPUs: {cpus:g}; Ray placement {cluster.learner_strategy}"
         if cluster.colocate else
         f"GPUs: {gpus:g} ({learner.num_ranks} learner ranks × {cluster.learner.num_gpus:g} + {r.num_workers} rollout "
         f"workers × {cluster.rollout.num_gpus:g}), CPUs: {cpus:g}; Ray placement {cluster.learner_strategy} / "
         f"{cluster.rollout_strategy}"),
        f"actors: {learner.num_ranks} learner ranks (DeepSpeed ZeRO-{learner.deepspeed.zero_stage}, "
        f"{learner.deepspeed.dtype}, training {trains}) + {r.num_workers} rollout workers, driven by this process",
        f"steps: {run.steps} × {a.inner_iterations} optimizer updates = {updates:,} updates "
        f"(loss {cfg.loss.name}, estimator {cfg.estimator.name}, "
        f"lr {learner.optimizer.lr:g} {learner.optimizer.schedule}"
        f", normalised per {'micro-batch' if learner.loss_normalisation == 'micro_batch' else 'step'})",
        f"samples per step: {a.groups_per_step} prompts × {a.group_size} completions = {samples:,} "
        f"(about {per_rank} groups per learner rank, micro-batches of {a.micro_batch_size}); "
        f"{run.steps * a.groups_per_step:,} prompts in all",
        f"tokens generated: at most {canvas:,} per step ({samples:,} × gen_length {cfg.sampler.gen_length}, "
        f"{cfg.sampler.steps or cfg.sampler.gen_length} denoising steps each; rows stop at EOS"
        f"{'' if cfg.sampler.stop_at_eos else ' only with stop_at_eos'}), {canvas * run.steps:,} over the run",
        f"staleness: η = {a.max_staleness} ({'synchronous' if a.max_staleness == 0 else 'asynchronous'})",
        weights_line(cfg),
        push_plan_line(cfg),
        elastic_line(cfg),
    ]
    return lines[:1] + resource_lines(cfg) + lines[1:] + task_lines(cfg) + eval_lines(cfg) + output_lines(cfg)


def elastic_line(cfg: JobConfig) -> str:
    """How far the rollout fleet may change size while the job runs, and by what."""
    r, name = cfg.rollout, cfg.run.job_name
    if r.min_workers == r.num_workers == r.worker_limit:
        return (f"rollout workers: {r.num_workers}, fixed (rollout.min_workers / max_workers widen what "
                f"`stabledrl scale --job {name}` may ask)")
    grow = "; autoscale: a worker starts whenever the cluster has room for one" if r.autoscale else ""
    return (f"rollout workers: {r.num_workers}, elastic {r.min_workers}..{r.worker_limit} "
            f"(`stabledrl scale --job {name} --workers N`){grow}")


def task_lines(cfg: JobConfig) -> list[str]:
    """What the model reads and what rewards it: the prompt template (an instruction a task adds is
    shown here, never added silently) and the reward's terms."""
    task, reward = build_task(cfg.task), cfg.task.reward  # builds no reward code: user functions load lazily
    if task.template == "{prompt}":
        prompt = "prompts: the data's prompt as it is, nothing added (task.template '{prompt}')"
    else:
        prompt = f"prompts: task.template {task.template!r} ('{{prompt}}': the data's prompt)"
    if task.system_prompt:
        prompt += f", system prompt {task.system_prompt!r}"
    if reward.custom:
        weights = reward.custom_weights or [1.0] * len(reward.custom_specs)
        terms = " + ".join(f"{w:g} × {spec}" if w != 1 else spec for w, spec in zip(weights, reward.custom_specs))
        checker = f"custom ({terms}; docs/rewards.md)"
    else:
        checker = f"the {task.name} checker"
    line = f"reward: {reward.correctness_weight:g} × {checker}"
    line += f" + {reward.format_weight:g} × format" if reward.format_weight else ""
    line += f" + {reward.anti_short_weight:g} × anti_short" if reward.anti_short_weight else ""
    if len(reward.custom_specs) > 1:
        line += f"; logged as {', '.join(f'rollout/reward/{n}' for n in reward.custom_names)}"
    return [prompt, line]


def resource_lines(cfg: JobConfig) -> list[str]:
    """What a real start says of the resources the job asks for: where it would start its own Ray
    instance, checked against this machine as ``train`` checks them (a refusal becomes a warning
    line: the plan may be meant for another machine); on a cluster, when the job starts."""
    if os.environ.get("RAY_ADDRESS"):
        return [f"resources: checked against the cluster at {os.environ['RAY_ADDRESS']} when the job starts"]
    offered = {"CPU": float(cfg.cluster.local_num_cpus or os.cpu_count() or 1), "GPU": float(_gpus())}
    try:
        check_resources(cfg, offered, where="this machine (the local Ray instance `stabledrl train` starts here)")
    except ConfigError as e:
        return [f"WARNING: `stabledrl train` on this machine stops before any actor starts: {e}"]
    return []


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def eval_lines(cfg: JobConfig) -> list[str]:
    e, run = cfg.eval, cfg.run
    points = [s for s in range(e.every, run.steps, e.every)] if e.every else []
    when = "before training, after training" + (f" and every {e.every} steps ({len(points)} times)" if points else "")
    held = getattr(cfg.task, "held_out", 0) or getattr(cfg.task, "held_out_source", None) is not None
    lines = []
    if held:
        judged = (f"; correct: reward >= task.correct_at = {cfg.task.correct_at:g}" if cfg.task.name == "generic"
                  else "")
        lines.append(f"eval: {when}: {e.num_prompts} held-out prompts × {e.samples_per_prompt} samples, "
                     f"{e.describe(cfg.sampler)}{judged}")
    else:
        lines.append("eval: no held-out set (task.held_out 0, no task.held_out_source): no held-out evaluation")
    p = e.protocol
    if p is not None:
        spec = PROTOCOLS[p.name].benchmarks
        sizes = {n: b.num_prompts or spec[n].num_prompts for n, b in p.benchmarks.items()}
        benches = ", ".join(f"{n} ({f'{k} prompts' if k else 'all rows'})" for n, k in sizes.items())
        lines.append(f"protocol {p.name}: {when}: {benches} at gen_length {', '.join(map(str, p.gen_lengths))}, "
                     f"{'greedy' if p.temperature == 0 else f'T = {p.temperature:g}'}")
    return lines


def output_lines(cfg: JobConfig) -> list[str]:
    run = cfg.run
    out = Path(run.output_dir)
    when = ([f"every {run.checkpoint_every} steps"] if run.checkpoint_every else []) + (
        ["after the last step"] if run.save_final_checkpoint else [])
    ckpt = " and ".join(when) or "none"
    lines = [f"writes: {out}/ (config.yaml, metrics.jsonl{', TensorBoard events' if run.tensorboard else ''}); "
             f"checkpoints {ckpt} in {out / 'checkpoints'}"]
    if run.export_final:
        lines.append(f"final policy: {out / 'final_model'} (in its family's released format: the family's own code "
                     "loads it, and so does model.path)")
        if cfg.learner.lora is not None:
            lines.append(f"LoRA adapters: {out / 'final_adapter'} (a PEFT adapter folder for model.path; the final "
                         "policy holds them merged)")
    return lines
