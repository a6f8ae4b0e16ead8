"""``SamplerConfig.cuda_graph`` on CUDA: the captured and replayed cached steps give the tokens of
the eager paths (small shapes, seconds). In fp32, where kernels of different shapes round alike,
the graphed block-diffusion sampler equals the reference path without cache; the graphed dual cache
replays the eager dual step's own kernels, so on a prompt width that needs no bucketing and a model
without grouped-query heads it equals the eager dual cache bit for bit, in bf16 too. The engine
captures a shape once and replays it across requests and in-place weight loads.

    python -m pytest -q tests/gpu/test_sampler_graph_gpu.py     # on the GPU machine
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.models import build_tiny_policy
from stabledrl.common.transport.base import WeightHandle
from stabledrl.rollout.engine import TorchRolloutEngine
from stabledrl.rollout.sampling import StepGraphs, generate

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
CUDA = torch.device("cuda", 0)
SHAPE = dict(vocab_size=512, hidden_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=256)
MIXED = [torch.arange(10, 15), torch.arange(30, 32), torch.arange(50, 58), torch.arange(70, 77)]
SEEDS = torch.arange(4)


def sdar(seed: int = 0, dtype=torch.float32):
    return build_tiny_policy("sdar", block_size=4, seed=seed, dtype=dtype, **SHAPE).to(CUDA)


def cfg(**kw) -> SamplerConfig:
    return SamplerConfig(
        **{**dict(gen_length=32, block_length=None, steps=32, temperature=0.9, stop_at_eos=False), **kw}
    )


def same_tokens(a, b) -> bool:
    return torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.decode_step, b.decode_step)


@pytest.mark.parametrize("kw", [dict(), dict(steps=16), dict(temperature=0.0), dict(threshold=0.01)])
def test_captured_in_block_step_gives_the_reference_tokens_in_fp32(kw):
    policy = sdar()
    graphs = StepGraphs()
    graphed = generate(policy, MIXED, SEEDS, cfg(cuda_graph=True, **kw), graphs)
    reference = generate(policy, MIXED, SEEDS, cfg(cache="none", **kw))
    assert same_tokens(graphed, reference) and graphed.num_forwards == reference.num_forwards
    assert graphs.replays == graphs.calls > 0
    if "threshold" not in kw:  # 8 blocks; every step but the prefill is replayed: entering and in-block shapes
        assert graphs.captures == 2 and graphs.replays == 8 * (4 // (32 // kw.get("steps", 32))) - 1
    else:
        assert graphs.captures in (1, 2)


def test_compiled_steps_are_captured_and_follow_the_reference_in_fp32():
    """``compile``: both static steps compiled, then captured and replayed. Triton's fused kernels may
    round unlike the eager ones, so the tokens are held to near-agreement, not identity."""
    policy = sdar()
    graphs = StepGraphs()
    compiled = generate(policy, MIXED, SEEDS, cfg(cuda_graph=True, compile=True), graphs)
    reference = generate(policy, MIXED, SEEDS, cfg(cache="none"))
    agreement = float((compiled.completion_ids == reference.completion_ids).float().mean())
    assert agreement >= 0.95, agreement
    assert graphs.captures == 2 and graphs.replays == graphs.calls == 31


def test_captured_step_stops_at_eos_like_the_reference():
    policy = sdar()
    policy.eos_token_id = int(generate(policy, MIXED, SEEDS, cfg()).completion_ids[0, 9])
    graphed = generate(policy, MIXED, SEEDS, cfg(cuda_graph=True, stop_at_eos=True))
    reference = generate(policy, MIXED, SEEDS, cfg(cache="none", stop_at_eos=True))
    assert same_tokens(graphed, reference) and torch.equal(graphed.completion_length, reference.completion_length)
    assert int(graphed.completion_length.min()) < 32


def test_engine_captures_once_and_replays_across_requests_and_weight_loads():
    policy, other = sdar(seed=0), sdar(seed=1)
    engine = TorchRolloutEngine(policy)
    c = cfg(cuda_graph=True)
    first = engine.generate(MIXED, SEEDS, c)
    again = engine.generate([p + 100 for p in MIXED], SEEDS + 4, c)  # same rows, same prompt bucket
    assert engine.graphs.captures == 2 and engine.graphs.reuses == 1
    assert same_tokens(again, generate(policy, [p + 100 for p in MIXED], SEEDS + 4, cfg(cache="none")))
    push = SimpleNamespace(receive=lambda handle, load: load(list(other.named_parameters())) or handle.version)
    engine.update_weights(push, WeightHandle(1, "test"))  # in place: the captured graph reads the new weights
    after = engine.generate(MIXED, SEEDS, c)
    assert engine.graphs.captures == 2
    assert same_tokens(after, generate(other, MIXED, SEEDS, cfg(cache="none")))
    assert not torch.equal(after.completion_ids, first.completion_ids)


DUAL_PROMPTS = [torch.arange(10, 42), torch.arange(60, 80)]  # width 32: the graphed canvas is the eager one
DUAL = SamplerConfig(gen_length=64, block_length=16, steps=64, threshold=0.004, temperature=0.9, cache="dual",
                     stop_at_eos=False)


def dual_llada(dtype=torch.float32):
    return build_tiny_policy("llada", dtype=dtype, **{**SHAPE, "num_key_value_heads": 4}).to(CUDA)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_captured_dual_step_replays_the_eager_dual_step(dtype):
    llada = dual_llada(dtype)
    graphs = StepGraphs()
    graphed = generate(llada, DUAL_PROMPTS, torch.arange(2), DUAL.model_copy(update={"cuda_graph": True}), graphs)
    eager = generate(llada, DUAL_PROMPTS, torch.arange(2), DUAL)
    assert same_tokens(graphed, eager) and graphed.num_forwards == eager.num_forwards
    assert graphs.captures == 1 and graphs.replays == graphed.num_forwards - 4  # all but the 4 refreshes


def test_compiled_graphed_dual_cache_follows_the_eager_dual_cache_in_fp32():
    """``compile`` with the graphed dual cache: the cached step compiled before its capture and each
    block's refresh through the compiled decoder layers. Triton's fused kernels may round unlike the
    eager ones, so the tokens are held to near-agreement with the eager dual cache."""
    llada = dual_llada()
    graphs = StepGraphs()
    compiled = generate(llada, DUAL_PROMPTS, torch.arange(2),
                        DUAL.model_copy(update={"cuda_graph": True, "compile": True}), graphs)
    eager = generate(llada, DUAL_PROMPTS, torch.arange(2), DUAL)
    agreement = float((compiled.completion_ids == eager.completion_ids).float().mean())
    assert agreement >= 0.95, agreement
    assert graphs.captures == 1 and graphs.replays == compiled.num_forwards - 4  # all but the 4 refreshes
