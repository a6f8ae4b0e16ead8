"""The system benchmark's plan (tests/benchmarks/run_system.py) without running a part: 4 GPUs run
the component parts in lanes and the jobs on all four with 3 learner ranks; 2 GPUs run every part
one after another, the jobs with 1 learner rank and 1 rollout worker, a full-parameter job on the
family's width with fewer layers and lora_llada on all of them."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

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


def test_the_checkpoint_measurement_options_reach_the_full_jobs(tmp_path):
    """The before/after of the background checkpoint (BENCHMARKS.md): 6 steps, the save after step
    4, no resume, the writer's reserve set by an override; the short jobs take their own overrides."""
    _, chosen = plan(["ckpt_llada_short", "system_llada", "lora_llada"], False, tmp_path, tmp_path / "records", 2,
                     checkpoint_at=4, steps=6, resume=False, profile=False,
                     job_set=("learner.checkpoint.reserve=false",), short_set=("weights.backend=nccl",))
    parts = {p.name: p for p in chosen}
    system, lora = parts["system_llada"], parts["lora_llada"]
    assert arg(system, "--steps") == "6" and arg(system, "--checkpoint-at") == "4"
    assert "--resume-check" not in system.args and "--profile-step" not in system.args
    assert "--set=learner.checkpoint.reserve=false" in system.args
    assert "--set=learner.checkpoint.reserve=false" not in lora.args and arg(lora, "--steps") == "2"
    assert "--set=weights.backend=nccl" in lora.args and "--set=weights.backend=nccl" not in system.args


def test_the_step_after_the_save_is_compared_with_the_steps_before_it():
    """system_report: the plain steps are the timed ones up to the save (the later ones overlap its
    write); every step after the save gets its ratio, the one right after is the headline."""
    from system_report import analyse

    walls = {1: 60.0, 2: 20.0, 3: 10.0, 4: 12.0, 5: 22.0, 6: 15.0}
    trains = {1: 30.0, 2: 9.0, 3: 8.0, 4: 8.0, 5: 10.0, 6: 9.0}
    records = [{"step": k, "time": 100.0 + 10 * k, "time/step": walls[k], "time/train": trains[k]} for k in walls]
    f = analyse(records, [], skip=2, started_at=0.0, peak_tflops=None, checkpoint_at=4)
    assert f["step_plain_s"] == 11.0 and f["step_plain_steps"] == 2  # steps 3 and 4, not step 6
    assert f["step_after_checkpoint_s"] == 22.0 and f["step_after_checkpoint_ratio"] == 2.0
    assert f["train_after_checkpoint_ratio"] == 1.25
    assert f["step_after_checkpoint_ratios"] == {"5": 2.0, "6": 15.0 / 11.0}
    # no timed step before the save: the other timed steps, as before
    g = analyse(records, [], skip=4, started_at=0.0, peak_tflops=None, checkpoint_at=4)
    assert g["step_plain_steps"] == 1 and g["step_after_checkpoint_ratio"] == 22.0 / 15.0


def test_each_step_keeps_every_actors_push_clocks():
    """A slow push in one step is told apart by its ends: each step's record keeps every actor's
    push clocks of that step (and nothing else of the actors)."""
    from system_report import analyse

    records = [{"step": k, "time": 10.0 * k, "time/step": 10.0, "time/train": 5.0, "time/weight_push": 0.03 * k,
                "time/learner0/push_send": 0.02 * k, "time/learner0/train": 5.0,
                "time/rollout0/push_stage": 0.01 * k, "time/rollout0/generate": 9.0} for k in (1, 2, 3)]
    f = analyse(records, [], skip=1, started_at=0.0, peak_tflops=None)
    assert [s["push_by_actor_s"] for s in f["per_step"]] == [
        {"learner0/push_send": 0.02 * k, "rollout0/push_stage": 0.01 * k} for k in (1, 2, 3)]


def test_the_summary_gives_the_in_job_pushes_spread_beside_its_median():
    """A staged push shares the worker's GPU with its generation, so the summary's push row gives
    the timed steps' range beside the median (the 4-GPU LLaDA-8B record)."""
    import json

    from run_system import summary

    record = Path(__file__).resolve().parent / "results" / "system-llada_llada8b_h200x4.json"
    row = [line for line in summary(json.loads(record.read_text())).splitlines() if "in-job push" in line]
    assert row == ["| system_llada: in-job push / raw broadcast of the same 14.9 GiB | 0.061 s / 0.044 s = 1.4x "
                   "(timed steps 0.056-0.075 s) | <= 1.5x |"]


def test_the_summary_splits_the_in_job_push_into_the_wait_to_join_and_the_transfer():
    """The 4-GPU LLaDA-8B job: nobody waited for the other end (0.000 s on the learner ranks, 0.006 s
    on the worker), so its 0.06 s push is the transfer itself; a record from before those clocks
    gives no such row."""
    import json

    from run_system import summary

    results = Path(__file__).resolve().parent / "results"
    record = json.loads((results / "system-llada_llada8b_h200x4.json").read_text())
    row = [line for line in summary(record).splitlines() if "waiting for the other end" in line]
    assert row == ["| system_llada: of each push, waiting for the other end to join (learner ranks / workers) | "
                   "0.000 s / 0.006 s | - |"]
    older = json.loads((results / "system-all_llada8b_h100x4.json").read_text())
    assert not [line for line in summary(older).splitlines() if "waiting for the other end" in line]


def test_a_reused_checkpoint_still_gives_the_bytes_the_in_job_push_is_set_against(tmp_path):
    """A warm host keeps the checkpoint of an earlier call: its record must still carry the size
    (the summary's push row divides the raw broadcast by it; the 4 x H200 eager run read n/a)."""
    import torch

    from random_checkpoint import write_random_checkpoint

    written = write_random_checkpoint("tiny-llada", tmp_path / "ckpt", device=torch.device("cpu"))
    reused = write_random_checkpoint("tiny-llada", tmp_path / "ckpt", device=torch.device("cpu"))
    assert reused["reused"] is True and "reused" not in written
    assert reused["gib"] == pytest.approx(written["gib"]) and reused["parameters"] == written["parameters"]
