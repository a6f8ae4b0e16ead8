"""deploy/quickstart_sweep.py's bookkeeping: the overrides of a warm-start spec, a run's record
read from its metrics.jsonl, and the summary's gain distribution (the runs themselves are the
quickstart's, covered by tests/e2e/test_quickstart_recipe.py)."""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

SWEEP = Path(__file__).resolve().parents[3] / "deploy" / "quickstart_sweep.py"
spec = importlib.util.spec_from_file_location("quickstart_sweep", SWEEP)
sweep = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = sweep  # its dataclass looks its module up there
spec.loader.exec_module(sweep)


def fake_run(tmp_path: Path, name: str, seed: int, curve: list[float]) -> "sweep.Run":
    out = tmp_path / name / f"seed{seed}"
    out.mkdir(parents=True)
    lines = [{"step": 0, "data/rows_read": 1000.0}]
    lines += [{"step": 10 * i, "eval/pass@1": p / 100} for i, p in enumerate(curve)]
    lines.insert(2, {"step": 1, "rollout/reward_mean": 0.4})
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return sweep.Run(name, seed, out, started=time.monotonic())


def test_warm_start_spec_becomes_warmstart_overrides():
    assert sweep.warm_start_overrides("seed=1, steps=200,threads=1") == [
        "warmstart.seed=1", "warmstart.steps=200", "warmstart.threads=1"]  # fmt: skip
    assert all(sweep.warm_start_overrides(ws)[0].startswith("warmstart.seed=") for ws in sweep.WARM_STARTS)


def test_run_record_reads_before_after_and_the_mean_of_the_last_evaluations(tmp_path):
    run = fake_run(tmp_path, "seed=0", 0, [59.5, 70.0, 80.0, 76.0, 79.0])
    record = sweep.run_record(run, 0, window=3)
    assert record["before"] == 59.5 and record["after"] == 79.0 and record["gain"] == 19.5
    assert record["after_window"] == round((80.0 + 76.0 + 79.0) / 3, 2)
    assert record["gain_window"] == round(record["after_window"] - 59.5, 2)
    assert [tuple(point) for point in record["curve"]][:2] == [(0, 0.595), (10, 0.70)]
    failed = sweep.run_record(fake_run(tmp_path, "seed=1", 0, [35.0]), 1, window=3)
    assert "gain" not in failed and failed["returncode"] == 1


def test_summary_gives_the_gain_per_warm_start_and_its_distribution(tmp_path):
    records = [sweep.run_record(fake_run(tmp_path, ws, seed, [before, before + gain]), 0, window=3)
               for ws, before, seed, gain in [("a", 35.0, 0, 40.0), ("a", 35.0, 1, 30.0), ("b", 71.0, 0, 12.0),
                                              ("b", 71.0, 1, 8.0)]]  # fmt: skip
    records.append(sweep.run_record(fake_run(tmp_path, "c", 0, [50.0]), 2, window=3))
    args = argparse.Namespace(config="quickstart.yaml", set=[], window=3)
    text = sweep.summary(records, args)
    assert "4 of 5 runs finished" in text and "failed (exit 2)" in text
    assert "| a | 35.0 | +40.0, +30.0 |" in text and "| b | 71.0 | +12.0, +8.0 |" in text
    assert "min +8.0, median +21.0, max +40.0; 3 of 4 at least +10" in text
    assert "BEFORE spans 35.0% to 71.0% over 2 distinct values" in text


def test_core_sets_are_disjoint_or_empty_when_the_machine_has_too_few(monkeypatch):
    monkeypatch.setattr(sweep.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5})
    assert sweep.core_sets(3, 2) == [[0, 1], [2, 3], [4, 5]]
    assert sweep.core_sets(4, 2) == [[], [], [], []]


def test_a_second_sweep_into_the_same_out_keeps_only_finished_runs(tmp_path):
    done = sweep.run_record(fake_run(tmp_path, "a", 0, [35.0, 60.0]), 0, window=3)
    failed = sweep.run_record(fake_run(tmp_path, "a", 1, [35.0]), 1, window=3)
    (tmp_path / "results.jsonl").write_text(json.dumps(done) + "\n" + json.dumps(failed) + "\n")
    assert [(r["warm_start"], r["seed"]) for r in sweep.previous_records(tmp_path / "results.jsonl")] == [("a", 0)]
    assert sweep.previous_records(tmp_path / "absent.jsonl") == []
