"""A study's report, from its files alone: table.md, results.json, figure.png, and optionally a
section of a committed markdown file (docs/study.md) with the table and a copy of the figure.

    write_report(study)                       # after (or during) run_study
    stabledrl study --report runs/study_gpu   # the same from a directory fetched from elsewhere

``study.json`` (the resolved study config, written when the study starts) makes a study
directory self-describing. A run is "finished" when its log reaches the configured step count.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Optional

from stabledrl.common.metrics import read_metrics
from stabledrl.recipes.study.analysis import (
    RunSummary, as_json, method_table, run_table, summarize_methods, summarize_run,
)
from stabledrl.recipes.study.config import StudyConfig, run_config
from stabledrl.recipes.plot import load_run, plot_runs

STUDY_FILE = "study.json"


def save_study_config(study: StudyConfig) -> Path:
    study.output_dir.mkdir(parents=True, exist_ok=True)
    path = study.output_dir / STUDY_FILE
    path.write_text(json.dumps(study.model_dump(mode="json"), indent=2) + "\n")
    return path


def load_study_file(path: str | Path) -> StudyConfig:
    """The StudyConfig saved by ``save_study_config``."""
    return StudyConfig.model_validate(json.loads(Path(path).read_text()))


def load_study_dir(directory: str | Path) -> StudyConfig:
    """The StudyConfig a study directory was written with, pointed at where the directory is now."""
    directory = Path(directory)
    file = directory / STUDY_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{directory} has no {STUDY_FILE}: not a study directory")
    data = json.loads(file.read_text())
    data["output_dir"] = str(directory)
    return StudyConfig.model_validate(data)


def collect(study: StudyConfig, statuses: Optional[dict[tuple[str, int], str]] = None) -> list[RunSummary]:
    """A RunSummary for every run that has a metrics.jsonl; ``statuses`` (method, seed) -> status
    of the runner, else a run is finished when its last training step is the configured one."""
    out = []
    for method, seed in study.runs:
        file = study.output_dir / method / f"seed{seed}" / "metrics.jsonl"
        if not file.is_file():
            continue
        records = read_metrics(file)
        steps = run_config(study, method, seed).run.steps
        trained = [int(r["step"]) for r in records if "rollout/reward_mean" in r]
        status = (statuses or {}).get((method, seed), "finished" if trained and max(trained) >= steps else "stopped")
        out.append(summarize_run(method, seed, records, study.collapse, status=status))
    return out


def recorded_statuses(study: StudyConfig) -> dict[tuple[str, int], str]:
    """(method, seed) -> status from the runner's outcomes.jsonl (empty when there is none); a run
    the file does not name (a study killed from outside) is judged by its steps in ``collect``."""
    path = study.output_dir / "outcomes.jsonl"
    out = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                o = json.loads(line)
                out[(o["method"], int(o["seed"]))] = o["status"]
    return out


def recorded_timing(study: StudyConfig) -> dict[str, float]:
    """The timing an earlier write_report stored in results.json (empty when there is none)."""
    path = study.output_dir / "results.json"
    try:
        return dict(json.loads(path.read_text()).get("timing") or {})
    except (OSError, ValueError):
        return {}


def _settings(study: StudyConfig, method: str) -> list[str]:
    cfg = run_config(study, method, study.seeds[0])
    est, a, opt = cfg.estimator, cfg.algorithm, cfg.learner.optimizer
    source = cfg.model.preset or Path(cfg.model.path or "").name
    return [f"model {source}, task {cfg.task.name}",
            f"estimator {est.name} ({getattr(est, 'num_draws', 1)} draw(s), {est.masks} masks)",
            f"G = {a.group_size}", f"{a.groups_per_step} groups/step", f"μ = {a.inner_iterations}",
            f"η = {a.max_staleness}", f"lr {opt.lr:g}, grad clip {opt.grad_clip:g}", f"{cfg.run.steps} steps"]


def settings_line(study: StudyConfig) -> str:
    """What every run shares, in one line (the regime the study runs in); a setting some method
    overrides reads "per method" (μ per method) instead of the first method's value."""
    per_method = [_settings(study, m) for m in study.methods]
    parts = [first if all(p[k] == first for p in per_method) else f"{first.split(' ')[0]} per method"
             for k, first in enumerate(per_method[0])]
    return "; ".join([parts[0], parts[1], ", ".join(parts[2:6]), parts[6], parts[7], f"seeds {study.seeds}"])


def write_report(study: StudyConfig, *, statuses: Optional[dict[tuple[str, int], str]] = None,
                 timing: Optional[dict[str, float]] = None, command: Optional[str] = None,
                 figure: bool = True) -> dict[str, Any]:
    """Write table.md, results.json and figure.png under ``study.output_dir`` (and the report
    section, when configured); returns what was written and the run summaries. Without
    ``statuses`` or ``timing`` (a report redrawn from a directory), the ones the study recorded
    there are used: outcomes.jsonl and the timing in an earlier results.json."""
    if statuses is None:
        statuses = recorded_statuses(study) or None
    if timing is None:
        timing = recorded_timing(study) or None
    runs = collect(study, statuses)
    methods = summarize_methods(runs, list(study.methods))
    out_dir = study.output_dir
    rule = study.collapse
    settings = settings_line(study)  # builds every method's run config: once per report
    text = [
        f"Settings: {settings}.\n\n",
        method_table(methods),
        f"\nCollapse: the reward EMA (weight {rule.ema}) falls below {rule.fraction:.0%} of its peak (peak >= "
        f"{rule.min_peak}) and stays there to the end, at least {rule.hold} steps. "
        "Accuracy in %, mean ± std over seeds; "
        "grad norm: the largest pre-clip norm of any update, and its ratio to the run's median.\n",
        "\n" + run_table(runs),
    ]
    missing = {f"{m}/seed{s}": st for (m, s), st in (statuses or {}).items() if st != "finished"}
    if missing:
        text.append("\nNot finished: " + ", ".join(f"{run} ({st})" for run, st in missing.items()) + "\n")
    if timing:
        text.append("\n" + ", ".join(f"{k} {v:.0f} s" for k, v in timing.items()) + "\n")
    (out_dir / "table.md").write_text("".join(text))
    written: dict[str, Any] = {"table": out_dir / "table.md", "runs": runs, "figure": None}
    payload = {"settings": settings, "timing": timing or {}, "runs": as_json(runs),
               "statuses": {f"{m}/seed{s}": v for (m, s), v in (statuses or {}).items()}}
    (out_dir / "results.json").write_text(json.dumps(payload, indent=2, default=_json_default) + "\n")
    if figure and runs:
        written["figure"] = draw_figure(study, runs, title=settings)
    if study.report is not None:
        written["markdown"] = publish(study, "".join(text), written["figure"], command)
    return written


def draw_figure(study: StudyConfig, runs: list[RunSummary], title: str) -> Optional[Path]:
    """figure.png: one colour per method, seeds as thin lines, their mean thick; None (and a
    note) when matplotlib is not installed."""
    curves = [
        load_run(study.output_dir / r.method / f"seed{r.seed}", f"{r.method}/seed{r.seed}", r.method) for r in runs
    ]
    try:
        plot_runs(curves, study.output_dir / "figure.png", title=title)
    except ImportError:
        print(f"study: matplotlib is missing; draw the figure later: stabledrl study --report {study.output_dir}")
        return None
    return study.output_dir / "figure.png"


def section_markers(name: str) -> tuple[str, str]:
    """The two comments that bound report section ``name`` in the markdown."""
    return f"<!-- study:{name} -->", f"<!-- /study:{name} -->"


def section_pattern(name: str) -> re.Pattern[str]:
    """Report section ``name``, its markers included."""
    begin, end = section_markers(name)
    return re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)


def publish(study: StudyConfig, table: str, figure: Optional[Path], command: Optional[str]) -> Path:
    """Replace the <!-- study:NAME --> ... <!-- /study:NAME --> section of the report markdown."""
    target = study.report
    markdown = target.markdown
    begin, end = section_markers(target.section)
    body = [begin, ""]
    if command:
        body += [f"Command: `{command}`", ""]
    body.append(table.rstrip())
    if figure is not None:
        target.figure.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(figure, target.figure)
        link = os.path.relpath(target.figure, markdown.parent)
        body += ["", f"![{target.section} study]({link})"]
    body += ["", end]
    section = "\n".join(body)
    old = markdown.read_text() if markdown.is_file() else f"# Study\n\n{begin}\n{end}\n"
    pattern = section_pattern(target.section)
    new = pattern.sub(lambda _: section, old) if pattern.search(old) else old.rstrip() + "\n\n" + section + "\n"
    markdown.write_text(new)
    return markdown


def _json_default(x: Any) -> Any:
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")
