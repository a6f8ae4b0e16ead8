"""The loss family: pure functions ``(LossInputs, cfg) -> LossOutput(loss, metrics)`` in one registry.

    from stabledrl.learner.losses import compute_loss, needs_whole_groups
    loss, metrics = compute_loss(inputs, cfg.loss)       # metrics: name -> Metric(value, reduce)

One module per loss (grpo, stabledrl, spg, wd1, dppo, drpo, dipod); ``inputs`` documents the global
normalisation rule every loss follows; ``advantages`` computes group-relative advantages.
"""
from stabledrl.learner.losses.advantages import group_advantages
from stabledrl.learner.losses.inputs import LossInputs, local_counts
from stabledrl.learner.losses.statistics import LossOutput, Metric, Reduce
from stabledrl.learner.losses.registry import (
    LOSSES, LossEntry, compute_loss, get_loss, needs_whole_groups, register_loss,
)

# importing the modules registers the losses
from stabledrl.learner.losses import dipod, dppo, drpo, grpo, spg, stabledrl, wd1  # noqa: E402,F401  isort: skip

__all__ = [
    "LOSSES",
    "LossEntry",
    "LossInputs",
    "LossOutput",
    "Metric",
    "Reduce",
    "compute_loss",
    "get_loss",
    "group_advantages",
    "local_counts",
    "needs_whole_groups",
    "register_loss",
]
