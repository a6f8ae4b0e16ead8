"""Block-diffusion cached path without masks: an in-block step of an unpadded lockstep batch runs
with no attention mask (flash + GQA on CUDA) and still gives exactly the reference tokens."""
from __future__ import annotations

import pytest
import torch

from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.models import build_tiny_policy
from stabledrl.rollout.sampling import generate

torch.set_num_threads(1)
SAME_LENGTH = [
    torch.tensor([5, 6, 7, 8, 9, 10]),
    torch.tensor([11, 12, 13, 14, 15, 16]),
    torch.tensor([20, 21, 22, 23, 24, 25]),
]
MIXED = [torch.tensor([5, 6, 7, 8, 9]), torch.tensor([10, 11]), torch.tensor([12, 13, 14, 15, 16, 17, 18, 19])]
SEEDS = torch.tensor([11, 22, 33])


@pytest.fixture(scope="module")
def sdar():
    return build_tiny_policy("sdar", block_size=4)


def cfg(**kw) -> SamplerConfig:
    return SamplerConfig(
        **{**dict(gen_length=16, block_length=None, steps=16, temperature=0.9, stop_at_eos=False), **kw}
    )


def masks_seen(policy, prompts, c):
    """(output, [the attention_mask argument of every model forward])."""
    seen: list = []
    hook = policy.model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["attention_mask"]), with_kwargs=True)
    try:
        out = generate(policy, prompts, SEEDS, c)
    finally:
        hook.remove()
    return out, seen


@pytest.mark.parametrize("kw", [dict(), dict(temperature=0.0), dict(steps=8), dict(remasking="random"),
                                dict(stop_at_eos=True), dict(steps=16, threshold=0.015)])
def test_mask_free_steps_give_the_reference_tokens(sdar, kw):
    cached, seen = masks_seen(sdar, SAME_LENGTH, cfg(cache="prefix", **kw))
    reference = generate(sdar, SAME_LENGTH, SEEDS, cfg(cache="none", **kw))
    assert torch.equal(cached.completion_ids, reference.completion_ids)
    assert torch.equal(cached.decode_step, reference.decode_step)
    assert cached.num_forwards == reference.num_forwards
    if "threshold" not in kw:  # lockstep: every in-block step runs without a mask
        free = [m for m in seen if isinstance(m, dict)]
        steps_per_block = cached.num_forwards // 4
        assert all(v is None for m in free for v in m.values())
        assert len(free) == 4 * (steps_per_block - 1)  # all but each block's first step


def test_padded_batches_keep_the_mask_and_the_flags_are_restored(sdar):
    _, seen = masks_seen(sdar, MIXED, cfg(cache="prefix"))
    assert all(isinstance(m, torch.Tensor) for m in seen)
    _, seen = masks_seen(sdar, SAME_LENGTH, cfg(cache="prefix"))
    assert any(isinstance(m, dict) for m in seen)
    assert all(m.is_causal for m in sdar.modules() if isinstance(getattr(m, "is_causal", None), bool)
               and hasattr(m, "k_proj"))


def test_in_block_masks_are_built_once_per_block(sdar):
    """A lockstep batch with padding: the in-block steps of one block share one mask tensor."""
    out, seen = masks_seen(sdar, MIXED, cfg(cache="prefix", steps=16))
    per_block = 16 // 4
    for block in range(4):
        inside = seen[block * per_block + 1 : (block + 1) * per_block]
        assert len({id(m) for m in inside}) == 1
