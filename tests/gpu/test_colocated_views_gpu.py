"""A colocated job on GPUs whose rollout workers view their learner ranks' parameters (``weights.ipc:
view``, common/transport/views.py), against the copying push (``weights.ipc: copy``): DeepSpeed's
real flat buffers exported through CUDA IPC, ZeRO-2 and ZeRO-3 on one rank (the partition is the
parameter), and, with 2 GPUs, ZeRO-3 over two ranks (each rank all-gathers into one buffer the worker
views).

    python -m pytest -q -m gpu tests/gpu/test_colocated_views_gpu.py     # 1 GPU; 2 GPUs: also the gather

Checks: the job resolved the mode it was meant to; after the last push every worker holds exactly
its rank's weights under the final version; a viewing worker's own allocator holds less than half
the weights' bytes (its copy was freed at the first push: the weights are on the card once), a
copying worker at least the weights' bytes.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from stabledrl.common.config.base import validate  # noqa: E402
from stabledrl.common.config.job import JobConfig  # noqa: E402
from stabledrl.common.transport.plan import PushInputs, plan_push  # noqa: E402
from stabledrl.coordinator.driver import Driver  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
import harness  # noqa: E402  (the test workers the e2e tests share)
from harness import InspectedLearner, InspectedRollout  # noqa: E402
from gpu_ray import local_gpu_ray  # noqa: E402

pytestmark = pytest.mark.gpu


def job_config(output_dir, ranks: int, zero_stage: int, ipc: str) -> JobConfig:
    gpu = {"num_cpus": 1, "num_gpus": 1}
    # ~0.2 GB of bf16 weights: a worker's fixed buffers (cuBLAS keeps a 32 MiB workspace on Hopper) are a small
    # part of it; at 4 layers of width 512 (26 MB) that workspace alone outweighed the weights
    shape = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8, "num_attention_heads": 16,
             "num_key_value_heads": 16}
    return validate(JobConfig, {
        "model": {"preset": "tiny-llada", "dtype": "bfloat16", "preset_shape": shape},
        "task": {"name": "arithmetic", "held_out": 0, "source": {"kind": "generated", "n": 2000},
                 "reward": {"custom": harness.REWARD, "isolation": "inline", "format_weight": 0.0}},
        "sampler": {"gen_length": 8, "block_length": 8, "steps": 8, "temperature": 1.0},
        "estimator": {"name": "block_random", "block_length": 8, "num_draws": 2},
        "loss": {"name": "stabledrl"},
        "algorithm": {"group_size": 8, "groups_per_step": 2 * ranks, "inner_iterations": 2, "max_staleness": 0},
        "rollout": {"num_workers": ranks, "prompts_per_request": 1, "request_timeout_s": 300},
        "learner": {"num_ranks": ranks, "dist_timeout_s": 300, "optimizer": {"lr": 1e-3},
                    "deepspeed": {"zero_stage": zero_stage, "dtype": "bf16", "param_persistence_threshold": 0}},
        "cluster": {"learner": gpu, "rollout": gpu, "colocate": True, "start_timeout_s": 600},
        "weights": {"backend": "auto", "ipc": ipc, "timeout_s": 300},
        "run": {"steps": 3, "seed": 0, "output_dir": str(output_dir), "progress": False, "tensorboard": False,
                "save_final_checkpoint": False, "export_final": False},
    })


@pytest.fixture(scope="module")
def gpu_cluster():
    with local_gpu_ray(1, sys.modules[__name__], harness) as gpus:
        yield gpus


@pytest.mark.parametrize("ranks, zero_stage, ipc", [(1, 2, "auto"), (1, 2, "copy"), (1, 3, "auto"), (2, 3, "auto")],
                         ids=["zero2_view", "zero2_copy", "zero3_one_rank_view", "zero3_two_ranks_view"])
def test_a_viewing_worker_holds_no_copy_and_the_ranks_weights(gpu_cluster, tmp_path, ranks, zero_stage, ipc):
    if gpu_cluster < ranks:
        pytest.skip(f"needs {ranks} GPUs")
    cfg = job_config(tmp_path, ranks, zero_stage, ipc)
    resolved = plan_push(PushInputs.of(cfg)).transport
    assert (resolved.backend, resolved.ipc) == ("ipc", "view" if ipc == "auto" else "copy")
    driver = Driver(cfg, rollout_cls=InspectedRollout, learner_cls=InspectedLearner)
    driver.setup()
    try:
        driver.train()
        driver.drain()
        learner = ray.get([a.weights.remote() for a in driver.actors.learners], timeout=300)[0]
        held = ray.get([w.weights.remote() for w in driver.active_rollouts()], timeout=300)
        memory = ray.get([w.memory.remote() for w in driver.active_rollouts()], timeout=300)
    finally:
        driver.close()
    assert driver.snapshot().worker_versions == [cfg.run.steps] * ranks
    for version, weights in held:
        assert version == cfg.run.steps and weights.keys() == learner.keys()
        assert all(torch.equal(weights[n], learner[n].cpu()) for n in learner), \
            [n for n in learner if not torch.equal(weights[n], learner[n].cpu())]
    for m in memory:
        if resolved.ipc == "view":
            assert m["allocated"] < 0.5 * m["parameters"], m  # a copy of its own would be all of them
        else:
            assert m["allocated"] >= m["parameters"], m
    print("\nworker memory:", memory, "step times (s):", [round(r["time/step"], 3) for r in driver.history])
