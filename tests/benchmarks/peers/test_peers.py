"""The peer benchmark's CPU rehearsal: the driver (run_peers.py) with a fake peer whose timings and
forwards are known, the figures, ranges, ratios and roofline it derives (peers_table.py, roofline.py),
and the dry run that refuses a config before its loop starts, so a refactor that breaks any of them
fails the suite; the project's loops through the system benchmark (bench_system.py --tiny: the shipped
recipes' jobs at the tiny LLaDA, on the CPU) are rehearsed with the peer suites
(tests/benchmarks/test_suite_rehearsals.py). The releases' own code is not part of the project
and is not run here (it is fetched by whoever runs the GPU benchmark)."""
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
import peers_table as pt  # noqa: E402
import roofline as rl  # noqa: E402
import run_peers  # noqa: E402

SHAPE = {"layers": 2, "d": 8, "m": 16, "vocab": 32}  # P = 2 (4·64 + 3·128) = 1280


def fake_events(tmp_path: Path, ranks: int, gen_s: float, train_s: float, steps: int = 4) -> dict:
    """``ranks`` fake peer processes at once (as accelerate launches them)."""
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "fake_peer.py"), "--events", str(tmp_path), "--steps", str(steps)],
            env=dict(os.environ, RANK=str(rank), PEER_LAUNCHED_AT="0", FAKE_PEER_GEN_S=str(gen_s),
                     FAKE_PEER_TRAIN_S=str(train_s)),
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
    # the window's forwards, per phase, over both ranks: 8 sampler steps, one scoring, 2 learner forwards
    width = 100 + 256
    assert f["forwards"]["generate"] == {"calls": 16, "rows": 16 * 16, "tokens": 16 * 16 * width,
                                         "tokens_sq": 16 * 16 * width * width}
    assert f["forwards"]["score"]["calls"] == 2 and f["forwards"]["train"]["calls"] == 4
    s = f["seconds"]
    assert s["score"] == pytest.approx(0.02) and s["optimizer"] == pytest.approx(0.08)
    assert s["generate"] == pytest.approx(f["generate_s"])
    assert s["learner"] == pytest.approx(f["gpu_s"] - s["generate"] - s["score"] - s["optimizer"])


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


def flops_of(rows, t, head):
    return rows * (t * 2 * 1280 + t * t * 4 * 2 * 8) + rows * head * 2 * 8 * 32


def test_flops_are_counted_from_the_shapes():
    assert rl.layer_params(SHAPE) == 1280
    assert rl.forward_flops(SHAPE, 3, 3 * 10, 3 * 100, 3 * 4) == flops_of(3, 10, 4)
    # the releases' head at every position; the learner's forward with its backward (x3, LoRA x2)
    phases = {"generate": {"rows": 3, "tokens": 30, "tokens_sq": 300}, "train": {"rows": 2, "tokens": 20,
                                                                                "tokens_sq": 200}}
    assert rl.peer_flops(phases, SHAPE, lora=False) == {"generate": flops_of(3, 10, 10),
                                                         "train": 3 * flops_of(2, 10, 10)}
    assert rl.peer_flops(phases, SHAPE, lora=True)["train"] == 2 * flops_of(2, 10, 10)
    # the project: generation at the block alone; every estimate 2 views of prompt + completion, its head at the
    # completion; a reference scored once a step; mu = 3
    totals = {"samples": 4, "prompt_tokens": 4 * 6, "forward_rows": 8, "forward_tokens": 8 * 10}
    f = rl.project_flops(totals, SHAPE, gen_length=4, block_length=2, views=2, inner_iterations=3, lora=False,
                         reference_forwards=1, cached=False)
    assert f["generate"] == flops_of(8, 10, 2)
    assert f["score"] == 2 * flops_of(4, 10, 4) and f["learner_score"] == f["score"]
    assert f["train"] == 3 * 3 * f["score"]
    assert rl.project_flops(totals, SHAPE, gen_length=4, block_length=2, views=2, inner_iterations=3, lora=False,
                            reference_forwards=0, cached=True)["generate"] is None
    # a cached sampler that counted its forwards: 8 rows of a full forward (T = 10), 8 of the block alone (2
    # tokens reading all 10 keys); the head at the block either way
    counted = {**totals, "forward_rows": 16, "forward_tokens": 8 * 10 + 8 * 2, "forward_attended": 8 * 100 + 8 * 20}
    cached = rl.project_flops(counted, SHAPE, gen_length=4, block_length=2, views=2, inner_iterations=3, lora=False,
                              reference_forwards=0, cached=True)["generate"]
    block_alone = 8 * (2 * 2 * 1280 + 20 * 4 * 2 * 8) + 8 * 2 * 2 * 8 * 32
    assert cached == flops_of(8, 10, 2) + block_alone


def test_rates_shares_and_the_ceiling():
    flops = {"generate": 6e12, "score": 1e12, "learner_score": 0.0, "train": 4e12}
    seconds = {"generate": 10.0, "score": 2.0, "learner": 6.0, "optimizer": 2.0, "push": 1.0}
    r = rl.rates(flops, seconds, matmul_tflops=1.0)
    assert r["generate_tflops"] == pytest.approx(0.6) and r["generate_of_matmul"] == pytest.approx(0.6)
    assert r["learner_tflops"] == pytest.approx(0.5) and r["score_tflops"] == pytest.approx(0.5)
    s = rl.shares(seconds, gpu_s=25.0)
    assert s["generate"] == pytest.approx(0.4) and s["idle"] == pytest.approx(0.16)
    # 7 TFLOP of forwards at 0.75, 4 of training at 0.55, on a 1 TFLOP/s card: 20 samples in 16.61 s
    assert rl.ceiling(flops, 20, 1.0) == pytest.approx(20 / (7 / 0.75 + 4 / 0.55))
    assert rl.ceiling({**flops, "generate": None}, 20, 1.0) is None
    assert rl.target(None) == 1.5 and rl.target(2.0) == 1.5 and rl.target(1.2) == pytest.approx(1.08)
    assert rl.target(1.6) == 1.5  # a ceiling above 1.5x leaves the target at 1.5x, not 90% of the ceiling


def run(sps, rc=0, **figures):
    return {"rc": rc, "stopped": False, "figures": {"samples_per_s_per_gpu": sps, **figures}}


def step(n, rollout=0.0, learner=0.0):
    """A project step of a record's ``per_step`` (peer_events.project_figures)."""
    return {"step": n, "step_s": 1.0, "train_s": 0.5, "generate_s": 0.4,
            "compiles": {"rollout": rollout, "learner": learner}}


def part(pair, loop, layers, *runs):
    return pt.summarise({"pair": pair, "loop": loop, "layers": layers, "runs": list(runs)})


def test_table_rows_give_medians_ranges_ratios_and_targets():
    results = {"card": {"name": "cpu"}, "host": "h", "n_gpus": 2, "matmul_tflops": None,
               "variants": dict(run_peers.VARIANTS), "parts": {
                   "stabledrl_L24_checkpoint": {"layers": 24},
                   "stabledrl_L24_peer": part("stabledrl", "peer", 24, run(1.0), run(0.9), run(1.2)),
                   "stabledrl_L24_colocated": part("stabledrl", "colocated", 24, run(1.8), run(2.0), run(0.1, rc=1)),
                   "stabledrl_L24_fast": part("stabledrl", "fast", 24, run(4.0)),
                   "stabledrl_L8_peer": part("stabledrl", "peer", 8, run(2.0)),
                   "stabledrl_L8_colocated": part("stabledrl", "colocated", 8, run(4.0)),
                   "d1_L32_colocated": part("d1", "colocated", 32, {"rc": 2, "dry_run_error": "the config does not "
                                            "validate: estimator.masks: bad", "figures": {"problem": "x"}})}}
    rows = pt.table_rows(results)
    assert [(r["name"].split(" (")[0], r["layers"]) for r in rows] == [
        ("stabledrl release", 8), ("stabledrl: stabledrl train, colocated", 8), ("stabledrl release", 24),
        ("stabledrl: stabledrl train, colocated", 24), ("stabledrl: stabledrl train, fast", 24),
        ("d1: stabledrl train, colocated", 32)]
    peer, coloc, fast, d1 = rows[2], rows[3], rows[4], rows[5]
    assert peer["figures"]["samples_per_s_per_gpu"] == 1.0 and peer["spread"]["samples_per_s_per_gpu"] == (0.9, 1.2)
    # the failed run is left out of the median and named; the ratio of medians, the range of pairings
    assert coloc["figures"]["samples_per_s_per_gpu"] == pytest.approx(1.9) and coloc["finished"] == 2
    assert "1 of 3 FAILED: rc 1" in coloc["name"]
    assert coloc["ratio"]["samples_per_s_per_gpu"] == pytest.approx(1.9)
    assert coloc["ratio_range"] == pytest.approx((1.8 / 1.2, 2.0 / 0.9))
    assert coloc["target"] == 1.5 and fast["target"] == 5.0
    assert "FAILED: the config does not validate: estimator.masks: bad" in d1["name"] and d1["ratio"] is None
    table = pt.markdown(rows)
    assert "| stabledrl: stabledrl train, colocated (1 of 3 FAILED: rc 1) | 24 | 2 of 3 | 1.900 (1.800-2.000) |" \
        in table
    assert "1.90× (1.50-2.22) (≥ 1.50×: met)" in table and "4.00× (≥ 5.00×: short)" in table
    assert next(line for line in table.splitlines() if line.startswith("| d1:")).endswith("| failed: not compared |")


def test_a_loop_that_compiles_in_its_timed_steps_is_named_under_the_table():
    steady = {"rollout": 0.0, "learner": 0.0}
    results = {"card": {"name": "cpu"}, "host": "h", "n_gpus": 1, "matmul_tflops": None,
               "variants": dict(run_peers.VARIANTS), "parts": {
                   "d1_L32_peer": part("d1", "peer", 32, run(1.0)),
                   "d1_L32_colocated": part("d1", "colocated", 32, run(2.0, compiles_timed=steady),
                                            run(2.1, compiles_timed=steady)),
                   "d1_L32_fast": part("d1", "fast", 32, run(4.0, compiles_timed={"rollout": 96.0, "learner": 0.0},
                                                             timed_steps=[2, 3], per_step=[
                                                                 step(1, rollout=40.0, learner=6.0),
                                                                 step(2, rollout=96.0), step(3)]),
                                       run(5.0, compiles_timed=steady), run(0.1, rc=1, compiles_timed={"rollout": 7})),
               }}
    rows = pt.table_rows(results)
    by_loop = {r["name"].split(", ")[1].split(" (")[0]: r for r in rows if "train" in r["name"]}
    assert by_loop["colocated"]["compiles_timed"] == steady
    assert by_loop["fast"]["compiles_timed"] == {"rollout": 96.0, "learner": 0.0}  # the failed run not counted
    table = pt.markdown(rows)
    note = next(line for line in table.splitlines() if line.startswith("Graphs compiled during the timed steps"))
    assert "d1: stabledrl train, fast (1 of 3 FAILED: rc 1) (32 layers): rollout 96, learner 0 (at step 2)" in note
    assert "colocated" not in note
    assert "Graphs compiled" not in pt.markdown([by_loop["colocated"]])


def test_the_roofline_of_a_row_is_the_median_of_its_runs_and_sets_the_target():
    roof = {"flops": {"generate": 6e12, "score": 1e12, "learner_score": 0.0, "train": 4e12},
            "seconds": {"generate": 10.0, "score": 2.0, "learner": 6.0, "optimizer": 2.0}, "gpu_s": 25.0,
            "samples": 20}
    results = {"card": {"name": "cpu"}, "host": "h", "n_gpus": 1, "matmul_tflops": 1.0,
               "variants": dict(run_peers.VARIANTS), "parts": {
                   "stabledrl_L8_peer": part("stabledrl", "peer", 8, run(1.0)),
                   "stabledrl_L8_colocated": part("stabledrl", "colocated", 8, run(1.1, roofline=roof))}}
    row = pt.table_rows(results)[1]
    assert row["roofline"]["generate_of_matmul"] == pytest.approx(0.6)
    ceiling = 20 / (7 / 0.75 + 4 / 0.55)
    assert row["roofline"]["ceiling_samples_per_s_per_gpu"] == pytest.approx(ceiling)
    # the ceiling is 1.20x the release: the target is 90% of it, 1.08x, and 1.1x meets it
    assert row["ceiling_ratio"] == pytest.approx(ceiling) and row["target"] == pytest.approx(0.9 * ceiling)
    assert "(≥ 1.08×: met)" in pt.markdown([row])
    # its memory beside the release's: the release's allocator peak on one H200 at this depth where none ran
    assert row["memory"]["release_h200_gib"] == 57.2 and row["memory"]["release_allocator_gib"] is None


def test_merge_takes_only_a_run_on_the_same_card():
    results = {"card": {"name": "H100"}, "n_gpus": 2, "parts": {"stabledrl_L8_fast": {}}, "merged": []}
    pt.merge(results, {"card": {"name": "H200"}, "n_gpus": 2, "parts": {"stabledrl_L8_peer": {}}}, "a.json")
    assert "stabledrl_L8_peer" not in results["parts"] and "skipped" in results["merged"][0]
    pt.merge(results, {"card": {"name": "H100"}, "n_gpus": 2, "parts": {"stabledrl_L8_peer": {}}, "host": "b"},
             "b.json")
    assert set(results["parts"]) == {"stabledrl_L8_fast", "stabledrl_L8_peer"} and results["merged"][1]["host"] == "b"


def test_a_loop_in_two_merged_records_joins_their_runs():
    """Two records that both ran the release (a protocol's runs kept in different records): the loop's
    runs are the union, numbered on, and its figures the median over all of them."""
    def record(host, *sps):
        runs = [{**run(x), "run": i, "host": host} for i, x in enumerate(sps)]
        return {"card": {"name": "H200"}, "n_gpus": 2, "host": host, "matmul_tflops": 700.0, "parts": {
            "stabledrl_L32_checkpoint": {"layers": 32},
            "stabledrl_L32_peer": part("stabledrl", "peer", 32, *runs)}}

    results = {"card": {"name": "H200"}, "n_gpus": 2, "host": "c", "merged": [], "parts": {}}
    pt.merge(results, record("a", 0.34), "a.json")
    pt.merge(results, record("b", 0.35, 0.33), "b.json")
    peer = results["parts"]["stabledrl_L32_peer"]
    assert [(r["run"], r["host"]) for r in peer["runs"]] == [(0, "a"), (1, "b"), (2, "b")]
    assert peer["finished"] == 3 and peer["figures"]["samples_per_s_per_gpu"] == pytest.approx(0.34)
    assert peer["spread"]["samples_per_s_per_gpu"] == (0.33, 0.35)
    assert "; a machine" not in pt.header(results)  # no run names its machine: the header claims none
    peer["runs"][1]["machine"] = peer["runs"][2]["machine"] = {"boot_id": "b"}
    assert "; one machine (boot id and GPU UUIDs), and 1 run of a record that kept no machine id" in pt.header(
        {**results, "card": {"name": "H200", "count": 2}})


def test_merged_runs_keep_the_matmul_rate_of_their_own_machine():
    roof = {"flops": {"generate": 6e12, "score": 1e12, "learner_score": 0.0, "train": 4e12},
            "seconds": {"generate": 10.0, "score": 2.0, "learner": 6.0, "optimizer": 2.0}, "gpu_s": 25.0,
            "samples": 20}
    earlier = {"card": {"name": "H200"}, "n_gpus": 2, "host": "a", "matmul_tflops": 1.0, "parts": {
        "stabledrl_L8_colocated": part("stabledrl", "colocated", 8, run(1.1, roofline=roof))}}
    results = {"card": {"name": "H200"}, "n_gpus": 2, "host": "b", "matmul_tflops": 2.0, "merged": [], "parts": {}}
    pt.merge(results, earlier, "a.json")
    results["parts"]["stabledrl_L8_colocated"]["runs"].append({**run(1.1, roofline=roof), "matmul_tflops": 2.0})
    (row,) = pt.table_rows(results)
    # generation at 0.6 TFLOP/s: 60% of the first machine's rate, 30% of the second's; the median of the two
    assert row["roofline"]["generate_of_matmul"] == pytest.approx(0.45)
    assert "matmul rate 1 and 2 TFLOP/s (each run against its own machine)" in pt.header(results)


def test_each_pair_runs_its_releases_estimator_and_a_config_that_does_not_validate_never_starts(tmp_path):
    from stabledrl.common.config.job import load_job_config

    (tmp_path / "train.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    assert run_peers.PAIR_SETS["d1"] == ["estimator.masks=per_iteration", "task.long_prompts=keep_last"]
    spec = run_peers.pair_spec("d1", 1)
    # d1's own estimator: either the build has per-iteration masks, or the dry run says which field it refuses
    why = run_peers.dry_run("d1", spec, run_peers.VARIANTS["colocated"], tmp_path)
    assert why is None or ("masks" in why and "per_iteration" in why), why
    assert run_peers.dry_run("stabledrl", run_peers.pair_spec("stabledrl", 1), run_peers.VARIANTS["colocated"],
                             tmp_path) is None
    bad = run_peers.dry_run("stabledrl", run_peers.pair_spec("stabledrl", 1), ["sampler.steps=7"], tmp_path)
    assert bad.startswith("the config does not validate") and "steps" in bad
    cfg = load_job_config(str(run_peers.project_config(spec["recipe"], tmp_path, "d1")),
                          [f"task.source.path={tmp_path / 'train.jsonl'}", "task.long_prompts=keep_last"])
    assert cfg.task.max_prompt_tokens == 200 and cfg.task.long_prompts == "keep_last"  # d1's truncation
    # a cycle of half the StableDRL release's rounds: 2 accumulation rounds there, 2 groups a GPU here
    half = run_peers.pair_spec("stabledrl", 1, round_scale=0.5)
    assert half["groups"] == 2 and half["peer_sets"] == ["training_args.grad_accumulation=2"]


def test_a_loop_on_the_gpus_reads_its_layout_and_roofline_with_the_steps_groups(tmp_path):
    """On GPUs a loop trains fewer groups a step than the recipe's 8 ranks (bench_system gives the job its
    ranks): the layout is read without validating, the roofline's config with the job's ranks."""
    from stabledrl.common.config.job import load_job_config

    for pair in ("stabledrl", "d1"):
        spec = run_peers.pair_spec(pair, 1, round_scale=0.5)
        config = run_peers.project_config(spec["recipe"], tmp_path, pair)
        sets = [f"algorithm.groups_per_step={spec['groups']}", *run_peers.PAIR_SETS[pair]]
        assert run_peers.colocated(config, sets, tmp_path)
        assert not run_peers.colocated(config, sets + run_peers.VARIANTS["apart"], tmp_path)
        cfg = load_job_config(str(config), [f"task.source.path={tmp_path / 'train.jsonl'}", *sets,
                                            "learner.num_ranks=1", "rollout.num_workers=1"])
        totals = {"samples": 4, "step_s": 2.0, "forward_rows": 32, "forward_tokens": 512, "prompt_tokens": 100}
        shape = {"d": 64, "m": 128, "layers": 2, "vocab": 97}
        job_sets = [*sets, "learner.num_ranks=1", "rollout.num_workers=1"]
        roof = pt.project_roofline({"timed_totals": totals, "actors": {}}, shape, config, job_sets,
                                   tmp_path / "train.jsonl", 1)
        assert roof["samples"] == 4 and cfg.algorithm.groups_per_step == spec["groups"]
        # 4 samples of gen_length positions over 32 row-forwards; the recipe's sampler is the exact one
        assert roof["positions_per_row_forward"] == pytest.approx(4 * cfg.sampler.gen_length / 32)
        assert roof["cached"] is False
        fast = pt.project_roofline({"timed_totals": totals, "actors": {}}, shape, config,
                                   [*job_sets, "sampler.cache=dual", "sampler.threshold=0.9", "sampler.compile=false"],
                                   tmp_path / "train.jsonl", 1)
        assert fast["cached"] is True and fast["flops"]["generate"] is None  # no attention pairs counted
        one = {"rc": 0, "stopped": False, "figures": {"samples_per_s_per_gpu": 1.0, "roofline": {
            **fast, "flops": {**fast["flops"], "generate": 1e12}, "seconds": {"generate": 1.0}, "gpu_s": 2.0}}}
        assert pt.roofline_of({"runs": [one]}, 1.0).get("ceiling_samples_per_s_per_gpu") is None  # the release's
        one["figures"]["roofline"]["cached"] = False  # only: the same figures at its sampler have one
        assert pt.roofline_of({"runs": [one]}, 1.0)["ceiling_samples_per_s_per_gpu"] > 0
        if pair == "d1":  # 2 micro-batches on the one rank: each meets 6 of its 12 masks, old policy and reference
            assert roof["flops"]["learner_score"] == pytest.approx((6 + 6) * roof["flops"]["score"])


def test_the_depth_budget_suites_fit_one_command_each():
    for name in ("depth-budget-stabledrl", "depth-budget-d1"):
        a = run_peers.parse(["--peer-root", "/x", "--out", "/y", "--suite", name])
        assert a.runs == 1 and a.part_timeout_s <= 360 and a.layer_list
    a = run_peers.parse(["--peer-root", "/x", "--out", "/y", "--suite", "depth-budget-stabledrl"])
    assert a.layer_list == [24] and a.loops.startswith("release_sampler") and a.project_skip + a.cycles >= 5
    a = run_peers.parse(["--peer-root", "/x", "--out", "/y", "--suite", "depth-budget-d1", "--part-timeout-s", "900"])
    assert a.part_timeout_s == 900 and a.layer_list == [32]  # the command line wins (a CPU rehearsal's timeouts)


def test_d1_pair_alternates_its_runs_and_records_the_depth_card_and_host(tmp_path):
    """The driver's d1 path: the fake peer as d1's harness (its CPU arguments, 2 rounds of mu = 12 over
    12 rows a rank), run twice, then once more by a second command that merges the first's record (a
    protocol spread over commands): the runs are numbered on, and every run records its layer count,
    card, host, machine and overrides."""
    import warm_workers  # tests/helpers, on the path (tests/conftest.py)

    # the runner and what it starts forked from the warm process
    python, env = warm_workers.python(dict(FAKE_PEER_MU="12", FAKE_PEER_ROWS="12", FAKE_PEER_GEN_S="0.05",
                                           FAKE_PEER_TRAIN_S="0.01"))

    def run(out: str, *more: str) -> dict:
        done = subprocess.run(
            [python, str(HERE / "run_peers.py"), "--tiny", "--pairs", "d1", "--loops", "peer", "--cycles",
             "1", "--peer-root", str(tmp_path / "none"), "--peer-script", f"d1={HERE / 'fake_peer.py'}",
             "--part-timeout-s", "60", "--out", str(tmp_path / out), *more],
            cwd=REPO, capture_output=True, text=True, timeout=180, env=env)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        return json.loads((tmp_path / out / "results.json").read_text())

    first = run("first", "--runs", "2")
    assert [r["run"] for r in first["parts"]["d1_L2_peer"]["runs"]] == [0, 1]
    results = run("out", "--runs", "1", "--merge", str(tmp_path / "first" / "results.json"))
    assert results["merged"][0]["machine"] == results["machine"] and results["machine"]["boot_id"]
    assert results["host"] and results["matmul_tflops"] > 0
    layers = results["parts"]["d1_L2_checkpoint"]["layers"]
    assert layers == 2  # the tiny preset's: stated, never null
    peer = results["parts"]["d1_L2_peer"]
    assert [r["run"] for r in peer["runs"]] == [0, 1, 2] and peer["finished"] == 3
    for r in peer["runs"]:
        assert r["layers"] == 2 and r["host"] == results["host"] and r["card"] == {"name": "cpu", "count": 0}
        assert r["machine"] == results["machine"]
        assert r["overrides"][0] == "steps=24" and "max_completion_length=64" in r["overrides"]
        f = r["figures"]
        assert (f["steps"], f["skip"], f["samples"], f["tokens"]) == (24, 12, 12, 12 * 256)
        assert r["figures"]["roofline"]["flops"]["generate"] > 0
    table = (tmp_path / "out" / "table.md").read_text()
    assert "| d1 release (peer) | 2 | 3 of 3 |" in table and "host " in table and "; one machine" in table


def test_a_datasets_that_does_not_import_is_marked_absent_for_the_release(tmp_path, monkeypatch):
    """The release's pinned datasets on a machine without its dependencies: accelerate's data loader
    would import it and fail, so the StableDRL harness marks it absent (find_spec answers None)."""
    import importlib.util

    import peer_stabledrl

    (tmp_path / "datasets").mkdir()
    (tmp_path / "datasets" / "__init__.py").write_text("import a_dependency_this_machine_lacks\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "datasets", None)  # the test's way out: the entry as it was before
    del sys.modules["datasets"]
    assert importlib.util.find_spec("datasets") is not None
    peer_stabledrl.datasets_or_absent()
    assert sys.modules["datasets"] is None and importlib.util.find_spec("datasets") is None
