"""`stabledrl eval --protocol d1`: the papers' table for a policy, over every GPU of the cluster.

    stabledrl eval --config deploy/configs/recipe_stabledrl_llada8b_gsm8k.yaml --protocol d1   # the base model
    stabledrl eval --config runs/x/config.yaml --protocol d1 --checkpoint runs/x --out runs/x/d1
    stabledrl eval --config X --protocol d1 --model runs/x/final_model --benchmarks gsm8k,math500 --lengths 256

The policy is the config's model, ``--model`` (a model directory) or ``--checkpoint`` (a job's
DeepSpeed checkpoint: verified and consolidated once, here, through ``stabledrl.evaluation.offline``,
and written to OUT/policy for the workers, or for a LoRA job its adapters to OUT/policy_adapter:
on several nodes OUT must be a shared directory); ``--adapter`` puts a PEFT LoRA folder onto the
base (``--model``, else the config's model), held unmerged by every worker. One
``EvalWorker`` actor per GPU holds a copy (with RAY_ADDRESS set: the GPUs of that cluster; else a
local Ray instance); on a machine without GPUs, ``--workers`` CPU actors (default
rollout.num_workers). The protocol settings are ``eval.protocol`` of the config (default: d1 with
its four benchmarks and three lengths); the flags narrow them. Results go to OUT/results.jsonl as
they are graded; rerunning the command continues where it stopped, and prints the same table.
"""
from __future__ import annotations

import functools
import json
import logging
import os
from pathlib import Path
from typing import Any, Optional

from stabledrl.common.config.base import ConfigError, validate
from stabledrl.common.config.job import JobConfig
from stabledrl.common.config.protocol import ProtocolConfig
from stabledrl.evaluation.offline import describe, load_eval_policy, resolve_checkpoint
from stabledrl.common.models import export_hf
from stabledrl.common.models.adapter_folder import load_with_adapter, policy_adapters, write_adapter_folder
from stabledrl.coordinator.runtime.actors import wait
from stabledrl.rollout.eval_worker import EvalWorker
from stabledrl.common.models.loading import check_model_files, load_model_tokenizer
from stabledrl.evaluation.protocol import evaluate, pending_units, prepare, table_of
from stabledrl.evaluation.results import ResultLog, write_table

log = logging.getLogger(__name__)


def protocol_config(cfg: JobConfig, name: str, *, benchmarks: Optional[list[str]] = None,
                    lengths: Optional[list[int]] = None, num_prompts: Optional[int] = None,
                    math_graders: Optional[list[str]] = None, generation: Optional[str] = None) -> ProtocolConfig:
    """``eval.protocol`` of the job config (or the protocol's defaults), narrowed by the flags."""
    base = cfg.eval.protocol if cfg.eval.protocol is not None and cfg.eval.protocol.name == name else None
    data = (base or ProtocolConfig(name=name)).model_dump()
    chosen = data["benchmarks"]
    if benchmarks:
        chosen = {b: chosen.get(b, {}) for b in benchmarks}
    if num_prompts is not None:
        chosen = {b: {**v, "num_prompts": num_prompts} for b, v in chosen.items()}
    data["benchmarks"] = chosen
    if lengths:
        data["gen_lengths"] = lengths
    if math_graders is not None:
        data["math_graders"] = math_graders
    if generation is not None:
        data["generation"] = generation
    return validate(ProtocolConfig, data, source="--protocol settings")


def policy_model(cfg: JobConfig, out_dir: Path, *, model_dir: Optional[str], checkpoint: Optional[str],
                 adapter: Optional[str] = None) -> tuple[Any, str, Optional[Path]]:
    """(model section the workers load, description for the results, PEFT adapter folder the workers
    hold unmerged or None): the config's model or a model directory (with ``adapter``), or a
    checkpoint consolidated to ``out_dir/policy`` (a LoRA job's adapters to ``out_dir/policy_adapter``)."""
    if checkpoint is None:
        model = cfg.model if model_dir is None else \
            cfg.model.model_copy(update={"path": Path(model_dir).resolve(), "preset": None, "preset_shape": None})
        folder = None if adapter is None else Path(adapter).resolve()
        return model, describe(cfg, model.path if model_dir else None, None, folder), folder

    directory, tag = resolve_checkpoint(checkpoint)
    described = f"checkpoint {directory.resolve() / tag}"
    lora = cfg.learner.lora is not None
    target = out_dir / ("policy_adapter" if lora else "policy")
    marker = target / "stabledrl_source.json"
    if not (marker.is_file() and json.loads(marker.read_text()).get("source") == described):
        log.info(f"stabledrl eval: verifying and consolidating {directory / tag} (once; the workers read {target})")
        policy, tokenizer = load_eval_policy(cfg, checkpoint=checkpoint, device="cpu")
        if lora:
            write_adapter_folder(policy_adapters(policy), target, family=policy.spec.name, released=False)
        else:
            export_hf(policy, tokenizer, target)
        marker.write_text(json.dumps({"source": described}) + "\n")
        del policy
    if lora:
        return cfg.model, described, target.resolve()
    model = cfg.model.model_copy(update={"path": target.resolve(), "preset": None, "preset_shape": None})
    return model, described, None


def start_workers(cfg: JobConfig, model: Any, workers: Optional[int], loader: Any = None) -> list[Any]:
    """One EvalWorker actor per GPU of the cluster (or ``workers`` of them), each ready."""
    import ray

    res = cfg.cluster.rollout
    gpus = float(ray.cluster_resources().get("GPU", 0))
    per_gpu = res.num_gpus if res.num_gpus > 0 else 1.0
    count = workers or (int(gpus // per_gpu) if gpus else cfg.rollout.num_workers)
    if count < 1:
        raise ConfigError(f"--workers: the cluster offers {gpus:g} GPUs, fewer than one worker needs ({per_gpu:g})")
    cpus = float(ray.cluster_resources().get("CPU", 1))
    options = {"num_cpus": min(res.num_cpus, cpus / count), "num_gpus": per_gpu if gpus else 0.0}
    actor = ray.remote(EvalWorker)
    handles = [actor.options(**options).remote(i, model, loader) for i in range(count)]
    info = wait([h.ready.remote() for h in handles], cfg.cluster.start_timeout_s,
                [f"eval worker {i} (loading the policy)" for i in range(count)])
    log.info(f"stabledrl eval: {count} workers ready ({', '.join(sorted({i['device'] for i in info}))}; "
             f"load {max(i['load_s'] for i in info):.0f} s)")
    return handles


def protocol_command(cfg: JobConfig, protocol: ProtocolConfig, *, model_dir: Optional[str] = None,
                     checkpoint: Optional[str] = None, adapter: Optional[str] = None, out: Optional[str] = None,
                     workers: Optional[int] = None, loader: Any = None) -> dict[str, Any]:
    """Evaluate, print the table, write OUT/table.md and table.json; returns the table."""
    import ray

    named = Path(str(model_dir or checkpoint or cfg.model.path or cfg.model.preset).rstrip("/")).name
    out_dir = Path(out) if out else Path("runs") / "eval" / f"{protocol.name}-{named}"
    model, described, folder = policy_model(cfg, out_dir, model_dir=model_dir, checkpoint=checkpoint,
                                            adapter=adapter)
    if folder is not None:  # every worker holds the adapters unmerged on its base

        loader = functools.partial(load_with_adapter, adapter=str(folder))
    check_model_files(model)  # before any worker starts: refused here, not in each worker after its restarts
    tokenizer = load_model_tokenizer(model)
    prepared = prepare(protocol, tokenizer)
    results = ResultLog.open(out_dir, prepared.header(described))
    sizes = ", ".join(f"{b.benchmark.title} {len(b.rows)}" for b in prepared.benchmarks.values())
    log.info(f"stabledrl eval: protocol {protocol.name} on {described}: {sizes} prompts x lengths "
             f"{protocol.gen_lengths}; graded as d1 grades (MATH: MATH's is_equiv)"
             + (f", MATH500 also by {', '.join(protocol.math_graders)}" if protocol.math_graders else "")
             + f"; generation {protocol.generation}; results in {out_dir}")
    results.check_prompts(prepared.prompt_hashes())
    if pending_units(prepared, results.done()):
        started = _init_ray(cfg)
        try:
            evaluate(start_workers(cfg, model, workers, loader), prepared, results, cfg.rollout.request_timeout_s)
        finally:
            if started:
                ray.shutdown()
    else:
        log.info(f"stabledrl eval: every completion is already graded in {out_dir}")
    table = table_of(prepared, results)
    print(write_table(out_dir, table), end="")
    return table


def _init_ray(cfg: JobConfig) -> bool:
    """Join RAY_ADDRESS's cluster or start a local instance, unless Ray is up; True if started here."""
    import ray

    if ray.is_initialized():
        return False
    if os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=True)
    else:
        ray.init(address="local", num_cpus=cfg.cluster.local_num_cpus, include_dashboard=False, log_to_driver=True,
                 logging_level=logging.WARNING)
    return True
