"""The rollout samplers and the benchmarks' on-device model builder on CUDA (small shapes, seconds).

- Block diffusion: the exact KV cache gives the reference path's tokens on the GPU too (fp32), with
  fixed steps and with threshold decoding (rows entering blocks at different steps).
- Full attention: every cache mode starts each block with the same full forward, so the tokens
  committed at a row's first step agree across none / prefix / dual (fp32); bf16 runs of every
  mode decode the whole canvas in the expected number of forwards.
- The benchmarks' builder (tests/benchmarks/benchlib.py) creates bf16 parameters on the GPU whose
  forward matches the same weights in fp32 on the CPU.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import benchlib as bl  # noqa: E402
from stabledrl.common.attention import full_mask  # noqa: E402
from stabledrl.common.config.sampler import SamplerConfig  # noqa: E402
from stabledrl.rollout.sampling import generate  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
CUDA = torch.device("cuda", 0)
SHAPE = dict(vocab_size=512, hidden_size=128, num_hidden_layers=3, num_attention_heads=4, intermediate_size=256)


def policy(family: str, dtype: torch.dtype, **kw):
    from stabledrl.common.models.presets import build_tiny_policy

    return build_tiny_policy(family, dtype=dtype, num_key_value_heads=2, **SHAPE, **kw).to(CUDA)


def prompts(n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(4, 512, (int(length),), generator=g) for length in torch.randint(3, 20, (n,), generator=g)]


@pytest.mark.parametrize("kw", [dict(steps=32), dict(steps=16), dict(steps=None, threshold=0.004)])
def test_block_diffusion_cache_is_exact_on_cuda(kw):
    sdar = policy("sdar", torch.float32, block_size=4)
    cfg = SamplerConfig(gen_length=32, block_length=None, temperature=0.0, **kw)
    rows, seeds = prompts(6), torch.arange(6)
    cached = generate(sdar, rows, seeds, cfg.model_copy(update={"cache": "prefix"}))
    reference = generate(sdar, rows, seeds, cfg.model_copy(update={"cache": "none"}))
    assert torch.equal(cached.completion_ids, reference.completion_ids)
    assert torch.equal(cached.decode_step, reference.decode_step)
    assert cached.num_forwards == reference.num_forwards


def test_full_attention_caches_agree_on_each_rows_first_step():
    llada = policy("llada", torch.float32)
    cfg = SamplerConfig(gen_length=32, block_length=8, steps=16, temperature=0.0, stop_at_eos=False)
    rows, seeds = prompts(5), torch.arange(5)
    outs = {
        mode: generate(llada, rows, seeds, cfg.model_copy(update={"cache": mode}))
        for mode in ("none", "prefix", "dual")
    }
    first = outs["none"].decode_step == 0  # [B, C] tokens committed by the first (full) forward
    assert first.any()
    for mode in ("prefix", "dual"):
        assert torch.equal(outs[mode].completion_ids[first], outs["none"].completion_ids[first]), mode


@pytest.mark.parametrize("mode", ["none", "prefix", "dual"])
def test_full_attention_bf16_decodes_the_whole_canvas(mode):
    llada = policy("llada", torch.bfloat16)
    rows, seeds = prompts(4), torch.arange(4)
    fixed = generate(
        llada, rows, seeds, SamplerConfig(gen_length=32, block_length=8, steps=16, cache=mode, stop_at_eos=False)
    )
    assert fixed.num_forwards == 16 and not (fixed.completion_ids == llada.mask_token_id).any()
    parallel = generate(llada, rows, seeds, SamplerConfig(gen_length=32, block_length=8, steps=None, threshold=0.9,
                                                          cache=mode, stop_at_eos=False))
    assert 4 <= parallel.num_forwards <= 32 and not (parallel.completion_ids == llada.mask_token_id).any()


def test_benchmark_builder_makes_bf16_weights_on_the_gpu():
    p = bl.build_policy("tiny-llada", CUDA, torch.bfloat16)
    assert {t.device.type for t in p.parameters()} == {"cuda"} and {t.dtype for t in p.parameters()} == {torch.bfloat16}
    reference = bl.build_policy("tiny-llada", torch.device("cpu"), torch.float32)
    reference.load_state_dict({k: v.float().cpu() for k, v in p.state_dict().items()})
    ids = torch.randint(4, 512, (2, 24))
    mask = full_mask(torch.ones(2, 24, dtype=torch.bool))
    positions = torch.arange(24).expand(2, 24)
    with torch.no_grad():
        got = p(ids.to(CUDA), attention_mask=mask.to(CUDA), position_ids=positions.to(CUDA)).logits.float().cpu()
        want = reference(ids, attention_mask=mask, position_ids=positions).logits
    assert float((got - want).norm() / want.norm()) < 3e-2  # bf16 weights and activations
