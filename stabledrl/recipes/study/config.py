"""The study config: one job shared by every run, the methods that differ, the seeds.

    job:      {...}                  # a complete job config (deploy/configs/*.yaml), minus run.seed
    methods:                         # each: sections merged into the job (nested keys replace)
      grpo:      {loss: {name: grpo, clip_eps: 0.2, kl_beta: 0.0}}
      stabledrl: {loss: {name: stabledrl}}
    seeds: [0, 1, 2]
    concurrency: 1                   # runs at once, each on its own warm actors
    collapse: {ema: 0.9, fraction: 0.5, min_peak: 0.1, hold: 10}

Every run's JobConfig (job + method + seed) is validated when the study config is, so a bad
method fails by its dotted field before Ray or the warm start. The warm start runs once, with
``warmstart_seed``, and every run starts from that one model.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

from pydantic import Field, field_validator, model_validator

from stabledrl.common.config.base import ConfigError, StrictModel, apply_overrides, load_yaml, validate
from stabledrl.common.config.job import JobConfig


class CollapseRule(StrictModel):
    """When a run has collapsed (``stabledrl.recipes.study.analysis.find_collapse``).

    With e_t the EMA of the batch reward (e_1 = r_1, e_t = ema·e_{t−1} + (1 − ema)·r_t) and
    p = max_t e_t its peak: the run collapsed at step t* when p >= min_peak and e_t < fraction·p for
    every t >= t* up to the last step, and that stretch lasts at least ``hold`` steps. A dip that
    recovers, a run that never learned (peak below min_peak) and a fall in the last few steps are
    not collapses."""

    ema: float = Field(0.9, ge=0.0, lt=1.0, description="EMA weight of the past (0.9: about 10 steps)")
    fraction: float = Field(0.5, gt=0.0, lt=1.0, description="collapsed below this fraction of the EMA's peak")
    min_peak: float = Field(0.1, ge=0.0, description="a peak below this is no learning, hence no collapse")
    hold: int = Field(10, ge=1, description="the EMA stays below the threshold for at least this many last steps")


class ReportTarget(StrictModel):
    """Where the study also publishes its table and figure (a committed markdown file)."""

    markdown: Path = Field(Path("docs/study.md"), description="file holding a <!-- study:NAME --> section")
    section: str = Field(
        description="NAME of the section replaced between <!-- study:NAME --> and <!-- /study:NAME -->"
    )
    figure: Path = Field(description="where the figure is copied (a path the markdown links to)")


class StudyConfig(StrictModel):
    job: dict[str, Any] = Field(description="the job every run shares (a full job config; run.seed is the study's)")
    methods: dict[str, dict[str, Any]] = Field(description="method name -> config sections merged into job")
    seeds: list[int] = Field(description="each method runs once per seed")
    warmstart_seed: int = Field(0, description="seed of the one warm start every run starts from")
    concurrency: int = Field(1, ge=1, description="runs at once, each with its own rollout worker and learner")
    output_dir: Path = Field(
        Path("runs/study"), description="METHOD/seedN/metrics.jsonl, table.md, results.json, figure.png"
    )
    deadline_s: Optional[float] = Field(
        None,
        gt=0,
        description="start no run after this many seconds from the start; unfinished runs are reported as such",
    )
    collapse: CollapseRule = Field(default_factory=CollapseRule)
    report: Optional[ReportTarget] = Field(None, description="also write the table and figure into a markdown file")

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, seeds: list[int]) -> list[int]:
        if not seeds or len(set(seeds)) != len(seeds):
            raise ValueError(f"give at least one seed, each once (got {seeds})")
        return seeds

    @field_validator("methods")
    @classmethod
    def _method_names(cls, methods: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        bad = [m for m in methods if not m or "/" in m or m.startswith(".")]
        if not methods or bad:
            raise ValueError(f"give at least one method; names become directories (bad: {bad})")
        return methods

    @model_validator(mode="after")
    def _every_run_validates(self) -> "StudyConfig":
        for method in self.methods:
            run_config(self, method, self.seeds[0])  # raises ConfigError naming methods.M.<field>
        return self

    @property
    def runs(self) -> list[tuple[str, int]]:
        """(method, seed) in seed-major order: any prefix of finished runs covers the methods evenly."""
        return [(m, s) for s in self.seeds for m in self.methods]


def merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``update`` merged in: nested mappings merge, anything else replaces. A
    mapping that carries ``name`` (a loss, an estimator, a task) replaces the whole section when
    the name changes, so another method's fields never leak into it."""
    out = dict(base)
    for key, value in update.items():
        old = out.get(key)
        same_kind = (
            isinstance(old, dict) and isinstance(value, dict) and old.get("name") == value.get("name", old.get("name"))
        )
        out[key] = merge(old, value) if same_kind else value
    return out


def run_config(study: StudyConfig, method: str, seed: int, *, model_path: Optional[Path] = None) -> JobConfig:
    """The JobConfig of one run: job + methods[method], run.seed = seed, its own output directory
    and Ray job name, no checkpoint or export (a study keeps metrics only); with ``model_path`` the run starts from
    that directory (the shared warm start) instead of warm-starting itself."""
    data = merge(study.job, study.methods[method])
    run = dict(data.get("run", {}))
    run.update(
        seed=seed,
        output_dir=str(study.output_dir / method / f"seed{seed}"),
        progress=False,
        save_final_checkpoint=False,
        export_final=False,
        resume_from=None,
        name=re.sub(r"[^A-Za-z0-9._-]", "-", f"{study.output_dir.name}-{method}-seed{seed}"),
    )  # unique on the cluster
    data["run"] = run
    if model_path is not None:
        data["model"] = {**{k: v for k, v in data["model"].items() if k not in ("preset", "preset_shape", "path")},
                         "path": str(model_path)}
        data.pop("warmstart", None)
    try:
        return validate(JobConfig, data, source=f"study run {method}/seed{seed}")
    except ConfigError as e:
        raise ValueError(f"methods.{method} (merged into job): {e}") from None


def warmstart_config(study: StudyConfig) -> JobConfig:
    """The job as the shared warm start sees it (the first method; run.seed = warmstart_seed)."""
    return run_config(study, next(iter(study.methods)), study.warmstart_seed)


def load_study_config(path: str | Path, overrides: list[str] = ()) -> StudyConfig:
    """YAML + dotted overrides (``job.run.steps=5``, ``seeds=[0]``) -> a validated StudyConfig."""
    data = apply_overrides(load_yaml(path), list(overrides))
    return validate(StudyConfig, data, source=f"study config {path}")
