"""The benchmark runner's schedule: one GPU runs one lane and skips the jobs that need two; --only
keeps the named jobs (and the matmul denominators); --quick gives each job its short arguments."""
from __future__ import annotations

import sys

import pytest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_all import QUICK, device_list, plan, select  # noqa: E402


def test_one_gpu_runs_one_lane_and_skips_the_two_gpu_jobs(tmp_path):
    lanes, after, skipped = select(*plan(1, False, tmp_path, quick=True), "block_diffusion,learner_1gpu")
    assert [[j.name for j in lane] for lane in lanes] == [["matmul_gpu0", "block_diffusion", "learner_1gpu"]]
    assert after == [] and all(j.gpus == [0] for j in lanes[0])
    assert skipped == {"push": "needs 2 GPUs", "async": "needs 2 GPUs", "learner_2gpu": "needs 2 GPUs",
                       "full_attention": "not in --only", "lora_push": "not in --only", "ipc_push": "not in --only"}
    bd, learner = lanes[0][1], lanes[0][2]
    assert "--quick" in bd.args and bd.timeout_s == QUICK["block_diffusion"][0]
    assert learner.peak_from == "matmul_gpu0"
    stages = learner.args[learner.args.index("--stages") + 1]
    sizes = learner.args[learner.args.index("--micro-batch-groups") + 1]
    assert stages == "2,2t" and sizes == "2,3,4" and "--world" in learner.args


def test_two_gpus_run_two_lanes_then_the_jobs_that_need_both(tmp_path):
    lanes, after, skipped = plan(2, False, tmp_path)
    assert [j.name for j in lanes[0]] == ["matmul_gpu0", "full_attention", "ipc_push"]
    assert [j.name for j in lanes[1]] == ["matmul_gpu1", "block_diffusion", "lora_push", "learner_1gpu"]
    assert [j.name for j in after] == ["push", "async", "learner_2gpu"] and not skipped


def test_a_part_gets_the_devices_its_indices_name_within_the_runners_own():
    """Two runners side by side on one host (CUDA_VISIBLE_DEVICES 0,1 and 2,3) plan their parts on
    [0, 1] each: the second must get devices 2 and 3, not share its neighbour's."""
    assert device_list([0, 1], None) == "0,1"
    assert device_list([0, 1], "") == "0,1"
    assert device_list([0, 1], "2,3") == "2,3"
    assert device_list([1], "4, 6") == "6"
    assert device_list([0], "GPU-5f2e,GPU-77aa") == "GPU-5f2e"
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES=2,3 shows 2"):
        device_list([0, 1, 2], "2,3")


def test_the_quick_run_times_the_same_device_push_at_a_few_layers(tmp_path):
    lanes, _, _ = plan(2, False, tmp_path, quick=True)
    job = next(j for lane in lanes for j in lane if j.name == "ipc_push")
    assert job.args[job.args.index("--layers") + 1] == "4" and job.timeout_s == QUICK["ipc_push"][0]
    full = next(j for lane in plan(2, False, tmp_path)[0] for j in lane if j.name == "ipc_push")
    assert "--layers" not in full.args  # the full run: all of LLaDA-8B's layers
