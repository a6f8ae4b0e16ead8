"""The ``recipe`` section: what a published recipe reproduces and where it still departs from it.

A config under deploy/configs/recipe_*.yaml opens with this section, so that its departures are
the first thing a reader sees and something a program can read: ``stabledrl train --dry-run``
prints them, and the run's ``config.yaml`` keeps them with the results. No field here changes
what the job does.
"""
from __future__ import annotations

from pydantic import Field, field_validator

from stabledrl.common.config.base import StrictModel


class RecipeConfig(StrictModel):
    """A released training recipe this config reproduces."""

    release: str = Field(min_length=1, description="the release reproduced: its code, config files and paper")
    departures: list[str] = Field(
        default_factory=list,
        description="each remaining departure from the release on one line: what differs here, and why",
    )

    @field_validator("release")
    @classmethod
    def _one_line_release(cls, v: str) -> str:
        if "\n" in v.strip():
            raise ValueError("one line")
        return v.strip()

    @field_validator("departures")
    @classmethod
    def _one_line_each(cls, v: list[str]) -> list[str]:
        for i, line in enumerate(v):
            if not line.strip() or "\n" in line.strip():
                raise ValueError(f"departure {i} must be one non-empty line")
        return [line.strip() for line in v]
