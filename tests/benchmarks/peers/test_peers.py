"""The peer benchmark's CPU rehearsal: the driver (run_peers.py) with a fake peer whose timings are
known, the figures and ratios it derives, and the project's loop through the system benchmark
(bench_system.py --tiny: the shipped StableDRL recipe's job at the tiny LLaDA, on the CPU), so a
refactor that breaks any of them fails the suite. The releases' own code is not part of the
project and is not run here (it is fetched by whoever runs the GPU benchmark)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE))

import peer_events as pe  # noqa: E402
import run_peers  # noqa: E402


def fake_events(tmp_path: Path, ranks: int, gen_s: float, train_s: float, steps: int = 4) -> dict:
    """``ranks`` fake peer processes at once (as accelerate launches them)."""
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "fake_peer.py"), "--events", str(tmp_path), "--steps", str(steps)],
            env=dict(
                os.environ,
                RANK=str(rank),
                PEER_LAUNCHED_AT="0",
                FAKE_PEER_GEN_S=str(gen_s),
                FAKE_PEER_TRAIN_S=str(train_s),
            ),
        )
        for rank in range(ranks)
    ]
    assert [p.wait(timeout=60) for p in procs] == [0] * ranks
    return pe.read_events(tmp_path)


def test_peer_figures_count_the_last_round_of_every_rank(tmp_path):
    events = fake_events(tmp_path, ranks=2, gen_s=0.3, train_s=0.1)
    f = pe.peer_figures(events, n_gpus=2, skip=2)
    assert f["steps"] == 4 and f["ranks"] == 2
    # the last round of each rank: 16 rows, trained for 2 steps
    assert f["samples"] == 32 and f["tokens"] == 32 * 256
    # each rank's window: the end of its first round to the end of its last step (gen 0.3 + 2 x 0.1 s)
    assert 0.5 <= f["window_s"] < 2.0 and f["gpu_s"] >= 1.0
    assert f["samples_per_s_per_gpu"] == pytest.approx(32 / f["gpu_s"])
    assert 16 * 256 / 0.3 * 0.7 < f["rollout_tokens_per_s_per_gpu"] <= 16 * 256 / 0.3
    assert f["learner_s_per_sample"] == pytest.approx((f["gpu_s"] - f["generate_s"]) / 32)
    assert f["first_step_s"] > 1e9  # launched_at 0: the epoch clock of the first step
    assert f["peak_memory_gib"] == 1.5


def test_peer_figures_report_too_few_steps(tmp_path):
    events = fake_events(tmp_path, ranks=1, gen_s=0.01, train_s=0.01, steps=2)
    f = pe.peer_figures(events, n_gpus=1, skip=2)
    assert f["steps"] == 2 and "problem" in f and "samples_per_s_per_gpu" not in f
    assert pe.peer_figures({}, n_gpus=1, skip=2)["problem"] == "no events"


def test_ratios_orient_every_figure_so_that_above_one_is_better():
    project = {"samples_per_s_per_gpu": 4.0, "rollout_tokens_per_s_per_gpu": 1000.0, "learner_s_per_sample": 0.05,
               "first_step_s": 60.0, "peak_memory_gib": 20.0}
    peer = {"samples_per_s_per_gpu": 1.0, "rollout_tokens_per_s_per_gpu": 250.0, "learner_s_per_sample": 0.1,
            "first_step_s": 90.0, "peak_memory_gib": None}
    r = pe.compare(project, peer)
    assert r == {"samples_per_s_per_gpu": 4.0, "rollout_tokens_per_s_per_gpu": 4.0, "learner_s_per_sample": 2.0,
                 "first_step_s": 1.5, "peak_memory_gib": None}
    assert pe.verdict(4.0, 5.0) == "short" and pe.verdict(5.0, 5.0) == "met" and pe.verdict(None, 2.0) == "not measured"


def test_table_rows_pair_each_project_loop_with_its_peer_and_target():
    fig = lambda s: {"samples_per_s_per_gpu": s, "rollout_tokens_per_s_per_gpu": 100.0}  # noqa: E731
    results = {"card": {"name": "cpu"}, "n_gpus": 2, "parts": {
        "stabledrl_checkpoint": {}, "stabledrl_peer": {"figures": fig(1.0)},
        "stabledrl_release_sampler": {"figures": fig(2.5)}, "stabledrl_fast": {"figures": fig(4.0)},
        "stabledrl_fast_64_rows": {"figures": fig(6.0)}}}
    rows = run_peers.table_rows(results)
    assert [r["name"] for r in rows] == ["stabledrl release (peer)", "stabledrl: stabledrl train, release sampler",
                                         "stabledrl: stabledrl train, fast", "stabledrl: stabledrl train, fast 64 rows"]
    assert [r["target"] for r in rows[1:]] == [2.0, 5.0, 5.0]
    assert [r["ratio"]["samples_per_s_per_gpu"] for r in rows[1:]] == [2.5, 4.0, 6.0]
    table = pe.markdown(rows)
    assert "2.50× (≥ 2.0×: met)" in table and "4.00× (≥ 5.0×: short)" in table and "6.00× (≥ 5.0×: met)" in table
    # a --variant at the release's sampler is held to 2x, one with the fast sampler to 5x
    results["variants"] = {"colocated_64_rows": [*run_peers.COLOCATED, "rollout.prompts_per_request=4"],
                           "fast_64_rows": [*run_peers.FAST, "rollout.prompts_per_request=4"]}
    results["parts"]["stabledrl_colocated_64_rows"] = {"figures": fig(1.5)}
    rows = run_peers.table_rows(results)
    assert [r["target"] for r in rows[1:]] == [2.0, 5.0, 5.0, 2.0]
    # a loop that failed (out of memory at step 2) keeps its row, marked, and is never compared
    results["parts"]["stabledrl_colocated_64_rows"].update(rc=1, stopped=False)
    rows = run_peers.table_rows(results)
    assert rows[-1]["name"] == "stabledrl: stabledrl train, colocated 64 rows (FAILED: rc 1)"
    assert rows[-1]["ratio"] is None and "(FAILED: rc 1) | 1.500 | 100 |" in pe.markdown(rows)
    assert pe.markdown(rows).rstrip().endswith("| failed: not compared |")


def test_d1_pair_counts_each_round_once_and_compares(tmp_path):
    """The driver's d1 path: the fake peer as d1's harness (its CPU arguments, 24 steps = 2 rounds of
    mu = 12 over 12 rows a rank), the window after the first round, the rows counted once, and the
    project's d1 rows paired with that peer."""
    env = dict(os.environ, FAKE_PEER_MU="12", FAKE_PEER_ROWS="12", FAKE_PEER_GEN_S="0.05", FAKE_PEER_TRAIN_S="0.01")
    done = subprocess.run(
        [sys.executable, str(HERE / "run_peers.py"), "--tiny", "--pairs", "d1", "--loops", "peer",
         "--peer-root", str(tmp_path / "none"), "--peer-script", f"d1={HERE / 'fake_peer.py'}",
         "--part-timeout-s", "60", "--out", str(tmp_path / "out")],
        cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    peer = results["parts"]["d1_peer"]
    assert "--steps 24" in peer["command"] and "--set max_completion_length=64" in peer["command"]
    f = peer["figures"]
    assert (f["steps"], f["skip"], f["samples"], f["tokens"]) == (24, 12, 12, 12 * 256)
    assert f["samples_per_s_per_gpu"] == pytest.approx(12 / f["gpu_s"])
    # 12 steps of 0.01 s and one 0.05 s generation: far less than 12 x 12 rows' worth of time
    assert 0.05 < f["window_s"] < 5.0
    results["parts"]["d1_release_sampler"] = {"figures": {"samples_per_s_per_gpu": 3 * f["samples_per_s_per_gpu"]}}
    rows = run_peers.table_rows(results)
    assert [r["name"] for r in rows] == ["d1 release (peer)", "d1: stabledrl train, release sampler"]
    assert rows[1]["ratio"]["samples_per_s_per_gpu"] == pytest.approx(3.0) and rows[1]["target"] == 2.0
    assert run_peers.pair_spec("d1", 2)["groups"] == 4  # a project step trains one d1 round on 2 GPUs: 24 rows


def test_merge_takes_only_a_run_on_the_same_card():
    results = {"card": {"name": "H100"}, "n_gpus": 2, "parts": {"stabledrl_fast": {"figures": {}}}, "merged": []}
    run_peers.merge(results, {"card": {"name": "H200"}, "n_gpus": 2, "parts": {"stabledrl_peer": {}}}, "a.json")
    assert "stabledrl_peer" not in results["parts"] and "skipped" in results["merged"][0]
    run_peers.merge(results, {"card": {"name": "H100"}, "n_gpus": 2, "parts": {"stabledrl_peer": {}}}, "b.json")
    assert set(results["parts"]) == {"stabledrl_fast", "stabledrl_peer"}


def test_project_config_reads_files_and_skips_the_protocol(tmp_path):
    path = run_peers.project_config("deploy/configs/recipe_stabledrl_llada8b_gsm8k.yaml", tmp_path)
    from stabledrl.common.config.job import load_job_config

    cfg = load_job_config(str(path), [f"task.source.path={tmp_path / 'rows.jsonl'}"])
    assert cfg.task.source.kind == "file" and cfg.eval.protocol is None
    assert (cfg.algorithm.group_size, cfg.algorithm.inner_iterations, cfg.sampler.steps) == (16, 2, 128)
    d1 = load_job_config(str(run_peers.project_config("deploy/configs/recipe_d1_llada8b_gsm8k_lora.yaml", tmp_path)),
                         [f"task.source.path={tmp_path / 'rows.jsonl'}"])
    assert d1.task.source.kind == "file" and d1.eval.protocol is None and d1.learner.lora.rank == 128
    assert (d1.algorithm.group_size, d1.algorithm.inner_iterations, d1.sampler.gen_length) == (6, 12, 256)


@pytest.mark.e2e
def test_tiny_peer_benchmark_runs_the_project_loop_and_compares(tmp_path):
    """The driver end to end on the CPU: the fake peer, then the StableDRL recipe's job (tiny LLaDA,
    2 steps) through bench_system.py, placed apart and colocated, the figures of each and their
    ratio in results.json and table.md."""
    done = subprocess.run(
        [sys.executable, str(HERE / "run_peers.py"), "--tiny", "--peer-root", str(tmp_path / "none"),
         "--peer-script", f"stabledrl={HERE / 'fake_peer.py'}", "--loops", "peer,release_sampler,colocated",
         "--project-steps", "2", "--part-timeout-s", "400", "--out", str(tmp_path / "out")],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    peer, project = results["parts"]["stabledrl_peer"], results["parts"]["stabledrl_release_sampler"]
    assert peer["rc"] == 0 and peer["figures"]["samples"] == 16
    f = project["figures"]
    assert project["rc"] == 0 and f["steps"] == 2 and f["timed_steps"] == [2]
    assert f["samples_per_s_per_gpu"] > 0 and f["rollout_tokens_per_s_per_gpu"] > 0 and f["learner_s_per_sample"] > 0
    assert f["first_step_s"] > 0 and f["samples"] == 8  # tiny: 2 groups of 4
    assert {"learner0", "rollout0"} <= set(project["actors"]) and project["actors"]["learner0"]["seconds"]["train"] > 0
    ratio = results["rows"][1]["ratio"]["samples_per_s_per_gpu"]
    assert ratio == pytest.approx(f["samples_per_s_per_gpu"] / peer["figures"]["samples_per_s_per_gpu"])
    assert "| stabledrl: stabledrl train, release sampler |" in (tmp_path / "out" / "table.md").read_text()
    # the colocated loop: the same job with a learner rank and a worker sharing each bundle (1 of each here)
    colocated = results["parts"]["stabledrl_colocated"]
    assert colocated["rc"] == 0 and colocated["figures"]["steps"] == 2, colocated["log_tail"]
    assert "cluster.colocate=true" in colocated["overrides"] and "--ranks 1 --workers 1" in colocated["command"]
    assert colocated["actors"]["learner0"]["seconds"]["train"] > 0 and colocated["actors"]["rollout0"]["seconds"]
    assert results["rows"][2]["target"] == 2.0
