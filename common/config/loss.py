"""Loss configs: one StrictModel per registered loss, a discriminated union on ``name``.

Every field carries the released default of the method it configures (docs/algorithms.md §3). The
learner receives this section only; ``stabledrl.learner.losses.get_loss(cfg.name)`` finds the function.

    loss: {name: stabledrl, clip_max: 5.0}
    loss: {name: dipod, beta: 0.05, base: {name: spg}}
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Field, model_validator

from stabledrl.common.config.base import StrictModel, validate

# "auto": per-token values where the estimator gives them (mean_field, coupled, trajectory),
# the sequence form otherwise. "token" fails loudly when the estimator gives none.
Level = Literal["auto", "token", "sequence"]


class GrpoLossConfig(StrictModel):
    """GRPO (arXiv 2402.03300) with d1's released defaults (arXiv 2504.12216)."""

    name: Literal["grpo"] = "grpo"
    clip_eps: float = Field(0.5, gt=0.0, description="ε of clip(ρ, 1−ε, 1+ε); d1 uses 0.5")
    kl_beta: float = Field(
        0.04, ge=0.0, description="β of the k3 KL to the reference policy; d1 uses 0.04, 0 disables it"
    )
    level: Level = Field("auto", description="token or sequence ratios; d1 uses per-token (mean-field) ratios")


class StableDrlLossConfig(StrictModel):
    """StableDRL (arXiv 2603.06743) as released for LLaDA-8B."""

    name: Literal["stabledrl"] = "stabledrl"
    clip_max: float = Field(5.0, gt=0.0, description="C: log w is clipped at log C whatever the sign of A; released 5")
    clip_min: Optional[float] = Field(
        None, gt=0.0, description="optional lower bound on w (the paper's two-sided form); released: none"
    )

    @model_validator(mode="after")
    def _bounds_ordered(self) -> "StableDrlLossConfig":
        if self.clip_min is not None and self.clip_min >= self.clip_max:
            raise ValueError(f"clip_min ({self.clip_min}) must be below clip_max ({self.clip_max})")
        return self


class SpgLossConfig(StrictModel):
    """SPG (arXiv 2510.09541): L = −Σ|o_i| A_i ℓ_SPG(o_i) / Σ|o_i|; no ratio, nothing to tune here
    (the sandwich's ω and β belong to the spg_sandwich estimator)."""

    name: Literal["spg"] = "spg"


class Wd1LossConfig(StrictModel):
    """wd1 (arXiv 2507.08838): advantage-softmax weighted likelihood; no ratio, no old policy."""

    name: Literal["wd1"] = "wd1"


class DppoLossConfig(StrictModel):
    """DPPO (arXiv 2602.04879): divergence masks anchored at the behaviour policy μ."""

    name: Literal["dppo"] = "dppo"
    divergence: Literal["binary_tv", "binary_kl"] = Field(
        "binary_tv", description="which trust region; released runs use binary_tv"
    )
    tv_delta: float = Field(0.15, gt=0.0, description="δ of the binary-TV mask |π − μ|; released 0.15")
    kl_delta: float = Field(0.05, gt=0.0, description="δ of the binary-KL mask KL(Bern(μ)‖Bern(π)); released 0.05")
    ratio_cap: float = Field(
        1e4, gt=0.0, description="C of sg(min(r, C)); the released script sets 1e4 (no truncation in practice)"
    )
    level: Level = Field("auto", description="per-token values where they exist, the sequence form otherwise")


class DrpoLossConfig(StrictModel):
    """DRPO (arXiv 2606.09821): smooth advantage-weighted quadratic regulariser on π − μ."""

    name: Literal["drpo"] = "drpo"
    delta: float = Field(12.5, gt=0.0, description="δ of |A|·μ·(r−1)²/(2δ); released 12.5")
    level: Level = Field("auto", description="per-token values where they exist, the sequence form otherwise")


BaseLossConfig = Annotated[
    Union[GrpoLossConfig, StableDrlLossConfig, SpgLossConfig, Wd1LossConfig, DppoLossConfig, DrpoLossConfig],
    Field(discriminator="name"),
]


class DipodLossConfig(StrictModel):
    """DiPOD (arXiv 2606.13795): any base loss − β_D · mean_i ELBO_θ(o_i)."""

    name: Literal["dipod"] = "dipod"
    beta: float = Field(0.05, ge=0.0, description="β_D of the on-policy ELBO regulariser; released 0.05")
    base: BaseLossConfig = Field(
        description="the policy-gradient loss it regularises (any non-dipod loss; the paper pairs it with several, "
        "so there is no single released default)"
    )


LossConfig = Annotated[
    Union[
        GrpoLossConfig,
        StableDrlLossConfig,
        SpgLossConfig,
        Wd1LossConfig,
        DppoLossConfig,
        DrpoLossConfig,
        DipodLossConfig,
    ],
    Field(discriminator="name"),
]

class _Section(StrictModel):
    loss: LossConfig


def parse_loss_config(data: dict[str, Any], source: str = "loss") -> LossConfig:
    """Validate a ``loss:`` section; a bad section raises ConfigError naming the dotted field path."""
    return validate(_Section, {"loss": data}, source=f"{source} config").loss
