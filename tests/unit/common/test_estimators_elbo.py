"""The Monte-Carlo ELBO against the exact ELBO, computed by enumerating every mask of a 4-token
completion on a tiny-vocabulary model (both weightings)."""
import itertools
import math

import pytest
import torch

from stabledrl.common.config.estimator import ElboMCConfig
from stabledrl.common.estimators import estimate
from stabledrl.common.estimators.elbo import elbo_views
from stabledrl.common.models import build_tiny_policy
from stabledrl.common.types import SequenceBatch

PROMPT = torch.tensor([5, 6, 3])
COMPLETION = torch.tensor([4, 7, 5, 1, 1])  # |o| = 4 (up to and including the first EOS), one position after it
LENGTH = 4


@pytest.fixture(scope="module")
def policy():
    torch.set_num_threads(1)
    p = build_tiny_policy("llada", vocab_size=8, seed=4)
    with torch.no_grad():
        p.model.lm_head.weight.mul_(15.0)  # make p(o_k | .) depend strongly on the mask pattern
    return p


def _batch() -> SequenceBatch:
    mask = torch.arange(len(COMPLETION)) < LENGTH
    return SequenceBatch(
        input_ids=torch.cat([PROMPT, COMPLETION])[None],
        prompt_mask=torch.ones(1, len(PROMPT), dtype=torch.bool),
        completion_mask=mask[None],
    )


def _subset_terms(policy) -> dict[tuple[int, ...], float]:
    """sum_{k in M} log p(o_k | o_{-M}) for every non-empty M of the |o| tokens (after-EOS always masked)."""
    p = len(PROMPT)
    terms = {}
    for size in range(1, LENGTH + 1):
        for subset in itertools.combinations(range(LENGTH), size):
            x = torch.cat([PROMPT, COMPLETION])[None].clone()
            x[0, p + LENGTH :] = policy.mask_token_id
            x[0, [p + k for k in subset]] = policy.mask_token_id
            with torch.no_grad():
                logp = torch.log_softmax(policy(x).logits[0, p:].double(), -1)
            terms[subset] = float(sum(logp[k, COMPLETION[k]] for k in subset))
    return terms


def _exact(terms, weighting: str) -> float:
    """E_{l ~ U{1..n}} E_{M uniform of size l} [ w(l) * term(M) ], w = n/l (weighted) or 1/l (mean)."""
    total = 0.0
    for size in range(1, LENGTH + 1):
        subsets = [s for s in terms if len(s) == size]
        w = (LENGTH if weighting == "weighted" else 1.0) / size
        total += sum(w * terms[s] for s in subsets) / len(subsets) / LENGTH
    return total


@pytest.mark.parametrize("weighting", ["weighted", "mean"])
def test_each_draw_is_its_enumerated_term(policy, weighting):
    batch, seeds = _batch(), torch.tensor([77])
    cfg = ElboMCConfig(num_draws=40, weighting=weighting)
    terms = _subset_terms(policy)
    with torch.no_grad():
        draws = estimate(policy, batch, seeds, cfg).diagnostics["draws"][0]
    views, _ = elbo_views(batch, seeds, cfg)
    for j in range(cfg.num_draws):
        subset = tuple(views.score[0, j].nonzero().flatten().tolist())
        assert views.completion[0, j, LENGTH:].all()  # the canvas after the first EOS stays masked
        w = (LENGTH if weighting == "weighted" else 1.0) / len(subset)
        assert math.isclose(float(draws[j]), w * terms[subset], abs_tol=1e-4)


@pytest.mark.parametrize("weighting", ["weighted", "mean"])
def test_monte_carlo_mean_converges_to_the_exact_elbo(policy, weighting):
    terms = _subset_terms(policy)
    exact = _exact(terms, weighting)
    cfg = ElboMCConfig(num_draws=4000, weighting=weighting, draw_batch=1000)
    with torch.no_grad():
        ll = estimate(policy, _batch(), torch.tensor([2024]), cfg)
    draws = ll.diagnostics["draws"][0].double()
    stderr = float(draws.std() / math.sqrt(cfg.num_draws))
    assert stderr > 0
    assert abs(float(ll.sequence[0]) - exact) < 4 * stderr, (float(ll.sequence[0]), exact, stderr)
    # and the mask-size distribution is the uniform one the exact value assumes
    sizes = torch.bincount(ll.diagnostics["masked_fraction"][0].mul(LENGTH).round().long(), minlength=LENGTH + 1)
    assert sizes[0] == 0 and (sizes[1:].double() / cfg.num_draws - 1 / LENGTH).abs().max() < 0.03
