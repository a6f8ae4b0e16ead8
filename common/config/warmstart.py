"""The supervised warm start (so a tiny random model has something for RL to sharpen) and evaluation."""
from __future__ import annotations

from pathlib import Path

from pydantic import Field

from common.config.base import StrictModel


class WarmStartConfig(StrictModel):
    """A short masked-diffusion SFT stage on the task's reference completions, cached by content hash."""

    steps: int = Field(300, ge=1, description="SFT optimizer steps")
    batch_size: int = Field(64, ge=1, description="(prompt, reference completion) pairs per step")
    lr: float = Field(1e-3, gt=0.0, description="AdamW learning rate")
    cache_dir: Path = Field(Path(".cache/warmstart"), description="where the warm-started model is cached")


class EvalConfig(StrictModel):
    """Held-out evaluation with the run's sampler settings."""

    every: int = Field(0, ge=0, description="evaluate every N steps (0: only before and after training)")
    num_prompts: int = Field(200, ge=1, description="held-out prompts evaluated")
    samples_per_prompt: int = Field(1, ge=1, description="k for pass@k (pass@1 is averaged over the k samples)")
