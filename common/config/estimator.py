"""Configs of the likelihood estimators (docs/algorithms.md §2, §5): one model per estimator, selected by
``name`` (a pydantic discriminated union). Defaults are the released settings of the method each
estimator comes from; the docstring of each field names its source.

``masks`` fixes how the learner's seed follows from a sample's ``mask_seed``
(``stabledrl.common.estimators.learner_seeds``): ``shared`` re-uses the behaviour estimate's masks (common
random numbers: coupled-GRPO, FPO), ``independent`` draws fresh, still deterministic, masks for
every inner iteration (the released StableDRL / SPG code). ``per_iteration`` (mean_field only) is
d1's scheme: μ prompt masks per micro-batch, each drawn for the whole micro-batch from one seed, of
which iteration k reads the one d1's counters pick (micro-batch m of M a rank trains per update:
mask (M·k + m + 1) mod μ), and under which the learner scores the old and the reference policy too
(before the step's first update, once per mask read), so each iteration's ratio and KL compare
estimates under one mask.
"""
from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import Field, model_validator

from stabledrl.common.config.base import StrictModel

Masks = Literal["shared", "independent"]
MeanFieldMasks = Literal["shared", "independent", "per_iteration"]
Weighting = Literal["weighted", "mean"]

_MASKS_DOC = (
    "how the learner's masks relate to the behaviour estimate's: 'shared' = same masks (common random "
    "numbers), 'independent' = fresh masks from (mask_seed, 'learner', inner_iteration)"
)
_DRAW_BATCH_DOC = "masked views scored per forward (per batch row); None = all views of an estimate in one forward"
_WEIGHTING_DOC = (
    "'weighted' = (|o|/l) * sum over the l masked tokens (the MDLM / LLaDA ELBO); "
    "'mean' = per-masked-token mean log-prob (the StableDRL / SPG length-normalised value)"
)


class _TimeRange(StrictModel):
    """A masking-fraction range [t_min, t_max]; a draw masks l ~ U{max(floor(n t_min), 1) .. min(floor(n t_max), n)}."""

    t_min: float = Field(0.0, ge=0.0, le=1.0, description="lowest masked fraction (SPG / LLaDA: 0, so l >= 1)")
    t_max: float = Field(1.0, ge=0.0, le=1.0, description="highest masked fraction (SPG / LLaDA: 1, so l <= n)")

    @model_validator(mode="after")
    def _ordered(self):
        if self.t_min > self.t_max:
            raise ValueError(f"t_min ({self.t_min}) must not exceed t_max ({self.t_max})")
        return self


class MeanFieldConfig(StrictModel):
    """d1 / diffu-GRPO (arXiv 2504.12216): one forward with the whole completion masked."""

    name: Literal["mean_field"] = "mean_field"
    num_draws: int = Field(1, ge=1, description="prompt-mask draws averaged per estimate (d1: 1)")
    prompt_mask_prob: float = Field(
        0.15, ge=0.0, lt=1.0, description="each real prompt token is masked with this probability (d1: 0.15)"
    )
    masks: MeanFieldMasks = Field(
        "shared",
        description=_MASKS_DOC + "; 'per_iteration' = d1's: at inner iteration k every micro-batch draws one prompt "
        "mask, mask i of its μ, from a seed of (its rows' mask seeds, i) in [0, 4096), as d1's torch.randint(0, 2**12) "
        "seeds do, the rows taking successive slices of one uniform stream as d1's forward_process does; i is what "
        "d1's counters pick, (M·k + m + 1) mod μ for micro-batch m of the M a rank trains per update (M = 2, μ = 12: "
        "6 of its 12 masks, each twice); the old (the weights before the step's first update) and the reference "
        "policy are scored once under each mask read (common/estimators/mean_field.py)",
    )
    draw_batch: Optional[int] = Field(None, ge=1, description=_DRAW_BATCH_DOC)


class ElboMCConfig(_TimeRange):
    """Monte-Carlo ELBO over random completion masks (MDLM arXiv 2406.07524, LLaDA, FPO)."""

    name: Literal["elbo_mc"] = "elbo_mc"
    num_draws: int = Field(2, ge=1, description="mask draws (forwards) per estimate (ALGORITHMS §2: 2-4; StableDRL: 2)")
    weighting: Weighting = Field("weighted", description=_WEIGHTING_DOC)
    prompt_mask_prob: float = Field(0.0, ge=0.0, lt=1.0, description="prompt-token mask probability (MDLM / FPO: 0)")
    masks: Masks = Field("shared", description=_MASKS_DOC + " (FPO: shared)")
    draw_batch: Optional[int] = Field(None, ge=1, description=_DRAW_BATCH_DOC)


class BlockRandomConfig(_TimeRange):
    """SPG block-wise masking (arXiv 2510.09541), as released with StableDRL (arXiv 2603.06743)."""

    name: Literal["block_random"] = "block_random"
    num_draws: int = Field(2, ge=1, description="mask draws (forwards) per estimate (StableDRL release: 2)")
    block_length: int = Field(
        32, ge=1, description="completion block = the sampler's generation block (SPG / StableDRL: 32)"
    )
    prompt_mask_prob: float = Field(0.15, ge=0.0, lt=1.0, description="prompt-token mask probability (SPG: 0.15)")
    mask_clean_blocks: bool = Field(
        True,
        description="also mask the clean blocks before the chosen one with prompt_mask_prob, as the released SPG "
        "code does (its light noise covers every unmasked position); False keeps them clean",
    )
    masks: Masks = Field("independent", description=_MASKS_DOC + " (StableDRL release: independent)")
    draw_batch: Optional[int] = Field(None, ge=1, description=_DRAW_BATCH_DOC)


class SPGSandwichConfig(BlockRandomConfig):
    """SPG sandwich: ELBO for A > 0, omega * EUBO_beta + (1 - omega) * ELBO for A <= 0 (arXiv 2510.09541)."""

    name: Literal["spg_sandwich"] = "spg_sandwich"  # type: ignore[assignment]
    logp_estimation: Literal["mix", "eubo", "elbo"] = Field("mix", description="value for A <= 0 (SPG release: mix)")
    mix_weight: float = Field(0.5, ge=0.0, le=1.0, description="omega, the EUBO weight of the mix (SPG: 0.5)")
    eubo_beta: float = Field(
        1.5,
        gt=0.0,
        description="beta of EUBO_beta; the StableDRL release uses 1.5 for every task "
        "(Sudoku, Countdown, GSM8K, MATH); SPG's own Sudoku script uses 1.0",
    )


class CoupledConfig(StrictModel):
    """DiffuCoder coupled-GRPO (arXiv 2506.20639): a fully masked view plus complementary mask pairs."""

    name: Literal["coupled"] = "coupled"
    num_draws: int = Field(1, ge=1, description="complementary pairs per estimate (DiffuCoder: 1, so 3 forwards)")
    t_min: float = Field(0.2, gt=0.0, lt=1.0, description="t ~ U(t_min, t_max) (DiffuCoder: 0.2)")
    t_max: float = Field(0.8, gt=0.0, lt=1.0, description="(DiffuCoder: 0.8)")
    masks: Masks = Field("shared", description=_MASKS_DOC + " (DiffuCoder: shared)")
    draw_batch: Optional[int] = Field(None, ge=1, description=_DRAW_BATCH_DOC)

    @model_validator(mode="after")
    def _ordered(self):
        if self.t_min > self.t_max:
            raise ValueError(f"t_min ({self.t_min}) must not exceed t_max ({self.t_max})")
        return self


class TrajectoryConfig(StrictModel):
    """TraceRL (arXiv 2509.06949): score each token in the state the sampler decoded it from."""

    name: Literal["trajectory"] = "trajectory"
    shrink: int = Field(
        1, ge=1, description="consecutive decoding steps merged per forward (TraceRL: 8 LLaDA/Dream, 1 SDAR/TraDo)"
    )
    masks: Masks = Field(
        "shared", description="unused: the estimate draws nothing (kept so every estimator reads alike)"
    )
    draw_batch: Optional[int] = Field(1, ge=1, description=_DRAW_BATCH_DOC + " (default 1: one step group per forward)")


class StaircaseConfig(_TimeRange):
    """Block-diffusion ELBO, every block's term in one staircase forward (SDAR / TraDo; ALGORITHMS §5)."""

    name: Literal["staircase"] = "staircase"
    t_min: float = Field(0.1, ge=0.0, le=1.0, description="per-block masking fraction lower bound (TraDo lower_p: 0.1)")
    t_max: float = Field(0.9, ge=0.0, le=1.0, description="(TraDo upper_p: 0.9)")
    num_draws: int = Field(1, ge=1, description="mask draws (staircase forwards) per estimate (TraDo: 1)")
    weighting: Weighting = Field("weighted", description=_WEIGHTING_DOC + "; 'weighted' sums the per-block ELBOs")
    prompt_mask_prob: float = Field(0.0, ge=0.0, lt=1.0, description="prompt-token mask probability (SDAR: 0)")
    masks: Masks = Field("shared", description=_MASKS_DOC)
    draw_batch: Optional[int] = Field(None, ge=1, description=_DRAW_BATCH_DOC)


class UniformStaircaseConfig(_TimeRange):
    """Uniform-noise block diffusion (DiffusionGemma): per-block UDLM ELBO (arXiv 2412.10193) or a
    corrupted-token surrogate, every block in one staircase forward (common/estimators/uniform.py)."""

    name: Literal["uniform_staircase"] = "uniform_staircase"
    objective: Literal["elbo", "corrupted_logp"] = Field(
        "elbo", description="'elbo' = UDLM's continuous-time ELBO integrand at every real position (a bound on "
        "log pi); 'corrupted_logp' = log p(o_k) at the corrupted positions only (a surrogate, not a bound)",
    )
    t_min: float = Field(0.0, ge=0.0, le=1.0, description="t_b ~ U(t_min, t_max) per block; each position is "
                         "corrupted with probability t_b (UDLM: U(0, 1))")
    t_max: float = Field(1.0, ge=0.0, le=1.0, description="(UDLM: 1)")
    num_draws: int = Field(1, ge=1, description="corruption draws (staircase forwards) per estimate")
    weighting: Weighting = Field(
        "weighted", description="'weighted' = sum over blocks (elbo: the ELBO; corrupted_logp: n_b/m_b-scaled); "
        "'mean' = per-scored-token mean (the StableDRL / SPG length-normalised form)",
    )
    masks: Masks = Field("shared", description=_MASKS_DOC)


# estimators that corrupt with the family's uniform noise (common/estimators/uniform.py); every other one
# writes the [MASK] token, which a uniform-noise family (DiffusionGemma) was never trained to read
UNIFORM_NOISE_ESTIMATORS = ("uniform_staircase",)

EstimatorConfig = Annotated[
    Union[
        MeanFieldConfig,
        ElboMCConfig,
        BlockRandomConfig,
        SPGSandwichConfig,
        CoupledConfig,
        TrajectoryConfig,
        StaircaseConfig,
        UniformStaircaseConfig,
    ],
    Field(discriminator="name"),
]
