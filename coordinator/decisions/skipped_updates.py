"""Learner updates skipped for a non-finite loss or gradient norm: each is said in the log, and
``MAX_IN_A_ROW`` of them in a row stop the job (it would end with the weights it started from)."""

from __future__ import annotations

import math
from typing import Any, Sequence

from stabledrl.coordinator.decisions import commands as cmd

MAX_IN_A_ROW = 3


class SkippedUpdates:
    def __init__(self, max_in_a_row: int = MAX_IN_A_ROW):
        self.max_in_a_row, self.in_a_row = max_in_a_row, 0

    def step_done(self, step: int, results: Sequence[dict[str, Any]]) -> list[cmd.Command]:
        if not any(r.get("train/skipped") for r in results):
            self.in_a_row = 0
            return []
        self.in_a_row += 1
        loss = float(results[0].get("train/loss", math.nan))
        norm = float(results[0].get("train/grad_norm", math.nan))
        out: list[cmd.Command] = [cmd.Log(f"warning: step {step}: the learner skipped its update (train/loss {loss:g}, "
                                          f"train/grad_norm {norm:g}); {self.in_a_row} in a row")]
        if self.in_a_row >= self.max_in_a_row:
            out.append(cmd.Stop(
                f"the learner skipped {self.in_a_row} updates in a row for a non-finite loss or gradient norm "
                f"(train/loss {loss:g} at step {step}): training would leave the model as it started. Look for huge "
                "rewards (rollout/reward_calls/out_of_range, task.reward.max_abs), a too large learner.optimizer.lr, "
                "or a loss setting that overflows; resume from the last checkpoint once fixed"))
        return out
