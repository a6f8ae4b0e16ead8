"""learner.deepspeed's CPU offload: named, validated fields that reach DeepSpeed's config."""
from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from stabledrl.common.config.learner import DeepSpeedConfig, OptimizerConfig
from stabledrl.learner.zero import deepspeed_config


def test_offload_reaches_the_deepspeed_config():
    cfg = DeepSpeedConfig(zero_stage=3, offload_optimizer="cpu", offload_params="cpu", offload_pin_memory=False)
    zero = deepspeed_config(cfg, OptimizerConfig(), torch.bfloat16, 1)["zero_optimization"]
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": False}
    assert zero["offload_param"] == {"device": "cpu", "pin_memory": False}
    plain = deepspeed_config(DeepSpeedConfig(zero_stage=2), OptimizerConfig(), torch.bfloat16, 1)["zero_optimization"]
    assert "offload_optimizer" not in plain and "offload_param" not in plain
    two = deepspeed_config(DeepSpeedConfig(zero_stage=2, offload_optimizer="cpu"), OptimizerConfig(), torch.float32, 1)
    assert two["zero_optimization"]["offload_optimizer"]["device"] == "cpu" and not two["zero_force_ds_cpu_optimizer"]


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            {"zero_stage": 2, "offload_optimizer": "cpu", "offload_params": "cpu"},
            "offload_params: parameter offload needs zero_stage 3",
        ),
        ({"zero_stage": 3, "offload_params": "cpu"}, "offload_params: cpu needs offload_optimizer: cpu"),
        ({"offload_optimizer": "nvme"}, "offload_optimizer"),
    ],
)
def test_an_offload_the_learner_cannot_run_fails_naming_the_field(fields, message):
    with pytest.raises(ValidationError, match=message):
        DeepSpeedConfig(**fields)
