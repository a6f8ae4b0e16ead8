"""sampler.max_tokens_per_forward on CUDA: the rollout engine's peak activation memory follows the
tokens one forward carries (the rows equal one call's on the CPU: tests/unit/rollout/test_rollout_workflow.py;
bf16 kernels may round differently at another batch size).

    python -m pytest -q -m gpu tests/gpu/test_sampler_memory_gpu.py
"""
from __future__ import annotations

import pytest
import torch

from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.models.presets import build_tiny_policy
from stabledrl.rollout.engine import TorchRolloutEngine

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_the_token_bound_lowers_the_peak():
    policy = build_tiny_policy("llada", dtype=torch.bfloat16, vocab_size=8192, hidden_size=512, num_hidden_layers=2,
                               num_attention_heads=8, num_key_value_heads=8, intermediate_size=1408).to("cuda")
    engine = TorchRolloutEngine(policy)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, 8000, (200,), generator=g) for _ in range(64)]
    seeds = torch.arange(64)
    cfg = SamplerConfig(gen_length=64, block_length=32, steps=16, temperature=1.0, max_batch_size=64)
    peaks = []
    for bound in (None, 8 * 264):  # every row in one call, then calls of 8 rows of 200 + 64 tokens
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = engine.generate(prompts, seeds, cfg.model_copy(update={"max_tokens_per_forward": bound}))
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
        assert out.completion_ids.shape == (64, 64)
    assert peaks[1] < 0.5 * peaks[0], peaks  # 8 rows a forward instead of 64
    print("\npeak activation GiB, 64 rows / 8 rows a forward:", [round(p / 2**30, 3) for p in peaks])
