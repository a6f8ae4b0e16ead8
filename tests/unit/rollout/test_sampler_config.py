"""SamplerConfig: defaults are the released rollout settings; every broken rule names its field."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from stabledrl.common.config.base import ConfigError, validate
from stabledrl.common.config.sampler import SamplerConfig


def test_defaults_are_the_released_llada_rollout_settings():
    cfg = SamplerConfig()
    assert (cfg.gen_length, cfg.block_length, cfg.steps, cfg.temperature) == (256, 32, 128, 0.9)
    assert cfg.layout(32) == (32, 8, 16)
    assert cfg.resolved_cache(block_diffusion=False) == "none"
    assert cfg.resolved_cache(block_diffusion=True) == "prefix"


@pytest.mark.parametrize(
    "data,field,words",
    [
        ({"block_length": 48}, "block_length", "must divide gen_length"),
        ({"steps": 100}, "steps", "multiple of the number of blocks"),
        ({"gen_length": 32, "block_length": 8, "steps": 64}, "steps", "exceeds gen_length"),
        ({"remasking": "random", "threshold": 0.9}, "threshold", "low_confidence"),
        ({"threshold": 1.5}, "threshold", "less than or equal to 1"),
        ({"cache": "full"}, "cache", "'auto', 'none', 'prefix' or 'dual'"),
        ({"temperature": -1}, "temperature", "greater than or equal to 0"),
        ({"steps_per_block": 4}, "steps_per_block", "unknown key"),
    ],
)
def test_invalid_settings_name_the_field(data, field, words):
    with pytest.raises(ConfigError) as err:
        validate(SamplerConfig, data, source="rollout.sampler")
    assert f"{field}:" in str(err.value) and words in str(err.value)


def test_assignment_is_rechecked_across_fields():
    cfg = SamplerConfig()
    with pytest.raises(ValidationError, match="block_length=32 must divide gen_length=100"):
        cfg.gen_length = 100


def test_block_length_none_takes_the_policy_block_and_is_checked_then():
    assert SamplerConfig(gen_length=16, block_length=None, steps=8).layout(4, block_diffusion=True) == (4, 4, 2)
    cfg = SamplerConfig(gen_length=16, block_length=None, steps=6)  # cannot be checked without a policy
    with pytest.raises(ConfigError, match="steps=6 must be a multiple of the number of blocks"):
        cfg.layout(4)
    with pytest.raises(ConfigError, match="block_length=5 must divide gen_length=16"):
        cfg.layout(5)


def test_block_diffusion_needs_its_own_block_size_and_no_dual_cache():
    with pytest.raises(ConfigError, match="block_length=32 differs"):
        SamplerConfig().layout(4, block_diffusion=True)
    with pytest.raises(ConfigError, match="dual"):
        SamplerConfig(cache="dual").resolved_cache(block_diffusion=True)


def test_steps_none_means_one_token_per_step():
    assert SamplerConfig(gen_length=64, block_length=16, steps=None).layout(16) == (16, 4, 16)
