"""The loss registry: name -> ``LossEntry`` (the pure function plus what the learner must know).

A loss is ``fn(inputs: LossInputs, cfg) -> LossOutput(loss, metrics)``, each metric a ``Metric``
that says how it combines over micro-batches, ranks and inner iterations. ``group_coupled`` tells the learner
how it may cut a batch into micro-batches:

- group-coupled (``stabledrl``: softmax of the weights over the group; ``wd1``: softmax of the
  group's advantages): a group's rows must sit in one micro-batch, so cut by whole groups;
- otherwise every row's term depends on that row alone: cut anywhere (by samples or tokens).

``dipod`` wraps another loss and inherits its base's coupling, so ask ``needs_whole_groups(cfg)``
rather than reading the attribute when a config is at hand.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from stabledrl.common.registry import Registry
from stabledrl.learner.losses.inputs import LossInputs
from stabledrl.learner.losses.statistics import LossOutput

LossFn = Callable[[LossInputs, Any], LossOutput]


@dataclass(frozen=True)
class LossEntry:
    name: str
    fn: LossFn
    group_coupled: bool  # True: micro-batch by whole groups; False: by samples
    wraps_base: bool = False  # True: the config has a ``base`` loss whose coupling also applies

    def __call__(self, inputs: LossInputs, cfg: Any) -> LossOutput:
        return self.fn(inputs, cfg)


LOSSES: Registry[LossEntry] = Registry("loss")


def register_loss(name: str, *, group_coupled: bool, wraps_base: bool = False) -> Callable[[LossFn], LossFn]:
    """Register ``fn`` under ``name``; the function itself is returned unchanged."""

    def decorator(fn: LossFn) -> LossFn:
        LOSSES.register(name)(LossEntry(name, fn, group_coupled, wraps_base))
        return fn

    return decorator


def get_loss(name: str) -> LossEntry:
    """The entry registered as ``name``; an unknown name raises KeyError listing the valid ones."""
    return LOSSES.get(name)


def needs_whole_groups(cfg: Any) -> bool:
    """Whether the loss configured by ``cfg`` needs every group inside one micro-batch."""
    entry = get_loss(cfg.name)
    return entry.group_coupled or (entry.wraps_base and needs_whole_groups(cfg.base))


def compute_loss(inputs: LossInputs, cfg: Any) -> LossOutput:
    """Look up ``cfg.name`` and apply it: the learner's one call."""
    return get_loss(cfg.name)(inputs, cfg)
