"""A DiffusionGemma job validates with the uniform-noise estimator and is refused, naming the field,
with one that writes [MASK] (and the reverse); the sampler layout is its canvas length."""
from __future__ import annotations

import pytest

from stabledrl.common.config.base import ConfigError, validate
from stabledrl.common.config.job import JobConfig
from stabledrl.common.models.job_check import check_sampler_layout

GEMMA = {
    "model": {"preset": "tiny-diffusion-gemma"},
    "task": {"name": "arithmetic", "held_out": 0},
    "sampler": {"gen_length": 8, "block_length": None, "steps": 4},
    "estimator": {"name": "uniform_staircase"},
    "loss": {"name": "stabledrl"},
    "algorithm": {"group_size": 4, "groups_per_step": 2},
    "learner": {"num_ranks": 1},
}


def job(**sections) -> JobConfig:
    return validate(JobConfig, {**GEMMA, **sections})


def test_a_diffusion_gemma_job_validates_with_the_uniform_estimator():
    cfg = job()
    assert cfg.estimator.name == "uniform_staircase" and cfg.estimator.objective == "elbo"
    check_sampler_layout(cfg)  # block 4 = the tiny preset's canvas length, read without model.block_size
    with pytest.raises(ConfigError, match="sampler"):
        check_sampler_layout(job(sampler={"gen_length": 16, "block_length": 8, "steps": 4}))
    # learner.compile fuses the Llama / Qwen classes' norms and activation: refused before any actor starts
    with pytest.raises(ConfigError, match=r"learner.compile: DiffusionGemma.*learner.compile=false"):
        check_sampler_layout(job(learner={"num_ranks": 1, "compile": True}))


@pytest.mark.parametrize(
    "sections, message",
    [
        ({"estimator": {"name": "staircase"}}, r"estimator.name 'staircase' corrupts with the \[MASK\] token"),
        ({"estimator": {"name": "mean_field"}}, r"estimator.name 'mean_field' corrupts with the \[MASK\] token"),
        (
            {"model": {"preset": "tiny-sdar", "block_size": 4}},
            r"estimator.name 'uniform_staircase' scores uniform-noise canvases",
        ),
        ({"loss": {"name": "grpo", "level": "token"}}, r"loss.level 'token' needs per-token values"),
    ],
)
def test_combinations_that_do_not_work_are_refused_naming_the_field(sections, message):
    with pytest.raises(ConfigError, match=message):
        job(**sections)
