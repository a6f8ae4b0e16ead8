"""Likelihood estimators for masked-diffusion LMs (docs/algorithms.md §2, §5), one registry.

    from stabledrl.common.estimators import estimate, learner_seeds
    ll = estimate(policy, batch, seeds, cfg)          # cfg: stabledrl.common.config.estimator.EstimatorConfig

| name         | forwards per estimate      | ``token`` (per-token value)                               |
|--------------|----------------------------|-----------------------------------------------------------|
| mean_field   | num_draws (d1: 1)          | log p(o_k | prompt-masked q, all-masked completion)       |
| elbo_mc      | num_draws (2)              | none                                                      |
| block_random | num_draws (2)              | none                                                      |
| spg_sandwich | num_draws (2)              | none; ``elbo`` = block_random's value of the same draws   |
| coupled      | 1 + 2 num_draws (3)        | 1/2 [log p(o_k | all masked) + w log p(o_k | pair view)]   |
| trajectory   | distinct (merged) steps    | log p(o_k | the state o_k was decoded from)               |
| staircase    | num_draws (1), length P+2C | none                                                      |
| uniform_staircase | num_draws (1), length P+2C | none (uniform-noise families: DiffusionGemma)        |

Block-diffusion families score every estimator through the staircase layout (scoring.py). A
uniform-noise family (DiffusionGemma) takes only the estimators in ``UNIFORM_NOISE_ESTIMATORS``:
the others corrupt with the [MASK] token, which such a model never saw.
"""
from stabledrl.common.estimators import block_random, coupled, elbo, mean_field, staircase, trajectory, uniform  # noqa: F401  (registration)
from stabledrl.common.estimators.base import (
    ESTIMATORS, UNIFORM_NOISE_ESTIMATORS, LogLikelihood, distinct_iteration_masks, estimate, get_estimator,
    learner_seeds, per_iteration_index,
)
from stabledrl.common.estimators.scoring import build_inputs, score_views

__all__ = [
    "ESTIMATORS",
    "UNIFORM_NOISE_ESTIMATORS",
    "LogLikelihood",
    "estimate",
    "get_estimator",
    "learner_seeds",
    "per_iteration_index",
    "distinct_iteration_masks",
    "build_inputs",
    "score_views",
]
