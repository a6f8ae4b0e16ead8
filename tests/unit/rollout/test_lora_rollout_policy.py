"""Under LoRA the rollout policy is the learner's: a worker that holds the pushed adapters unmerged
(``learner.lora.push: adapters``; common/models/lora.py) scores a batch with exactly the learner's
per-token log-probabilities after a small update, where the merged push rounds the update away.

The learner is peft's LoRA on a bf16 tiny LLaDA (W ~ N(0, 0.02), r 8, alpha 4: s = 0.5, d1's
alpha / rank), A at peft's initialisation and B ~ N(0, 1e-4): a first small update. Both sides
score with d1's estimator (``mean_field``: the completion masked, the prompt masked at 15%), as the
worker's behaviour estimate and the learner's ratio do.

The tolerance is the forward's own noise under the op-order change that separates the two sides:
the learner scores a sample inside its micro-batch, a worker inside its request, so the noise is
the difference between the learner's log-probs of the batch and of each row scored alone. On a
CPU that is 0 (measured here; the kernels are batch-invariant at this shape): the adapters' path
must then give the learner's log-probs bit for bit. Another scale of bf16 noise, the bf16 forward
against the fp32 one, is 6.3e-4 a token on average here (2.2e-3 at most), and the merged worker's
difference from the learner is of that same size (5.2e-4, 2.2e-3 at most): in bf16 any change of
the function shows up as rounding flips of the activations, so a tolerance of that scale could not
tell the rounded policy from the learner's. What the rounding does is shown directly in fp32
arithmetic over the same stored parameters: the merged worker keeps 31% of the update's effect on
the log-probs, the adapters' worker all of it."""
from __future__ import annotations

import copy

import pytest
import torch

from stabledrl.common.config.estimator import MeanFieldConfig
from stabledrl.common.config.learner import LoraConfig
from stabledrl.common.estimators import estimate
from stabledrl.common.models import build_tiny_policy
from stabledrl.common.transport.base import WeightHandle
from stabledrl.common.types import SequenceBatch, left_pad
from stabledrl.learner.lora import adapter_named_parameters, add_adapters, plain_named_parameters
from stabledrl.rollout.engine import TorchRolloutEngine

LORA = LoraConfig(rank=8, alpha=4.0)  # s = 0.5, as d1's r 128, alpha 64
ESTIMATOR = MeanFieldConfig()
SEEDS = torch.arange(6) + 100


class Push:
    """A push that hands the learner's tensors to the worker's loader, two at a time."""

    def __init__(self, named) -> None:
        self.named = [(n, t.detach().clone()) for n, t in named]

    def receive(self, handle: WeightHandle, load) -> int:
        for i in range(0, len(self.named), 2):
            load(self.named[i : i + 2])
        return handle.version


def batch() -> SequenceBatch:
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(4, 97, (n,), generator=g) for n in (9, 5, 12, 7, 12, 3)]
    ids, prompt_mask = left_pad(prompts, pad_id=0)
    completions = torch.randint(4, 97, (6, 24), generator=g)
    return SequenceBatch(input_ids=torch.cat([ids, completions], 1), prompt_mask=prompt_mask,
                         completion_mask=torch.ones_like(completions, dtype=torch.bool))


@pytest.fixture(scope="module")
def sides():
    """(base, learner, worker holding the adapters, worker holding the merged push)."""
    torch.set_num_threads(1)
    base = build_tiny_policy("llada", dtype=torch.bfloat16, seed=0)  # Linear weights ~ N(0, 0.02)
    learner = copy.deepcopy(base)
    adapted = add_adapters(learner, LORA)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for a in adapted:
            a.lora_B.copy_(torch.randn(a.lora_B.shape, generator=g) * 1e-4)
    workers = {}
    for push, named in (("adapters", adapter_named_parameters(adapted, zero_stage=0, bucket_bytes=1 << 20,
                                                              receive=True)),
                        ("merged", plain_named_parameters(learner, adapted, zero_stage=0, bucket_bytes=1 << 20,
                                                          receive=True, only_adapted=True))):
        engine = TorchRolloutEngine(copy.deepcopy(base))
        engine.hold_adapters(LORA if push == "adapters" else None)
        engine.update_weights(Push(named), WeightHandle(1, "gloo"), partial=True)
        workers[push] = engine.policy
    return base, learner, workers


def token_logps(policy, rows=None) -> torch.Tensor:
    """[B, C] the estimator's per-token log-probs (``rows``: each row scored alone)."""
    b = batch()
    with torch.no_grad():
        if rows is None:
            return estimate(policy, b, SEEDS, ESTIMATOR).token
        alone = [estimate(policy, b.select([r]), SEEDS[r : r + 1], ESTIMATOR).token for r in range(len(SEEDS))]
        return torch.cat(alone)


@pytest.fixture(scope="module")
def noise(sides):
    """The forward's own noise between scoring in a batch and scoring row by row (0 on a CPU)."""
    learner = sides[1]
    return (token_logps(learner) - token_logps(learner, rows="alone")).abs().max().item()


def test_the_adapters_worker_scores_with_the_learners_log_probs(sides, noise):
    base, learner, workers = sides
    ours, theirs = token_logps(workers["adapters"]), token_logps(learner)
    assert (ours - theirs).abs().max().item() <= noise
    assert not torch.equal(theirs, token_logps(base))  # the update moves the learner's log-probs


def test_the_merged_worker_does_not(sides, noise):
    _, learner, workers = sides
    assert (token_logps(workers["merged"]) - token_logps(learner)).abs().max().item() > noise


def kept_share(policy, learner, base) -> float:
    """In fp32 arithmetic over the stored parameters: the share of the learner's update to the
    log-probs that ``policy`` reproduces, <d_policy, d_learner> / |d_learner|^2."""
    start = token_logps(copy.deepcopy(base).float())
    moved = token_logps(copy.deepcopy(learner).float()) - start
    return float(((token_logps(copy.deepcopy(policy).float()) - start) * moved).sum() / moved.pow(2).sum())


def test_the_merged_push_rounds_most_of_a_small_update_away(sides):
    base, learner, workers = sides
    assert kept_share(workers["adapters"], learner, base) == pytest.approx(1.0, abs=1e-3)
    assert kept_share(workers["merged"], learner, base) < 0.5
