"""The system benchmark's plan (tests/benchmarks/run_system.py) without running a part: 4 GPUs run
the component parts in lanes and the jobs on all four with 3 learner ranks; 2 GPUs run every part
one after another, the jobs with 1 learner rank and 1 rollout worker, a full-parameter job on the
family's width with fewer layers and lora_llada on all of them."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_system import DEFAULT_PARTS, DEFAULT_PARTS_2GPU, SHORT_LAYERS, plan  # noqa: E402


def arg(part, flag: str) -> str:
    return part.args[part.args.index(flag) + 1]


def test_four_gpus_lane_the_components_and_give_the_jobs_three_learner_ranks(tmp_path):
    parts = DEFAULT_PARTS.split(",")
    assert parts[parts.index("system_llada") + 1] == "lora_llada"
    lanes, after = plan(parts, False, tmp_path, tmp_path / "records", 4)
    assert [[p.name for p in lane] for lane in lanes] == [["ckpt_llada", "ckpt_sdar"], ["matmul", "engine_llada"],
                                                          ["push"]]
    jobs = {p.name: p for p in after}
    assert list(jobs)[:2] == ["system_llada", "lora_llada"]
    for job in jobs.values():
        assert job.gpus == [0, 1, 2, 3] and arg(job, "--ranks") == "3" and arg(job, "--workers") == "1"
    lora = jobs["lora_llada"]
    assert "--set=learner.lora.rank=128" in lora.args and "--set=learner.lora.alpha=64" in lora.args
    assert arg(lora, "--steps") == "2" and arg(lora, "--model-dir") == arg(jobs["system_llada"], "--model-dir")


def test_two_gpus_run_one_part_at_a_time_and_a_full_parameter_job_takes_fewer_layers(tmp_path):
    lanes, chosen = plan(DEFAULT_PARTS_2GPU.split(","), False, tmp_path, tmp_path / "records", 2)
    assert lanes == []
    parts = {p.name: p for p in chosen}
    assert all(set(p.gpus) <= {0, 1} and p.gpus for p in chosen)
    short, full = parts["ckpt_llada_short"], parts["ckpt_llada"]
    assert arg(short, "--layers") == str(SHORT_LAYERS["llada"]) == "11" and "--layers" not in full.args
    system, lora = parts["system_llada"], parts["lora_llada"]
    for job in (system, lora, parts["system_trado"]):
        assert job.gpus == [0, 1] and arg(job, "--ranks") == "1" and arg(job, "--workers") == "1"
    assert arg(system, "--model-dir") == arg(short, "--dir") and system.after == ("ckpt_llada_short",)
    assert arg(lora, "--model-dir") == arg(full, "--dir") and lora.after == ("ckpt_llada",)
    assert arg(parts["system_trado"], "--model-dir") == arg(parts["ckpt_sdar_short"], "--dir")
    assert [p.name for p in chosen].index("system_llada") < [p.name for p in chosen].index("lora_llada")


def test_the_tiny_rehearsal_of_the_two_gpu_plan_runs_on_the_cpu_with_one_layer(tmp_path):
    lanes, chosen = plan(["ckpt_llada_short", "system_llada", "lora_llada"], True, tmp_path, tmp_path, 2,
                         devices=False)
    short, system, lora = chosen
    assert lanes == [] and all(p.gpus == [] for p in chosen) and arg(short, "--layers") == "1"
    assert (
        "--tiny" in system.args and arg(system, "--ranks") == "1" and arg(system, "--model-dir") == arg(short, "--dir")
    )
    assert arg(lora, "--model-dir") != arg(short, "--dir")


def test_eight_gpus_run_the_one_node_configs_as_shipped(tmp_path):
    lanes, after = plan(DEFAULT_PARTS.split(","), False, tmp_path, tmp_path / "records", 8)
    assert [p.name for lane in lanes for p in lane] == ["ckpt_llada", "ckpt_sdar", "matmul", "engine_llada", "push"]
    for job in after:
        assert job.gpus == list(range(8)) and "--ranks" not in job.args and "--workers" not in job.args
