"""Block-diffusion jobs end to end on real Ray actors and DeepSpeed: 1 learner rank, 1 rollout worker,
2 steps on a tiny preset of each block family:
- SDAR / TraDo ([MASK] noise): the block sampler with the exact cache and ``cuda_graph`` on (its
  uncaptured static path on a CPU), scored by ``staircase``;
- DiffusionGemma (uniform noise): the uniform-noise sampler, scored by ``uniform_staircase``.
The learner's weights change, the worker ends on the learner's exact weights under the last version,
and with shared masks / corruption at η = 0 the first step's log-ratios are 0 (the behaviour estimate
the worker shipped is the learner's own estimate under the same weights)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from stabledrl.common.config.base import validate  # noqa: E402
from stabledrl.common.config.job import JobConfig  # noqa: E402
from stabledrl.common.models import load_policy  # noqa: E402
from harness import run_driver  # noqa: E402

pytestmark = pytest.mark.e2e
REWARD = f"{Path(__file__).with_name('rewards.py')}:digit_fraction"


FAMILIES = {  # preset: (estimator, sampler extras, policy noise)
    "tiny-sdar": ("staircase", {"cuda_graph": True}, "mask"),
    "tiny-diffusion-gemma": ("uniform_staircase", {}, "uniform"),
}


def block_job(output_dir: Path, preset: str) -> JobConfig:
    estimator, sampler, _ = FAMILIES[preset]
    return validate(JobConfig, {
        "model": {"preset": preset},
        "task": {"name": "arithmetic", "held_out": 0, "source": {"kind": "generated", "n": 64},
                 "reward": {"custom": REWARD, "isolation": "inline", "format_weight": 0.0}},
        "sampler": {"gen_length": 8, "block_length": None, "steps": 4, "temperature": 1.0, **sampler},
        "estimator": {"name": estimator, "num_draws": 1, "masks": "shared"},
        "loss": {"name": "stabledrl"},
        "algorithm": {"group_size": 4, "groups_per_step": 2, "inner_iterations": 1, "micro_batch_size": 8,
                      "max_staleness": 0},
        "rollout": {"num_workers": 1, "prompts_per_request": 2, "request_timeout_s": 180},
        "learner": {"num_ranks": 1, "dist_timeout_s": 120, "optimizer": {"lr": 1e-2}, "deepspeed": {"zero_stage": 2}},
        "cluster": {"learner": {"num_cpus": 0.5}, "rollout": {"num_cpus": 0.5}, "start_timeout_s": 240},
        "weights": {"timeout_s": 120},
        "run": {"steps": 2, "seed": 5, "output_dir": str(output_dir), "progress": False, "tensorboard": False,
                "save_final_checkpoint": False, "export_final": False},
    })


RAY_CPUS = 2  # the logical CPUs of its Ray instance (tests/e2e/conftest.py)


@pytest.mark.parametrize("preset", list(FAMILIES))
def test_a_block_diffusion_job_trains_and_pushes_its_weights(cluster, tmp_path, preset):
    if preset == "tiny-diffusion-gemma":
        pytest.importorskip("transformers.models.diffusion_gemma")
    estimator, _, noise = FAMILIES[preset]
    cfg = block_job(tmp_path, preset)
    driver, learner, workers = run_driver(cfg, workers=True)
    initial, _ = load_policy(cfg.model)
    assert initial.spec.noise == noise
    assert any(not torch.equal(learner[n], p) for n, p in initial.named_parameters())  # the learner moved
    assert driver.snapshot().worker_versions == [cfg.run.steps]
    (version, weights), = workers
    assert version == cfg.run.steps and all(torch.equal(weights[n], learner[n]) for n in learner)
    samples = [x for e in driver.batches[0] for x in e.group.samples]
    assert {x.estimator for x in samples} == {estimator} and {x.policy_version for x in samples} == {0}
    assert all(x.behaviour_logp < 0 for x in samples)  # an ELBO of a random model: a real, negative bound
    first = driver.history[0]
    assert abs(first["train/log_ratio/max"]) < 1e-5 and abs(first["train/log_ratio/min"]) < 1e-5
    assert [r["version"] for r in driver.history] == [1, 2]
