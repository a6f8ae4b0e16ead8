"""The static-shape in-block step of graphed_steps.py (run without capture on the CPU) gives
exactly the reference path's tokens: the graph only replays what this path computes."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib as bl  # noqa: E402
from graphed_steps import generate_graphed  # noqa: E402

from common.config.sampler import SamplerConfig  # noqa: E402
from rollout.sampling import generate  # noqa: E402

torch.set_num_threads(1)
SAME = [torch.arange(5, 11), torch.arange(20, 26), torch.arange(40, 46)]
MIXED = [torch.arange(5, 10), torch.arange(20, 22), torch.arange(40, 48)]


@pytest.fixture(scope="module")
def sdar():
    return bl.build_policy("tiny-sdar", torch.device("cpu"), torch.float32, block_size=4)


@pytest.mark.parametrize("prompts", [SAME, MIXED], ids=["unpadded", "padded"])
@pytest.mark.parametrize("kw", [dict(steps=16), dict(steps=8), dict(steps=16, temperature=0.0),
                                dict(steps=16, threshold=0.02)])
def test_static_in_block_step_gives_the_reference_tokens(sdar, prompts, kw):
    c = SamplerConfig(**{**dict(gen_length=16, block_length=None, temperature=0.9, stop_at_eos=False), **kw})
    seeds = torch.tensor([3, 4, 5])
    got, replays = generate_graphed(sdar, prompts, seeds, c, capture=False)
    ref = generate(sdar, prompts, seeds, c.model_copy(update={"cache": "none"}))
    assert torch.equal(got.completion_ids, ref.completion_ids)
    assert torch.equal(got.decode_step, ref.decode_step)
    assert replays == 0  # no capture on a CPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_captured_graph_gives_the_eager_static_tokens_in_fp32():
    policy = bl.build_policy("tiny-sdar", torch.device("cuda"), torch.float32, block_size=4)
    c = SamplerConfig(gen_length=32, block_length=None, steps=32, temperature=0.9, stop_at_eos=False)
    seeds = torch.tensor([3, 4, 5])
    eager, _ = generate_graphed(policy, SAME, seeds, c, capture=False)
    graphed, replays = generate_graphed(policy, SAME, seeds, c, capture=True)
    assert replays == 8 * 3  # every in-block step (the first is captured, then replayed)
    assert torch.equal(graphed.completion_ids, eager.completion_ids)


@pytest.mark.parametrize("family", ["tiny-llada", "tiny-qwen2"])
@pytest.mark.parametrize("kw", [dict(steps=16), dict(steps=32, threshold=0.012), dict(steps=16, temperature=0.0)])
def test_static_dual_step_gives_the_dual_cache_tokens(family, kw):
    from graphed_steps import generate_graphed_dual

    policy = bl.build_policy(family, torch.device("cpu"), torch.float32)
    c = SamplerConfig(**{**dict(gen_length=32, block_length=8, temperature=0.9, stop_at_eos=False, cache="dual"), **kw})
    seeds = torch.tensor([3, 4, 5])
    got, _ = generate_graphed_dual(policy, MIXED, seeds, c, capture=False)
    ref = generate(policy, MIXED, seeds, c)
    assert torch.equal(got.completion_ids, ref.completion_ids)
    assert torch.equal(got.decode_step, ref.decode_step)
    assert got.num_forwards == ref.num_forwards
