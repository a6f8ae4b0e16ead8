"""The Python API: what `stabledrl train` and `stabledrl eval` do, callable from a notebook.

    cfg = load_config("deploy/configs/quickstart.yaml", ["run.steps=20"])
    run_dir = train(cfg, overwrite=True)
    evaluate(cfg, model=run_dir / "final_model", k=4)   # {"pass@1": ..., "pass@4": ..., ...}

``train`` checks what the command checks before any actor starts (the config, the sampler against
the model, the reward in its sandbox, the output directory), joins the Ray instance this process
already has (or the cluster RAY_ADDRESS names, or starts a local one and stops it at the end), and
runs the job to its end. Errors are raised, not turned into exit codes.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from stabledrl.common.config.job import JobConfig, check_installed, load_job_config
from stabledrl.common.job_log import log_shown, show_log
from stabledrl.common.sandbox.scorer import check_reward
from stabledrl.common.trust.run_dir import check_eval_trust, check_output_dir
from stabledrl.common.trust.run_lock import release
from stabledrl.common.trust.seal import check_key, check_run_config
from stabledrl.coordinator.runtime.watchdog import watch_descendants


def load_config(path: str | os.PathLike, overrides: Sequence[str] = ()) -> JobConfig:
    """A job config from a YAML file and dotted ``key.path=value`` overrides, validated
    (``ConfigError`` names every bad field)."""
    return load_job_config(str(path), list(overrides))


def train(config: JobConfig | str | os.PathLike, overrides: Sequence[str] = (), *, overwrite: bool = False) -> Path:
    """Run a training job to its end; returns its output directory (metrics.jsonl, checkpoints,
    final_model). ``config`` is a JobConfig or a YAML path (then ``overrides`` apply). The job's
    lines go to the ``stabledrl`` loggers; unless this process has set up logging, they are shown
    on stdout as `stabledrl train` shows them (common/job_log.py)."""
    # torch and Ray load when a job runs, not on `import stabledrl`
    import ray

    from stabledrl.common.models.job_check import check_sampler_layout
    from stabledrl.coordinator.driver import Driver
    from stabledrl.recipes.stages import JOB_STAGES

    check_key(create=True)
    cfg = config if isinstance(config, JobConfig) else load_config(config, overrides)
    if not isinstance(config, JobConfig):  # a run's config.yaml is used only as the run wrote it
        check_run_config(Path(config))
    check_sampler_layout(cfg)
    check_installed(cfg)
    check_reward(cfg.task)
    check_output_dir(cfg.run.output_dir, resuming=False, overwrite=overwrite)
    undo = show_log() if not log_shown() else (lambda: None)
    try:
        started = not ray.is_initialized()
        if started:
            start_ray(cfg)
        try:
            Driver(cfg, stages=JOB_STAGES).run()
        finally:
            if started:
                ray.shutdown()
    finally:
        release(cfg.run.output_dir)  # check_output_dir took run.output_dir's lock for the job
        undo()
    return Path(cfg.run.output_dir)


def evaluate(config: JobConfig | str | os.PathLike | None = None, *, model: Optional[str | os.PathLike] = None,
             checkpoint: Optional[str | os.PathLike] = None, adapter: Optional[str | os.PathLike] = None, k: int = 1,
             num_prompts: Optional[int] = None) -> dict[str, Any]:
    """pass@1 and pass@k of a trained policy (an exported ``model`` directory, a run's ``checkpoint``,
    or a PEFT ``adapter`` folder onto ``model``, else the config's model) on the config's held-out
    rows, as `stabledrl eval` prints them. ``config`` None: the config an export (``adapter`` or
    ``model``) carries. A run's config (and an export's) is checked as `stabledrl eval` checks it
    (common/trust/seal.py)."""
    from stabledrl.evaluation.offline import carried_config, evaluate_policy, load_eval_policy  # torch

    check_key(create=False)
    if config is None:
        config = carried_config(*(str(d) for d in (adapter, model) if d is not None))
    cfg = config if isinstance(config, JobConfig) else load_config(config)
    if not isinstance(config, JobConfig):
        where = None if checkpoint is None else str(checkpoint)
        check_eval_trust(Path(config), where, None, cfg.model_dump(mode="json"), trust_run=False, allow_weaker=False)
    policy, tokenizer = load_eval_policy(cfg, model_dir=model, checkpoint=checkpoint, adapter=adapter)
    result = evaluate_policy(cfg, policy, tokenizer, k=k, num_prompts=num_prompts)
    return {"num_prompts": result.num_prompts, "samples_per_prompt": result.samples_per_prompt,
            **{f"pass@{key}": value for key, value in result.pass_at.items()},
            "mean_correctness": result.mean_correctness, "scoring_failures": result.scoring_failures}


def start_ray(cfg: JobConfig) -> str:
    """Join the cluster RAY_ADDRESS names (``ray job submit`` sets it), or start a local Ray
    instance that ends with this process; returns where the job runs."""
    import ray
    import transformers

    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    transformers.logging.disable_progress_bar()  # per-file bars of model writes and loads
    if os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=True)
        return f"cluster at {os.environ['RAY_ADDRESS']}"
    ray.init(address="local", num_cpus=cfg.cluster.local_num_cpus, include_dashboard=False, log_to_driver=True,
             logging_level=logging.WARNING)
    watch_descendants()  # this instance and every process of the job end with this process, however it ends
    return "a local Ray instance"
