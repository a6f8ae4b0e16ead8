"""`stabledrl plot`: series read from metrics.jsonl, runs grouped, panels that were not logged."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import stabledrl.cli.main as cli
from stabledrl.recipes.plot import PANELS, RunCurves, ema, load_run, load_runs, mean_series, plot_runs, run_names

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(directory: Path, steps: int, *, clip: bool = True, scale: float = 1.0) -> Path:
    """A metrics.jsonl as the Driver writes it: eval lines at 0 and the end, one line per step."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = [{"step": 0, "eval/pass@1": 0.3}]
    for s in range(1, steps + 1):
        record = {"step": s, "rollout/reward_mean": scale * s / steps, "train/ratio/std": 0.1 * s,
                  "train/ratio/max": 1.0 + s, "train/grad_norm_max": 2.0 ** s, "staleness/mean": 1.0}
        if clip:
            record.update({"train/clip/frac_upper": 0.01 * s, "train/clip/frac_lower": 0.02})
        lines.append(record)
    lines.append({"step": steps, "eval/pass@1": 0.5})
    (directory / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return directory


def test_series_sums_keys_per_step_last_record_wins_and_drops_non_finite():
    records = [
        {"step": 1, "a": 1.0, "b": 0.5},
        {"step": 2, "a": 2.0},
        {"step": 2, "a": 5.0},  # a resumed run logs step 2 again: the later record counts
        {"step": 3, "a": float("inf")},  # a skipped update's grad norm
        {"step": 4, "c": 1.0},
    ]
    run = RunCurves("r", records)
    assert run.series(("a", "b")) == ([1, 2], [1.5, 5.0])
    assert run.series(("a",)) == ([1, 2], [1.0, 5.0])
    assert run.series(("missing",)) == ([], [])


def test_ema_and_mean_series():
    assert ema([1.0, 0.0, 0.0], 0.5) == [1.0, 0.5, 0.25]
    assert ema([3.0, 1.0], 0.0) == [3.0, 1.0]
    steps, mean = mean_series([([1, 2, 3], [1.0, 2.0, 3.0]), ([2, 3, 4], [4.0, 6.0, 8.0])])
    assert steps == [2, 3] and mean == [3.0, 4.5]  # only the steps both runs have
    steps, geo = mean_series([([1, 2], [1.0, 0.0]), ([1, 2], [100.0, 4.0])], geometric=True)
    assert steps == [1, 2] and geo == pytest.approx([10.0, 4.0])  # a zero has no log: left out


def test_run_names_are_the_shortest_distinct_suffixes(tmp_path):
    paths = [tmp_path / "study" / m / "seed0" for m in ("grpo", "drpo")] + [tmp_path / "study" / "grpo" / "seed1"]
    assert run_names(paths) == ["grpo/seed0", "drpo/seed0", "grpo/seed1"]
    assert run_names([tmp_path / "a", tmp_path / "b"]) == ["a", "b"]


def test_a_png_with_every_panel_and_not_logged_where_no_run_has_the_key(tmp_path):
    runs = [load_run(write_run(tmp_path / "with_clip", 6)), load_run(write_run(tmp_path / "drpo", 6, clip=False))]
    status = plot_runs(runs, tmp_path / "fig.png", title="two runs", dpi=40)
    assert set(status) == {p.title for p in PANELS}
    assert all(s == "drawn" for s in status.values())  # one run with clipping is enough
    assert (tmp_path / "fig.png").read_bytes()[:8] == PNG_MAGIC

    no_clip = plot_runs(runs[1:], tmp_path / "drpo.png", dpi=40)
    clip_panel = next(p.title for p in PANELS if "train/clip/frac_upper" in p.keys)
    assert no_clip[clip_panel] == "not logged"
    assert [t for t, s in no_clip.items() if s != "drawn"] == [clip_panel]


def test_group_parent_labels_seeds_by_method(tmp_path):
    dirs = [write_run(tmp_path / m / f"seed{s}", 4, scale=s + 1) for m in ("grpo", "stabledrl") for s in (0, 1)]
    runs = load_runs(dirs, group="parent")
    assert [r.label for r in runs] == ["grpo", "grpo", "stabledrl", "stabledrl"]
    assert [r.name for r in runs] == ["grpo/seed0", "grpo/seed1", "stabledrl/seed0", "stabledrl/seed1"]
    plot_runs(runs, tmp_path / "grouped.png", dpi=40)
    assert (tmp_path / "grouped.png").read_bytes()[:8] == PNG_MAGIC


def test_missing_metrics_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        load_run(tmp_path)


def test_truncated_last_line_is_ignored(tmp_path):
    run_dir = write_run(tmp_path / "r", 3)
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "rollout/rew')  # a run killed mid-write
    steps, values = load_run(run_dir).series(("rollout/reward_mean",))
    assert steps == [1, 2, 3] and math.isclose(values[-1], 1.0)


def test_cli_plot_writes_the_png(tmp_path, capsys):
    run_dir = write_run(tmp_path / "run", 5, clip=False)
    assert cli.main(["plot", str(run_dir), "--out", str(tmp_path / "out.png")]) == 0
    assert (tmp_path / "out.png").read_bytes()[:8] == PNG_MAGIC
    assert "not logged: clip fraction" in capsys.readouterr().out
