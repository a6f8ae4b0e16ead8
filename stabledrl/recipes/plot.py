"""The curves behind `stabledrl plot` (stabledrl/cli/reports.py) and the study report: how training went, as one
PNG of curves over steps, several runs overlaid.

    stabledrl plot runs/quickstart --out quickstart.png
    stabledrl plot runs/study_cpu/*/seed* --group parent --out study.png     # one colour per method

Each run is a directory holding ``metrics.jsonl`` (``stabledrl.common.metrics.MetricsLogger``) or that file
itself. The panels (``PANELS``) are the signals a stability study reads:

    reward            rollout/reward_mean (exponential moving average, ``smooth``)
    held-out pass@1   eval/pass@1 (logged before, after and every eval.every steps)
    ratio spread      train/ratio/std and train/ratio/max (log scale)
    gradient norm     train/grad_norm_max: the largest pre-clip norm of the step's μ updates
    clip fraction     train/clip/frac_upper + train/clip/frac_lower
    staleness         staleness/mean (versions between sampling and training)

A panel none of the runs logged says "not logged" (DRPO has no clipping, a synchronous run no
staleness worth drawing). Runs that share a label (``group``) share a colour: each run is a thin
line and their mean over the steps they have in common a thick one (geometric on log-scale
panels), so seeds read as a band.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional, Sequence

from stabledrl.common.metrics import read_metrics

Series = tuple[list[int], list[float]]  # (steps, values), steps increasing


@dataclass(frozen=True)
class Panel:
    """One subplot: ``keys`` are summed per step where present (one key: drawn as is)."""

    title: str
    keys: tuple[str, ...]
    log: bool = False
    smooth: bool = False  # EMA of the per-step values (the batch reward is a noisy 64-sample mean)
    markers: bool = False  # sparse series (evaluations)


PANELS: tuple[Panel, ...] = (
    Panel("reward (train batch, EMA)", ("rollout/reward_mean",), smooth=True),
    Panel("held-out pass@1", ("eval/pass@1",), markers=True),
    Panel("ratio std  (train/ratio/std)", ("train/ratio/std",), log=True),
    Panel("ratio max  (train/ratio/max)", ("train/ratio/max",), log=True),
    Panel("grad norm before clip (max of μ)", ("train/grad_norm_max",), log=True),
    Panel("clip fraction", ("train/clip/frac_upper", "train/clip/frac_lower")),
    Panel("staleness (mean, versions)", ("staleness/mean",)),
)


@dataclass
class RunCurves:
    """The metrics of one run: ``records`` as read from metrics.jsonl."""

    name: str
    records: list[dict[str, float]] = field(repr=False)
    label: str = ""

    def __post_init__(self) -> None:
        self.label = self.label or self.name

    def series(self, keys: Sequence[str]) -> Series:
        """Per step, the sum of ``keys`` present at that step (the last record of a step wins,
        as after a resume); steps where none is present or the value is not finite are left out."""
        per_step: dict[int, dict[str, float]] = {}
        for record in self.records:
            present = {k: record[k] for k in keys if k in record and isinstance(record[k], (int, float))}
            if present:
                per_step.setdefault(int(record["step"]), {}).update(present)
        steps, values = [], []
        for step in sorted(per_step):
            value = math.fsum(per_step[step].values())
            if math.isfinite(value):
                steps.append(step)
                values.append(value)
        return steps, values


def load_run(path: str | Path, name: Optional[str] = None, label: str = "") -> RunCurves:
    """A run directory (holding metrics.jsonl) or a metrics.jsonl file."""
    path = Path(path)
    file = path / "metrics.jsonl" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"{path}: no metrics.jsonl (give a run's output_dir or the file itself)")
    return RunCurves(name or (path.name if path.is_dir() else path.parent.name), read_metrics(file), label)


def run_names(paths: Sequence[str | Path]) -> list[str]:
    """Short distinct names: each path's last component, or as many trailing components as it
    takes to tell the runs apart (``grpo/seed0`` and ``drpo/seed0``)."""
    parts = [Path(p).resolve().parts for p in paths]
    for depth in range(1, max(len(p) for p in parts) + 1):
        names = ["/".join(p[-depth:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return [str(p) for p in paths]


def load_runs(paths: Sequence[str | Path], group: Literal["none", "parent"] = "none") -> list[RunCurves]:
    """Runs named by ``run_names``; ``group='parent'`` labels each run by its parent directory
    (a study's ``METHOD/seedN`` layout), so seeds of one method share a colour."""
    names = run_names(paths)
    return [load_run(p, n, Path(p).resolve().parent.name if group == "parent" else n) for p, n in zip(paths, names)]


def ema(values: Sequence[float], weight: float) -> list[float]:
    """e_1 = v_1, e_t = weight·e_{t-1} + (1 − weight)·v_t  (weight 0: the values themselves)."""
    out: list[float] = []
    for v in values:
        out.append(v if not out else weight * out[-1] + (1.0 - weight) * v)
    return out


def mean_series(series: Sequence[Series], geometric: bool = False) -> Series:
    """The mean over runs at each step every run has (seeds of one method, aligned by step);
    ``geometric``: exp of the mean log, over the positive values (log-scale panels, where one
    run's spike would otherwise be the whole arithmetic mean)."""
    common = set(series[0][0]).intersection(*(set(s[0]) for s in series[1:]))
    lookups = [dict(zip(*s)) for s in series]
    steps, means = [], []
    for step in sorted(common):
        values = [m[step] for m in lookups]
        if geometric:
            values = [math.log(v) for v in values if v > 0]
            if not values:
                continue
        mean = math.fsum(values) / len(values)
        steps.append(step)
        means.append(math.exp(mean) if geometric else mean)
    return steps, means


def plot_runs(runs: Sequence[RunCurves], out: str | Path, *, title: Optional[str] = None,
              panels: Sequence[Panel] = PANELS, smooth: float = 0.8, dpi: int = 110) -> dict[str, str]:
    """Draw ``panels`` for ``runs`` into the PNG ``out``; returns {panel title: 'drawn' | 'not logged'}.

    Raises ImportError when matplotlib is missing (the metrics stay readable: plot them later)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    if not runs:
        raise ValueError("plot_runs needs at least one run")
    groups: "OrderedDict[str, list[RunCurves]]" = OrderedDict()
    for run in runs:
        groups.setdefault(run.label, []).append(run)
    colours = plt.get_cmap("tab10" if len(groups) <= 10 else "tab20")
    cols = 4
    rows = math.ceil((len(panels) + 1) / cols)  # one cell more for the legend
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.1 * rows), squeeze=False)
    cells = [ax for row in axes for ax in row]
    status: dict[str, str] = {}
    handles: dict[str, object] = {}
    for ax, panel in zip(cells, panels):
        drawn = False
        for g, (label, members) in enumerate(groups.items()):
            series = [r.series(panel.keys) for r in members]
            series = [(s, _smoothed(v, smooth if panel.smooth else 0.0)) for s, v in series if s]
            if not series:
                continue
            drawn = True
            colour = colours(g % colours.N)
            style = {"marker": "o", "markersize": 3} if panel.markers else {}
            if len(series) == 1:
                (line,) = ax.plot(*series[0], color=colour, linewidth=1.4, **style)
            else:
                for s in series:
                    ax.plot(*s, color=colour, linewidth=0.7, alpha=0.35, **style)
                (line,) = ax.plot(*mean_series(series, geometric=panel.log), color=colour, linewidth=2.0)
            handles.setdefault(label, line)
        status[panel.title] = "drawn" if drawn else "not logged"
        ax.set_title(panel.title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if not drawn:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="grey")
        elif panel.log:
            ax.set_yscale("log")
    legend_ax = cells[len(panels)]
    legend_ax.axis("off")
    if handles:
        note = "thin: runs, thick: mean" if any(len(m) > 1 for m in groups.values()) else None
        legend_ax.legend(list(handles.values()), list(handles), loc="center", fontsize=9, title=note,
                         title_fontsize=8, frameon=False)
    for ax in cells[len(panels) + 1:]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return status


def _smoothed(values: list[float], weight: float) -> list[float]:
    return ema(values, weight) if weight > 0 else values
