"""Samplers driven by an oracle model that puts its mass on a known target per position.

The oracle satisfies what ``DiffusionPolicy`` calls on a transformers model, reads nothing but
``position_ids`` (so any cache is irrelevant to it) and predicts target(position). Whatever the
path, the sampler must then write exactly the targets, in a number of forwards fixed by the
schedule.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn
from transformers import PretrainedConfig

from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.models.base import DiffusionPolicy, FamilySpec
from stabledrl.rollout.sampling import generate

VOCAB, EOS, MASK, PAD = 97, 1, 2, 0
torch.set_num_threads(1)


def target_table(length: int = 512, eos_at: int | None = None) -> torch.Tensor:
    """target token of every position: ids 4..96, optionally EOS from position ``eos_at`` on a
    stretch of 3 positions and then ordinary tokens again (the sampler must EOS-fill those)."""
    table = 4 + (torch.arange(length) * 37 + 11) % (VOCAB - 4)
    if eos_at is not None:
        table[eos_at : eos_at + 3] = EOS
    return table


class OracleLM(nn.Module):
    def __init__(self, table: torch.Tensor, *, shifted: bool = False, margin: torch.Tensor | float = 60.0) -> None:
        super().__init__()
        self.table, self.shifted = table, shifted
        self.margin = torch.as_tensor(margin, dtype=torch.float32).expand(len(table)).clone()  # per position
        self.config = PretrainedConfig(vocab_size=VOCAB)
        self.config._attn_implementation = "sdpa"  # the masks we pass are sdpa's boolean ones
        self.anchor = nn.Parameter(torch.zeros(1))  # gives the policy a device
        self.calls = 0

    def forward(
        self, input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=False, logits_to_keep=None
    ):
        self.calls += 1
        pos = position_ids + (1 if self.shifted else 0)  # a shifted model predicts the next position
        logits = torch.zeros(*input_ids.shape, VOCAB)
        logits.scatter_(-1, self.table[pos][..., None], self.margin[pos][..., None])
        return SimpleNamespace(logits=logits[:, logits_to_keep], cache=cache)


def oracle_policy(block_diffusion: bool = False, shifted: bool = False, **kw) -> DiffusionPolicy:
    spec = FamilySpec(
        "oracle", attention="block" if block_diffusion else "full", shifted_logits=shifted, default_block_size=4
    )
    return DiffusionPolicy(OracleLM(target_table(eos_at=kw.pop("eos_at", None)), shifted=shifted, **kw), spec,
                           mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD)


PROMPTS = [torch.tensor([5, 6, 7, 8, 9]), torch.tensor([10, 11]), torch.tensor([12, 13, 14, 15, 16, 17, 18, 19, 20])]
SEEDS = torch.tensor([3, 4, 5])


def expected(prompts, gen_length: int, table: torch.Tensor) -> torch.Tensor:
    # position of completion token j in a row with prompt length n is n + j
    return torch.stack([table[len(p) : len(p) + gen_length] for p in prompts])


PATHS = [(False, False, "none"), (False, False, "prefix"), (False, False, "dual"),
         (False, True, "none"), (False, True, "prefix"), (False, True, "dual"),
         (True, False, "none"), (True, False, "prefix")]


@pytest.mark.parametrize("block_diffusion,shifted,cache", PATHS)
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_oracle_target_reproduced_in_exactly_steps_forwards(block_diffusion, shifted, cache, temperature):
    policy = oracle_policy(block_diffusion, shifted)
    cfg = SamplerConfig(gen_length=16, block_length=4, steps=8, temperature=temperature, cache=cache)
    out = generate(policy, PROMPTS, SEEDS, cfg)
    assert torch.equal(out.completion_ids, expected(PROMPTS, 16, policy.model.table))
    assert out.num_forwards == 8 == policy.model.calls
    assert out.completion_length.tolist() == [16, 16, 16]
    assert out.tokens_generated == 48


@pytest.mark.parametrize("block_diffusion,shifted,cache", PATHS)
def test_threshold_commits_a_confident_block_in_one_forward(block_diffusion, shifted, cache):
    policy = oracle_policy(block_diffusion, shifted)
    cfg = SamplerConfig(gen_length=16, block_length=4, steps=16, temperature=0.0, cache=cache, threshold=0.9)
    out = generate(policy, PROMPTS, SEEDS, cfg)
    assert torch.equal(out.completion_ids, expected(PROMPTS, 16, policy.model.table))
    assert out.num_forwards == 4  # one per block instead of one per token
    assert out.decode_step.tolist() == [[0] * 4 + [1] * 4 + [2] * 4 + [3] * 4] * 3


def test_threshold_parallel_decoding_uses_fewer_forwards_than_one_token_per_step():
    """Confidence varies by position (margin 1 -> p~0.03, margin 9 -> p~0.99): threshold decoding
    commits the confident ones together, the rest one per step, and still writes the targets."""
    margin = torch.where(torch.arange(512) % 3 == 0, 1.0, 9.0)
    policy = oracle_policy(margin=margin)
    base = dict(gen_length=24, block_length=8, steps=24, temperature=0.0)
    one_per_step = generate(policy, PROMPTS, SEEDS, SamplerConfig(**base))
    parallel = generate(policy, PROMPTS, SEEDS, SamplerConfig(**base, threshold=0.9))
    target = expected(PROMPTS, 24, policy.model.table)
    assert torch.equal(one_per_step.completion_ids, target) and torch.equal(parallel.completion_ids, target)
    assert one_per_step.num_forwards == 24
    assert parallel.num_forwards < 24
    # rows advance on their own: a row never takes more forwards than it has unconfident tokens + blocks
    assert parallel.num_forwards <= 3 * (3 + 1)


@pytest.mark.parametrize("block_diffusion,cache", [(False, "none"), (False, "dual"), (True, "prefix")])
def test_eos_fill_and_early_stop(block_diffusion, cache):
    """Targets hold EOS at positions 9..11 and ordinary tokens after: each completion stops at its
    first EOS, everything after it reads EOS, and decoding stops before the last block."""
    policy = oracle_policy(block_diffusion, eos_at=9)
    prompts = [torch.tensor([5, 6]), torch.tensor([5, 6, 7, 8])]  # EOS at completion index 7 and 5
    cfg = SamplerConfig(gen_length=16, block_length=4, steps=16, temperature=0.0, cache=cache)
    out = generate(policy, prompts, torch.tensor([0, 1]), cfg)
    assert out.completion_length.tolist() == [8, 6]
    for row, first in enumerate([7, 5]):
        assert torch.equal(out.completion_ids[row, :first], policy.model.table[len(prompts[row]) : 9])
        assert (out.completion_ids[row, first:] == EOS).all()
    assert out.num_forwards == 8  # both rows are done after block 1: blocks 2 and 3 are never run
    assert out.tokens_generated == 14
    # one token per step, left to right; a row is done at the step that decodes its EOS, and the
    # positions it never decoded take that step
    assert out.decode_step[0].tolist() == list(range(8)) + [7] * 8
    assert out.decode_step[1].tolist() == list(range(6)) + [5] * 10
    no_stop = generate(policy, prompts, torch.tensor([0, 1]), cfg.model_copy(update={"stop_at_eos": False}))
    assert no_stop.num_forwards == 16 and torch.equal(no_stop.completion_ids, out.completion_ids)
