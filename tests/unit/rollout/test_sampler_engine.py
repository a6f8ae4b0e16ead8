"""RolloutEngine: the native engine's contract (micro-batches change nothing, order, scores,
weights, version)."""
from __future__ import annotations

import pytest
import torch

from stabledrl.common.config.estimator import BlockRandomConfig
from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.estimators import estimate
from stabledrl.common.models import build_tiny_policy
from stabledrl.common.transport.base import WeightHandle
from stabledrl.common.types import collate_samples
from stabledrl.rollout.engine import RolloutEngine, TorchRolloutEngine
from stabledrl.rollout.sampling import generate

torch.set_num_threads(1)


class InProcessPush:
    """A weight transport inside this process: the engine's end of the contract, without Ray."""

    def __init__(self, named_tensors):
        self.named_tensors = list(named_tensors)

    def receive(self, handle, load):
        load(self.named_tensors)
        return handle.version


def prompts_of(lengths):
    return [torch.arange(4, 4 + n) + i for i, n in enumerate(lengths)]


@pytest.mark.parametrize("family,block_length", [("llada", 8), ("sdar", None)])
def test_micro_batches_of_sorted_prompts_give_the_rows_of_one_big_batch(family, block_length):
    policy = build_tiny_policy(family)
    engine = TorchRolloutEngine(policy, policy_version=7)
    assert isinstance(engine, RolloutEngine)
    prompts = prompts_of([9, 2, 5, 12, 3, 7, 4])
    seeds = torch.arange(100, 107)
    cfg = SamplerConfig(gen_length=16, block_length=block_length, steps=8, temperature=0.9, max_batch_size=3)
    out = engine.generate(prompts, seeds, cfg)
    one_batch = generate(policy, prompts, seeds, cfg.model_copy(update={"max_batch_size": 64}))
    assert torch.equal(out.completion_ids, one_batch.completion_ids)
    assert torch.equal(out.decode_step, one_batch.decode_step)
    assert torch.equal(out.completion_length, one_batch.completion_length)
    assert out.tokens_generated == int(one_batch.completion_length.sum())
    assert out.policy_version == 7
    assert out.num_forwards >= 3 * 1  # three micro-batches, at least one forward each
    assert out.completion_ids.shape == (7, 16) and out.time_s > 0
    # the canvas tokens the forwards carried: each call's rows x forwards x (its longest prompt + gen_length)
    calls = [[1, 4, 6], [2, 5, 0], [3]]  # the rows by prompt length (2, 3, 4 | 5, 7, 9 | 12), cut in threes
    forwards = [generate(policy, [prompts[i] for i in c], seeds[c], cfg).num_forwards for c in calls]
    assert sum(forwards) == out.num_forwards
    assert out.forward_rows == sum(f * len(c) for f, c in zip(forwards, calls))
    assert out.forward_tokens == sum(f * len(c) * (max(len(prompts[i]) for i in c) + 16)
                                     for f, c in zip(forwards, calls))
    assert out.forward_attended == sum(f * len(c) * (max(len(prompts[i]) for i in c) + 16) ** 2
                                       for f, c in zip(forwards, calls))


def test_update_weights_switches_the_policy_and_owns_the_version():
    engine = TorchRolloutEngine(build_tiny_policy("llada", seed=0))
    other = build_tiny_policy("llada", seed=1)
    prompts, seeds = prompts_of([5, 6]), torch.tensor([1, 2])
    cfg = SamplerConfig(gen_length=16, block_length=8, steps=8, temperature=0.0)
    before = engine.generate(prompts, seeds, cfg)
    assert engine.update_weights(InProcessPush(other.named_parameters()), WeightHandle(3, "test")) == 3
    after = engine.generate(prompts, seeds, cfg)
    assert after.policy_version == 3 and before.policy_version == 0
    assert torch.equal(after.completion_ids, generate(other, prompts, seeds, cfg).completion_ids)
    assert not torch.equal(after.completion_ids, before.completion_ids)
    some = list(other.named_parameters())[:2]  # a push that left parameters out: refused, the version kept
    with pytest.raises(RuntimeError, match="parameters never arrived"):
        engine.update_weights(InProcessPush(some), WeightHandle(4, "test"))
    assert engine.policy_version == 3


def test_score_is_the_behaviour_estimate_under_the_engines_weights():
    policy = build_tiny_policy("llada", seed=0)
    engine = TorchRolloutEngine(policy)
    cfg = SamplerConfig(gen_length=8, block_length=8, steps=8, temperature=1.0)
    out = engine.generate(prompts_of([4, 6]), torch.tensor([3, 4]), cfg)
    from stabledrl.common.types import Sample

    samples = [
        Sample(
            sample_id=f"p/{i}",
            prompt_id="p",
            index=i,
            prompt_ids=p,
            completion_ids=out.completion_ids[i],
            completion_length=int(out.completion_length[i]),
            reward=0.0,
        )
        for i, p in enumerate(prompts_of([4, 6]))
    ]
    batch, seeds = collate_samples(samples, engine.pad_token_id), torch.tensor([11, 12])
    estimator = BlockRandomConfig(block_length=8, num_draws=2)
    got = engine.score(batch, seeds, estimator)
    want = estimate(policy, batch, seeds, estimator)
    torch.testing.assert_close(got.sequence, want.sequence.detach())
    assert not got.sequence.requires_grad  # behaviour estimates carry no graph


def test_requests_are_checked():
    engine = TorchRolloutEngine(build_tiny_policy("llada"))
    cfg = SamplerConfig(gen_length=8, block_length=8, steps=8)
    with pytest.raises(ValueError, match="one seed per row"):
        engine.generate(prompts_of([3, 4]), torch.tensor([1]), cfg)
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        engine.generate([torch.tensor([], dtype=torch.long)], torch.tensor([1]), cfg)


def test_uniform_noise_families_run_their_own_sampler_never_mask_canvases():
    policy = build_tiny_policy("diffusion_gemma")
    seen = []
    hook = policy.model.register_forward_pre_hook(
        lambda m, a, kw: seen.append(kw["decoder_input_ids"]), with_kwargs=True
    )
    try:
        out = TorchRolloutEngine(policy).generate(
            prompts_of([3]), torch.tensor([1]), SamplerConfig(gen_length=8, block_length=None, steps=8)
        )
    finally:
        hook.remove()
    assert out.completion_ids.shape == (1, 8) and seen and not any((s == policy.mask_token_id).all() for s in seen)


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
def test_full_attention_counts_what_each_forward_carries(cache):
    """The roofline's generation FLOPs: the exact sampler's forwards carry the whole canvas; a cached
    one's a full forward when a block starts, then the block (dual) or the block and what follows it
    (prefix), each query token reading every key of the canvas."""
    policy = build_tiny_policy("llada")
    prompts, seeds = prompts_of([5, 3]), torch.tensor([1, 2])
    gen, block, steps = 16, 4, 8  # 4 blocks of 2 fixed steps each
    cfg = SamplerConfig(gen_length=gen, block_length=block, steps=steps, temperature=0.9, cache=cache)
    out = generate(policy, prompts, seeds, cfg)
    rows, t = 2, 5 + gen
    assert out.num_forwards == steps and out.forward_rows == rows * steps
    if cache == "none":
        queries = [t] * steps
    else:  # a block's first step is its refresh, the second reads the cache
        starts = [5 + b * block for b in range(gen // block)]
        queries = [q for s in starts for q in (t, block if cache == "dual" else t - s)]
    assert out.forward_tokens == rows * sum(queries)
    assert out.forward_attended == rows * t * sum(queries)
    # the engine keeps the sampler's counts (one call: the same rows)
    engine = TorchRolloutEngine(policy)
    counted = engine.generate(prompts, seeds, cfg)
    assert (counted.forward_rows, counted.forward_tokens, counted.forward_attended) == \
        (out.forward_rows, out.forward_tokens, out.forward_attended)
