"""DiffusionGemma's uniform-noise sampler and estimator on CUDA (tiny preset): in float32 the exact
cache gives the reference path's tokens and the shared-corruption ratio is exactly 1; in bfloat16
both run and give finite, bounded values. Run: pytest -q -m gpu tests/gpu/test_uniform_gpu.py"""
from __future__ import annotations

import pytest
import torch

from stabledrl.common.config.estimator import UniformStaircaseConfig
from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.estimators import estimate
from stabledrl.common.models import build_tiny_policy
from stabledrl.common.types import SequenceBatch, left_pad
from stabledrl.rollout.sampling import generate

pytest.importorskip("transformers.models.diffusion_gemma")
pytestmark = pytest.mark.gpu
PROMPTS = [torch.tensor([5, 6, 7, 8, 9]), torch.tensor([10, 11]), torch.tensor([12, 13, 14, 15, 16, 17, 18, 19])]
SEEDS = torch.tensor([11, 22, 33])


def check_on(device: str, dtype: torch.dtype) -> None:
    policy = build_tiny_policy("diffusion_gemma", block_size=4, sliding_window=5, seed=1, dtype=dtype).to(device)
    cfg = SamplerConfig(gen_length=16, block_length=None, steps=8, temperature=0.9, stop_at_eos=False)
    cached = generate(policy, PROMPTS, SEEDS, cfg)
    reference = generate(policy, PROMPTS, SEEDS, cfg.model_copy(update={"cache": "none"}))
    assert cached.completion_ids.device.type == torch.device(device).type
    if dtype == torch.float32:
        assert torch.equal(cached.completion_ids, reference.completion_ids)
        assert torch.equal(cached.decode_step, reference.decode_step)
    ids, pm = left_pad(PROMPTS, pad_id=policy.pad_token_id)
    batch = SequenceBatch(input_ids=torch.cat([ids, cached.completion_ids.cpu()], 1), prompt_mask=pm,
                          completion_mask=torch.ones(3, 16, dtype=torch.bool))
    est = UniformStaircaseConfig(num_draws=2)
    with torch.no_grad():
        a = estimate(policy, batch, SEEDS, est).sequence
    b = estimate(policy, batch, SEEDS, est).sequence.detach()
    assert torch.isfinite(a).all() and (a < 0).all()
    if dtype == torch.float32:
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_uniform_sampler_and_estimator_on_cuda(dtype):
    check_on("cuda", dtype)
