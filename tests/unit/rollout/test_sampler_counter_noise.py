"""The counter-based draw (``sampler.noise_source: counter``, rollout/sampling/decode.py): SplitMix64
over (row seed, row step, position, token), checked against a plain-integer SplitMix64; its uniforms
and the Gumbel-max choice over them sample softmax(l / T); a row's tokens depend only on its own seed
and canvas (alone or in a batch, waiting or not, cached, graphed or reference path); the compiled
choice computes the same bits; and a release's low-precision arithmetic is refused with it."""
from __future__ import annotations

import pytest
import torch

from stabledrl.common.config.base import ConfigError, validate
from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.models import build_tiny_policy
from stabledrl.rollout.sampling import StepGraphs, generate
from stabledrl.rollout.sampling.decode import choose_tokens, counter_uniform

torch.set_num_threads(1)
M64 = (1 << 64) - 1
PROMPTS = [torch.tensor([5, 6, 7, 8, 9]), torch.tensor([10, 11]), torch.tensor([12, 13, 14, 15, 16, 17, 18])]
SEEDS = torch.tensor([101, 202, 303])


def splitmix64(state: int) -> int:
    """SplitMix64's output for an already advanced state (plain Python integers, mod 2^64)."""
    z = state & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


@pytest.mark.parametrize("dtype,bits", [(torch.float64, 53), (torch.float32, 24)])
def test_the_draw_is_splitmix64_of_the_rows_counter(dtype, bits):
    seeds = torch.tensor([3, (1 << 62) + 12345, 7])  # a 63-bit seed as derive_seed makes them
    steps = torch.tensor([0, 5, 1000])
    shape = (4, 9)
    u = counter_uniform(seeds, steps, shape, dtype)
    assert u.shape == (3, 4, 9) and u.dtype == dtype
    n = 36
    for b in range(3):
        for i in (0, 1, 17, 35):
            state = int(seeds[b]) + (int(steps[b]) * n + i + 1) * 0x9E3779B97F4A7C15
            expected = (splitmix64(state) >> (64 - bits)) / 2.0 ** bits
            assert float(u[b].flatten()[i]) == expected, (b, i)


def test_the_uniforms_are_uniform_and_uncorrelated():
    u = counter_uniform(torch.tensor([123]), torch.tensor([0]), (400_000,)).flatten()
    counts = torch.histc(u.float(), bins=20, min=0, max=1)
    chi2 = float(((counts - 20_000) ** 2 / 20_000).sum())
    assert chi2 < 45  # 19 degrees of freedom: p ~ 0.001
    assert abs(float(u.mean()) - 0.5) < 0.002
    assert abs(float(torch.corrcoef(torch.stack([u[:-1], u[1:]]))[0, 1])) < 0.01
    nxt = counter_uniform(torch.tensor([123]), torch.tensor([1]), (400_000,)).flatten()  # the row's next step
    assert abs(float(torch.corrcoef(torch.stack([u, nxt]))[0, 1])) < 0.01


@pytest.mark.parametrize("noise_dtype", ["float32", "float64"])
def test_gumbel_max_over_the_counter_draw_samples_softmax(noise_dtype):
    temperature = 0.7
    scores = torch.tensor([1.0, 0.0, -0.5, 0.8, -3.0, 0.3])
    rows = 6000
    logits = scores.expand(rows, 1, -1).clone()
    counter = (torch.arange(rows) * 7919 + 11, torch.zeros(rows, dtype=torch.long))
    x0, _ = choose_tokens(logits, temperature, [], mask_token_id=4, noise_dtype=noise_dtype, counter=counter)
    freq = torch.bincount(x0.flatten(), minlength=6).double() / rows
    p = torch.softmax(scores.double() / temperature, dim=0)
    p[4] = 0.0
    p = p / p.sum()
    assert (freq - p).abs().max() < 4 * (p * (1 - p) / rows).sqrt().max() + 1e-3


def cfg(**kw) -> SamplerConfig:
    return SamplerConfig(**{**dict(gen_length=32, block_length=8, steps=32, temperature=0.9, stop_at_eos=False,
                                   noise_source="counter"), **kw})


@pytest.mark.parametrize("family,kw", [
    ("llada", dict()), ("llada", dict(cache="dual", threshold=0.012)), ("llada", dict(cache="prefix", threshold=0.012)),
    ("llada", dict(remasking="random")), ("dream", dict(cache="dual", threshold=0.012)),
    ("sdar", dict(block_length=None)), ("sdar", dict(block_length=None, threshold=0.02)),
], ids=["llada", "llada-dual-threshold", "llada-prefix-threshold", "llada-random", "dream-dual-threshold", "sdar",
        "sdar-threshold"])
def test_a_rows_tokens_depend_only_on_its_own_seed_and_canvas(family, kw):
    """Together or alone (threshold decoding makes rows wait for each other: a waiting row keeps its
    step counter, so its next draw is the one it would have made alone)."""
    policy = build_tiny_policy(family, **({"block_size": 4} if family == "sdar" else {}))
    c = cfg(**kw)
    together = generate(policy, PROMPTS, SEEDS, c)
    for row in range(len(PROMPTS)):
        alone = generate(policy, PROMPTS[row: row + 1], SEEDS[row: row + 1], c)
        assert torch.equal(together.completion_ids[row], alone.completion_ids[0]), row
        assert torch.equal(together.decode_step[row], alone.decode_step[0]), row
    other = generate(policy, PROMPTS, SEEDS + 1, c)
    assert not torch.equal(other.completion_ids, together.completion_ids)  # the seed is what keys the draw
    generators = generate(policy, PROMPTS, SEEDS, c.model_copy(update={"noise_source": "generator"}))
    assert not torch.equal(generators.completion_ids, together.completion_ids)  # another stream than the generators'


def test_the_cached_and_graphed_paths_give_the_reference_tokens():
    sdar = build_tiny_policy("sdar", block_size=4)
    c = cfg(block_length=None)
    reference = generate(sdar, PROMPTS, SEEDS, c.model_copy(update={"cache": "none"}))
    for update in ({"cache": "prefix"}, {"cuda_graph": True}):
        got = generate(sdar, PROMPTS, SEEDS, c.model_copy(update=update), StepGraphs())
        assert torch.equal(got.completion_ids, reference.completion_ids), update
        assert torch.equal(got.decode_step, reference.decode_step), update


@pytest.mark.parametrize("noise", ["float64", "float32"])
def test_the_compiled_choice_draws_the_same_bits(noise):
    """The fused (compiled) choice computes the counter's integers inside its single pass: on the same
    logits it picks the eager tokens at the eager confidence."""
    from stabledrl.common import compiling
    from stabledrl.rollout.sampling import decode

    logits = (torch.randn(3, 8, 3000, generator=torch.Generator().manual_seed(1)) * 4).bfloat16()
    counter = (torch.tensor([5, 6, 7]), torch.tensor([0, 3, 9]))
    x0, conf = choose_tokens(logits.clone(), 0.9, [], mask_token_id=7, noise_dtype=noise, counter=counter)
    fx0, fconf = choose_tokens(logits.clone(), 0.9, [], mask_token_id=7, noise_dtype=noise, counter=counter,
                               fused=True)
    assert any(fn is decode._FUSED_FORMS["counter"] for fn, _ in compiling._COMPILED)
    assert torch.equal(x0, fx0) and (fx0 != 7).all()
    torch.testing.assert_close(fconf, conf, rtol=1e-5, atol=1e-6)


def test_a_releases_low_precision_noise_is_refused_with_the_counter():
    for noise in ("bfloat16", "float32_then_bfloat16"):
        with pytest.raises(ConfigError) as err:
            validate(SamplerConfig, {"noise_source": "counter", "noise_dtype": noise}, source="rollout.sampler")
        assert "noise_source" in str(err.value) and noise in str(err.value)
    assert SamplerConfig().noise_source == "generator"  # the generators stay the default


def test_each_step_draws_at_the_rows_own_step_counter(monkeypatch):
    """Fixed steps: a row's k-th step draws at counter step k (never one draw reused)."""
    from stabledrl.rollout.sampling import decode

    seen: list[list[int]] = []
    real = decode.counter_uniform

    def spy(seeds, steps, shape, dtype=torch.float64):
        seen.append(steps.tolist())
        return real(seeds, steps, shape, dtype)

    monkeypatch.setattr(decode, "counter_uniform", spy)
    sdar = build_tiny_policy("sdar", block_size=4)
    out = generate(sdar, PROMPTS, SEEDS, cfg(block_length=None))
    assert seen == [[k] * 3 for k in range(out.num_forwards)]
