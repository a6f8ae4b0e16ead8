"""The supervised warm start (so a tiny random model has something for RL to sharpen) and evaluation.

    warmstart: {steps: 300, batch_size: 64, lr: 1.0e-3}
    eval: {num_prompts: 200, samples_per_prompt: 1, seed: 1234}

The warm start is LLaDA's masked-diffusion SFT (``learner/sft.py``) on the task's training rows and
their reference completions; ``stabledrl/recipes/warmstart.py`` caches the result under ``cache_dir`` by
a hash of everything that determines it. Evaluation (``rollout/evaluate.py``) samples the held-out
rows with the run's own sampler settings.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from pydantic import Field

from stabledrl.common.config.base import StrictModel
from stabledrl.common.config.protocol import ProtocolConfig


class WarmStartConfig(StrictModel):
    """A short masked-diffusion SFT stage on the task's reference completions, cached by content hash."""

    steps: int = Field(300, ge=1, description="SFT optimizer steps")
    seed: Optional[int] = Field(
        None,
        description="seed of the SFT's row order and masks; "
        "None: run.seed (then every RL seed gets its own warm start)",
    )
    threads: Optional[int] = Field(
        None, ge=1, description="torch CPU threads the SFT runs with (None: the process's current count, usually the "
        "number of cores); the weights depend on it, since float sums are reduced in a different order"
    )
    batch_size: int = Field(64, ge=1, description="(prompt, reference completion) pairs per step")
    micro_batch_size: Optional[int] = Field(
        None, ge=1, description="rows per forward (gradient accumulation inside a step); None = the whole batch"
    )
    lr: float = Field(1e-3, gt=0.0, description="AdamW learning rate (constant after the warm-up)")
    warmup_steps: int = Field(0, ge=0, description="lr ramps linearly over the first warmup_steps steps")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW decoupled weight decay")
    grad_clip: float = Field(1.0, ge=0.0, description="clip the global gradient L2 norm to this value; 0 disables")
    mask_eps: float = Field(
        1e-3,
        gt=0.0,
        lt=1.0,
        description="ε of the mask probability p = (1 - ε) t + ε, t ~ U(0, 1) (LLaDA's forward_process)",
    )
    log_every: int = Field(50, ge=1, description="print the mean SFT loss every N steps")
    cache_dir: Path = Field(Path(".cache/warmstart"), description="where the warm-started model is cached")


class EvalConfig(StrictModel):
    """Held-out evaluation with the run's sampler settings (``temperature`` may differ: LLaDA's and
    d1's evaluations decode greedily, T = 0, while RL samples at T > 0)."""

    every: int = Field(0, ge=0, description="evaluate every N steps (0: only before and after training)")
    num_prompts: int = Field(200, ge=1, description="held-out prompts evaluated (the first N held-out rows)")
    samples_per_prompt: int = Field(
        1, ge=1, description="n samples per prompt: pass@1 is their mean, pass@n the unbiased pass@k at k = n"
    )
    seed: int = Field(
        1234,
        description="sampling seed of every evaluation; "
        "the same seeds at every step make BEFORE and AFTER a paired comparison",
    )
    temperature: Optional[float] = Field(
        None, ge=0.0, description="sampling temperature of the evaluation (0: greedy); null: the sampler's own"
    )
    protocol: Optional[ProtocolConfig] = Field(
        None, description="also evaluate a published protocol at the same points (before, every N steps, after) on "
        "the rollout workers, e.g. {name: d1, gen_lengths: [256], benchmarks: {gsm8k: {num_prompts: 200}}}; "
        "`stabledrl eval --protocol` runs it offline"
    )
    final_window: int = Field(
        1,
        ge=1,
        description="the job's last line also gives the mean pass@1 of the last N evaluations (the final one "
        "and those every `every` steps before it): one evaluation moves by a few points from step to step; "
        "1: only AFTER",
    )

    def sampler_for(self, sampler: Any) -> Any:
        """The run's sampler config with this evaluation's temperature."""
        if self.temperature is None or self.temperature == sampler.temperature:
            return sampler
        return sampler.model_copy(update={"temperature": self.temperature})

    def describe(self, sampler: Any) -> str:
        t = self.sampler_for(sampler).temperature
        return "greedy" if t == 0 else f"T = {t:g}"
