"""The sampler's fast paths on CUDA (small shapes, seconds; fp32, where kernels of different shapes
round alike): the block-diffusion in-block step without a mask (flash-eligible sdpa with GQA on
bf16; math kernel here) and the graphed in-block step give the reference path's tokens; threshold
decoding under the dual cache refreshes once per block.

    .venv/bin/python -m pytest -q tests/gpu/test_sampler_fast_paths_gpu.py    # on the GPU machine
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import benchlib as bl  # noqa: E402
from stabledrl.common.config.sampler import SamplerConfig  # noqa: E402
from stabledrl.rollout.sampling import generate  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
CUDA = torch.device("cuda", 0)
SHAPE = dict(vocab_size=512, hidden_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=256)
SAME = [torch.arange(10, 18), torch.arange(30, 38), torch.arange(50, 58), torch.arange(70, 78)]


def sdar(dtype=torch.float32):
    return bl.build_policy("tiny-sdar", CUDA, dtype, block_size=4, **SHAPE)


@pytest.mark.parametrize("kw", [dict(steps=32), dict(steps=16), dict(steps=32, temperature=0.0)])
def test_mask_free_in_block_steps_give_the_reference_tokens(kw):
    policy = sdar()
    c = SamplerConfig(**{**dict(gen_length=32, block_length=None, temperature=0.9, stop_at_eos=False), **kw})
    seeds = torch.arange(len(SAME))
    cached = generate(policy, SAME, seeds, c.model_copy(update={"cache": "prefix"}))
    reference = generate(policy, SAME, seeds, c.model_copy(update={"cache": "none"}))
    assert torch.equal(cached.completion_ids, reference.completion_ids)


def test_graphed_in_block_step_gives_the_reference_tokens():
    from graphed_steps import generate_graphed

    policy = sdar()
    c = SamplerConfig(gen_length=32, block_length=None, steps=32, temperature=0.9, stop_at_eos=False)
    seeds = torch.arange(len(SAME))
    graphed, replays = generate_graphed(policy, SAME, seeds, c, capture=True)
    reference = generate(policy, SAME, seeds, c.model_copy(update={"cache": "none"}))
    assert replays == 8 * 3 + 7  # every step after the prefill: 3 in-block steps a block, 7 entering steps
    assert torch.equal(graphed.completion_ids, reference.completion_ids)


def test_threshold_dual_cache_refreshes_once_per_block_on_cuda():
    policy = bl.build_policy("tiny-llada", CUDA, torch.bfloat16, **{**SHAPE, "num_key_value_heads": 4})
    prompts = [torch.arange(10, 10 + n) for n in (5, 8, 3, 8)]
    lengths: list[int] = []
    hook = policy.model.register_forward_pre_hook(lambda m, a, kw: lengths.append(kw["input_ids"].shape[1]),
                                                  with_kwargs=True)
    try:
        out = generate(policy, prompts, torch.arange(4), SamplerConfig(gen_length=64, block_length=16, steps=64,
                       threshold=0.003, temperature=0.9, cache="dual", stop_at_eos=False))
    finally:
        hook.remove()
    assert sum(n == 8 + 64 for n in lengths) == 4 and len(lengths) == out.num_forwards
