"""The whole system on GPUs: learner ranks (DeepSpeed ZeRO-3, bf16, NCCL) and rollout workers (a
full bf16 copy each), weights pushed after every step, η = 1: by NCCL broadcast, or as ``auto``
chooses on one host (every worker pulls the ranks' partitions over peer).

    python -m pytest -q -m gpu tests/gpu/test_system_gpu.py      # 2 GPUs: 1 rank + 1 worker
                                                                 # 4 GPUs: also 2 ranks + 2 workers
Checks: every step trains on samples within η; after the last push every worker holds exactly
rank 0's weights (bit for bit, bf16) under the final version; the learner ran in bf16 on CUDA;
``auto``: the job's log names the transport chosen and the workers' clocks show their pulls.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from stabledrl.common.config.base import validate  # noqa: E402
from stabledrl.common.config.job import JobConfig  # noqa: E402
from stabledrl.coordinator.driver import Driver  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
import harness  # noqa: E402  (the test workers the e2e tests share)
from harness import InspectedLearner, InspectedRollout  # noqa: E402
from gpu_ray import local_gpu_ray  # noqa: E402

pytestmark = pytest.mark.gpu


def job_config(output_dir, ranks: int, workers: int, backend: str = "nccl", lora: bool = False) -> JobConfig:
    gpu = {"num_cpus": 1, "num_gpus": 1}
    # LoRA: the ranks push their partitions of the adapters, each worker holds them unmerged
    adapters = {"rank": 8, "alpha": 16.0, "target_modules": ["q_proj", "up_proj"], "push": "adapters"}
    return validate(
        JobConfig,
        {
            "model": {
                "preset": "tiny-llada",
                "dtype": "bfloat16",
                "preset_shape": {
                    "hidden_size": 512,
                    "intermediate_size": 1408,
                    "num_hidden_layers": 4,
                    "num_attention_heads": 8,
                    "num_key_value_heads": 8,
                },
            },
            "task": {"name": "arithmetic", "held_out": 32, "source": {"kind": "generated", "n": 2000},
                     # LoRA: a reward with spread on a random model, so the adapters train away from B = 0
                     **({"reward": {"custom": harness.REWARD, "isolation": "inline", "format_weight": 0.0}}
                        if lora else {})},
            "sampler": {"gen_length": 8, "block_length": 8, "steps": 8, "temperature": 1.0},
            "estimator": {"name": "block_random", "block_length": 8, "num_draws": 2},
            "loss": {"name": "stabledrl"},
            "algorithm": {"group_size": 8, "groups_per_step": 4, "inner_iterations": 2, "max_staleness": 1},
            "rollout": {
                "num_workers": workers,
                "prompts_per_request": 2,
                "requests_per_worker": 1,
                "request_timeout_s": 300,
            },
            "learner": {
                "num_ranks": ranks,
                "dist_timeout_s": 300,
                "optimizer": {"lr": 1e-2 if lora else 1e-4},  # LoRA: adapters that move the policy
                "deepspeed": {"zero_stage": 3, "dtype": "bf16", "param_persistence_threshold": 0},
                **({"lora": adapters} if lora else {}),
            },
            "cluster": {"learner": gpu, "rollout": gpu, "start_timeout_s": 600},
            "weights": {"backend": backend, "timeout_s": 300, "bucket_mb": 1},  # 1 MiB: several buckets per push
            "eval": {"num_prompts": 32},
            "run": {
                "steps": 4,
                "seed": 0,
                "output_dir": str(output_dir),
                "progress": False,
                "tensorboard": False,
                "save_final_checkpoint": False,
            },
        },
    )


@pytest.fixture(scope="module")
def gpu_cluster():
    with local_gpu_ray(2, sys.modules[__name__], harness) as gpus:
        yield gpus


@pytest.mark.parametrize("ranks, workers, backend, lora", [(1, 1, "nccl", False), (2, 2, "nccl", False),
                                                           (1, 1, "auto", False), (2, 2, "auto", False),
                                                           (2, 1, "auto", True)], ids=str)
def test_system_run(gpu_cluster, tmp_path, ranks, workers, backend, lora, job_log):
    if gpu_cluster < ranks + workers:
        pytest.skip(f"needs {ranks + workers} GPUs")
    cfg = job_config(tmp_path, ranks, workers, backend, lora)
    lines = job_log
    driver = Driver(cfg, rollout_cls=InspectedRollout, learner_cls=InspectedLearner, record_batches=True)
    driver.setup()
    try:
        assert driver.actors.info["learners"][0]["dtype"] == "torch.bfloat16"
        assert driver.actors.info["rollouts"][0]["device"].startswith("cuda")
        driver.train()
        driver.drain()
        # LoRA: the plain policy with the adapters merged (its frozen weights are the workers'), and the
        # adapters the ranks push (what the workers put together and hold unmerged)
        learner = ray.get([(a.exported if lora else a.weights).remote() for a in driver.actors.learners],
                          timeout=300)[0]
        pushed = ray.get([a.weights.remote() for a in driver.actors.learners], timeout=300)[0] if lora else {}
        held = ray.get([w.weights.remote() for w in driver.active_rollouts()], timeout=300)
    finally:
        driver.close()
    steps = cfg.run.steps
    for s, batch in enumerate(driver.batches):
        assert all(s - x.policy_version <= 1 for e in batch for x in e.group.samples)
    assert driver.snapshot().worker_versions == [steps] * workers
    adapted = {n.rsplit(".", 1)[0] + ".weight" for n in pushed}  # merged in the export, frozen on the workers
    for version, weights in held:
        assert version == steps
        assert weights.keys() == (learner.keys() | pushed.keys())
        expected = {**{n: t for n, t in learner.items() if n not in adapted}, **pushed}
        assert all(torch.equal(weights[n], expected[n].cpu()) for n in expected), \
            [n for n in expected if not torch.equal(weights[n], expected[n].cpu())]
    if lora:  # what the ranks push is the adapters, trained away from B = 0: the merged matrices moved off the base
        assert pushed and all(n.endswith((".lora_A", ".lora_B")) for n in pushed), sorted(pushed)
        assert any(t.abs().max() > 0 for n, t in pushed.items() if n.endswith(".lora_B"))
    chosen = [line for line in lines if line.startswith("weights: the push group")]
    pulled = [r for r in driver.history if any(k.endswith("/push_stage_map") for k in r)]
    if backend == "auto":  # one host (a local Ray node): the workers pull the ZeRO-3 partitions
        assert chosen == [f"weights: the push group of rollout workers {list(range(workers))} is built over peer "
                          "(auto: every learner rank and rollout worker runs on one host)"], lines
        assert pulled, "the workers' clocks show their pulls (push_stage_map)"
    else:
        assert not chosen and not pulled
    print("\nstep times (s):", [round(r["time/step"], 3) for r in driver.history],
          "push (s):", [round(r["time/weight_push"], 3) for r in driver.history])
