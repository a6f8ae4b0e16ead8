"""Uniform-noise block sampler (DiffusionGemma): a policy that knows the answer reproduces it, the
exact encoder cache changes nothing but the cost, a row depends only on its prompt and seed, and
the decoder really reads uniform noise (never the mask id) at the positions not yet accepted."""
from __future__ import annotations

import pytest
import torch

from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.models import build_tiny_policy
from stabledrl.common.models.base import PolicyOutput
from stabledrl.common.models.diffusion_gemma import DiffusionGemmaPolicy
from stabledrl.rollout.sampling import generate

pytest.importorskip("transformers.models.diffusion_gemma")
torch.set_num_threads(1)
BLOCK = 4
PROMPTS = [torch.tensor([5, 6, 7, 8, 9]), torch.tensor([10, 11]), torch.tensor([12, 13, 14, 15, 16, 17, 18, 19])]
SEEDS = torch.tensor([11, 22, 33])


def target(positions: torch.Tensor) -> torch.Tensor:
    return 4 + (positions * 7) % 80  # never EOS (1) or the mask id (2)


class Oracle(DiffusionGemmaPolicy):
    """The tiny DiffusionGemma run as usual (cache and all), with its canvas logits replaced by
    +-30 (the soft cap) on ``target(position)``, or EOS from position ``eos_at`` on; it records
    every canvas it is shown."""

    eos_at: int = 10**9

    def forward(self, input_ids, *, position_ids=None, logits_from=None, **kw):
        out = super().forward(input_ids, position_ids=position_ids, logits_from=logits_from, **kw)
        split = 0 if logits_from is None else int(logits_from)
        pos = position_ids[:, split:]
        self.seen.append(input_ids[:, split:].clone())
        want = torch.where(pos >= self.eos_at, self.eos_token_id, target(pos))
        logits = torch.full_like(out.logits, -30.0).scatter_(-1, want[..., None], 30.0)
        return PolicyOutput(logits, out.past_key_values)


@pytest.fixture(scope="module")
def gemma():
    return build_tiny_policy("diffusion_gemma", block_size=BLOCK, sliding_window=5, seed=1)


@pytest.fixture()
def oracle(gemma):
    o = Oracle(gemma.model, gemma.spec, mask_token_id=gemma.mask_token_id, eos_token_id=gemma.eos_token_id,
               pad_token_id=gemma.pad_token_id, block_size=BLOCK)
    o.seen = []
    return o


def cfg(**kw) -> SamplerConfig:
    return SamplerConfig(**{**dict(gen_length=16, block_length=None, steps=8, temperature=0.9), **kw})


@pytest.mark.parametrize("kw", [dict(cache="prefix"), dict(cache="none"), dict(steps=16, threshold=0.5),
                                dict(remasking="random")])
def test_a_policy_that_knows_the_answer_reproduces_it(oracle, kw):
    out = generate(oracle, PROMPTS, SEEDS, cfg(**kw))
    for b, prompt in enumerate(PROMPTS):
        expected = target(torch.arange(len(prompt), len(prompt) + 16))
        assert torch.equal(out.completion_ids[b], expected)
    assert torch.equal(out.completion_length, torch.full((3,), 16))
    steps = 8 if "threshold" not in kw else 4  # threshold 0.5: every position is certain, a block per step
    assert out.num_forwards == steps
    per_block = out.decode_step.view(3, 4, BLOCK)
    assert torch.all(per_block.max(-1).values[:, :-1] < per_block.min(-1).values[:, 1:])  # blocks in order


def test_eos_stops_the_row_and_fills_the_rest(oracle):
    oracle.eos_at = 9  # completion index 9 - len(prompt): 4, 7 and 1
    out = generate(oracle, PROMPTS, SEEDS, cfg())
    for b, prompt in enumerate(PROMPTS):
        first = 9 - len(prompt)
        assert int(out.completion_length[b]) == first + 1
        assert (out.completion_ids[b, first:] == oracle.eos_token_id).all()
        assert torch.equal(out.completion_ids[b, :first], target(torch.arange(len(prompt), 9)))
    assert out.num_forwards == 4  # every row done after block 1 (of 4)


def test_the_decoder_reads_uniform_noise_where_nothing_is_accepted(oracle):
    generate(oracle, PROMPTS[:1], SEEDS[:1], cfg(steps=16, stop_at_eos=False))  # one token per step
    first, second = oracle.seen[0], oracle.seen[1]  # block 0, steps 0 and 1
    assert first.shape == (1, BLOCK) and not (first == oracle.mask_token_id).any()
    kept = second == target(torch.arange(5, 5 + BLOCK))  # the accepted position (and chance hits)
    assert kept.sum() >= 1 and not torch.equal(first[~kept], second[~kept])  # the rest was renoised
    canvases = torch.cat([s[:, -BLOCK:] for s in oracle.seen])  # [16, BLOCK]
    assert canvases.unique().numel() > 30  # noise spread over the vocabulary, not a fixed token


@pytest.mark.parametrize(
    "kw", [dict(), dict(temperature=0.0), dict(remasking="random"), dict(steps=16, threshold=0.012),
           dict(stop_at_eos=False, steps=4)],
)
def test_exact_cache_gives_the_same_tokens_as_the_reference_path(gemma, kw):
    cached = generate(gemma, PROMPTS, SEEDS, cfg(cache="prefix", **kw))
    reference = generate(gemma, PROMPTS, SEEDS, cfg(cache="none", **kw))
    assert torch.equal(cached.completion_ids, reference.completion_ids)
    assert torch.equal(cached.decode_step, reference.decode_step)
    assert torch.equal(cached.completion_length, reference.completion_length)
    assert cached.num_forwards == reference.num_forwards


@pytest.mark.parametrize("kw", [dict(), dict(steps=16, threshold=0.012)])
def test_a_row_depends_only_on_its_prompt_and_seed(gemma, kw):
    together = generate(gemma, PROMPTS, SEEDS, cfg(stop_at_eos=False, **kw))
    again = generate(gemma, PROMPTS, SEEDS, cfg(stop_at_eos=False, **kw))
    alone = generate(gemma, PROMPTS[1:2], SEEDS[1:2], cfg(stop_at_eos=False, **kw))
    other = generate(gemma, PROMPTS, SEEDS + 1, cfg(stop_at_eos=False, **kw))
    assert torch.equal(together.completion_ids, again.completion_ids)
    assert torch.equal(together.completion_ids[1], alone.completion_ids[0])
    assert torch.equal(together.decode_step[1], alone.decode_step[0])
    assert not torch.equal(together.completion_ids, other.completion_ids)
