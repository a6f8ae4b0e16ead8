"""deploy/fast_sampler_quality.py's bookkeeping: tokens and canvas positions committed per forward read
from a run's metrics.jsonl, the spread over seeds, and where the fast sampler's mean lies against the
exact one's (the runs themselves are deploy/quickstart_sweep.py's)."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "deploy" / "fast_sampler_quality.py"
spec = importlib.util.spec_from_file_location("fast_sampler_quality", SCRIPT)
quality = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = quality
spec.loader.exec_module(quality)


def test_rates_are_per_forward_and_row(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    steps = [{"step": 0, "eval/pass@1": 0.5},  # no rollouts: not counted
             {"step": 1, "rollout/tokens": 90.0, "rollout/forwards": 4.0, "rollout/samples": 64.0},
             {"step": 2, "rollout/tokens": 70.0, "rollout/forwards": 4.0, "rollout/samples": 64.0}]
    metrics.write_text("".join(json.dumps(s) + "\n" for s in steps))
    rates = quality.rollout_rates(metrics, rows_per_request=32, gen_length=4)
    assert rates["tokens_per_forward"] == pytest.approx(160 / (8 * 32))
    assert rates["positions_per_forward"] == pytest.approx(128 * 4 / (8 * 32))  # 2.0: two positions a forward
    assert quality.rollout_rates(tmp_path / "absent.jsonl", 32, 4)["tokens_per_forward"] is None


def results(exact: list[float], fast: list[float]) -> dict:
    runs = lambda xs: [{"seed": i, "before": 60.0, "after_window": x, "wall_s": 1.0} for i, x in enumerate(xs)]  # noqa: E731
    return {"warm_start": "w", "seeds": [0, 1, 2], "set": [], "machine": "m",
            "samplers": {k: {"records": runs(v), "summary": quality.summarise(runs(v))}
                         for k, v in (("exact", exact), ("fast", fast))}}


def test_the_verdict_places_the_fast_mean_against_the_exact_spread():
    r = results([77.7, 75.5, 80.7], [82.0, 82.5, 79.8])
    assert r["samplers"]["exact"]["summary"]["after_window"]["mean"] == pytest.approx(77.966, abs=1e-3)
    text = quality.verdict(r)
    assert "above the exact sampler's spread; difference +3.5 points" in text and "t = 2.0" in text
    assert "within" in quality.verdict(results([77.7, 75.5, 80.7], [79.0, 78.0, 80.0]))
    assert "BELOW" in quality.verdict(results([77.7, 75.5, 80.7], [70.0, 71.0, 72.0]))
    r["verdict"] = quality.verdict(r)
    table = quality.table(r)
    assert "| **fast: mean ± sd (range)** | 3 of 3 | 60.0 | **81.4 ± 1.4** (79.8-82.5)" in table
