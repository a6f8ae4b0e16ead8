"""The colocated memory benchmark (bench_colocated_memory.py): its verdict from a run's record, and
its CPU rehearsal, the StableDRL recipe as committed at the tiny LLaDA with the workers viewing their
ranks' parameters (weights.backend ipc: on the CPU the views are shared-memory segments)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import bench_colocated_memory as bench  # noqa: E402
import warm_workers  # noqa: E402  (tests/helpers, on the path: tests/conftest.py)


def record(rc: int, steps: int, gpu_peak: float) -> dict:
    return {"rc": rc, "figures": {"steps": steps, "gpu_memory_used_max_gib": gpu_peak, "peak_memory_gib": 96.0},
            "actors": {"learner0": {"peak_memory_gib": 96.0}, "rollout0": {"peak_memory_gib": 9.5}}}


def test_the_verdict_needs_every_step_and_a_peak_below_the_card():
    v = bench.verdict(record(0, 6, 110.0), layers=24, steps=6, card_gib=139.8)
    assert v["ran"] and v["fits"] and v["release_peak_gib"] == 104.7
    assert v["actors_allocator_peak_gib"] == {"learner0": 96.0, "rollout0": 9.5}
    assert not bench.verdict(record(0, 5, 110.0), layers=24, steps=6, card_gib=139.8)["ran"]
    assert not bench.verdict(record(1, 6, 110.0), layers=24, steps=6, card_gib=139.8)["fits"]
    assert not bench.verdict(record(0, 6, 140.5), layers=24, steps=6, card_gib=139.8)["fits"]
    table = bench.markdown(v, {"name": "H200", "count": 1}, "host", ["cluster.colocate=true"])
    assert "| 6 of 6 | 110.0 | learner0 96.0, rollout0 9.5 | 104.7 | yes |" in table


@pytest.mark.e2e
def test_the_tiny_colocated_job_runs_its_steps_with_views(tmp_path):
    python, env = warm_workers.python()  # the script, the job it starts and its workers forked warm
    done = subprocess.run([python, str(HERE / "bench_colocated_memory.py"), "--tiny", "--steps", "2",
                           "--set", "weights.backend=ipc", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    out = json.loads((tmp_path / "memory.json").read_text())
    v, run = out["verdict"], out["record"]
    assert v["ran"] and v["fits"] and v["steps_done"] == 2 and v["layers"] == 2
    assert "weights.backend=ipc" in run["overrides"] and "--ranks 1 --workers 1" in run["command"]
    assert "| 2 of 2 |" in (tmp_path / "memory.md").read_text()
