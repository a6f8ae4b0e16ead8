"""A statistic that carries how it combines, from the loss to metrics.jsonl.

``Stat`` is a float (it logs, compares and adds like one) with its reduction and its weight:

    mean    a weighted mean: Σ w·v / Σ w (``weight``: its denominator, e.g. the rows it covers)
    share   a part of a globally normalised total: its mean over inner iterations
    max     the largest value (min: the smallest)
    count   summed (skipped updates, samples, tokens)
    last    a running total: its latest value

``replicated``: the value is already the same on every learner rank (the engine all-reduced it),
so over ranks rank 0's value is taken. One reducer, ``combine``, merges the records of the inner
iterations of a step (learner/worker.py) and of the learner ranks (coordinator/decisions/step_metrics.py);
inside an update the engine sums and all-reduces the same reductions as tensors
(learner/engine.py). No torch here: the control plane reads these.
"""
from __future__ import annotations

from enum import Enum
from typing import Literal, Mapping, Sequence


class Reduce(str, Enum):
    MEAN = "mean"
    SHARE = "share"
    MAX = "max"
    MIN = "min"
    COUNT = "count"
    LAST = "last"


class Stat(float):
    reduce: Reduce
    weight: float
    replicated: bool

    def __new__(cls, value: float, reduce: Reduce = Reduce.MEAN, weight: float = 1.0,
                replicated: bool = False) -> "Stat":
        stat = super().__new__(cls, value)
        stat.reduce, stat.weight, stat.replicated = Reduce(reduce), float(weight), replicated
        return stat

    def __reduce__(self) -> tuple:  # pickles (Ray) with its reduction
        return Stat, (float(self), self.reduce, self.weight, self.replicated)

    def __repr__(self) -> str:
        return f"Stat({float(self)!r}, {self.reduce.value})"


def combine(records: Sequence[Mapping[str, float]], across: Literal["iterations", "ranks"]) -> dict[str, Stat]:
    """One record from several, each key by its own reduction (a plain float: a replicated mean).
    ``across`` ranks, a replicated value is rank 0's; keys in the first record's order."""
    out: dict[str, Stat] = {}
    for key in records[0]:
        stats = [r[key] if isinstance(r[key], Stat) else Stat(r[key], replicated=True) for r in records if key in r]
        first = stats[0]
        if across == "ranks" and first.replicated:
            value = float(first)
        elif first.reduce is Reduce.MAX:
            value = max(float(s) for s in stats)
        elif first.reduce is Reduce.MIN:
            value = min(float(s) for s in stats)
        elif first.reduce is Reduce.COUNT:
            value = sum(float(s) for s in stats)
        elif first.reduce is Reduce.LAST:
            value = float(stats[-1])
        else:
            value = sum(s.weight * float(s) for s in stats) / sum(s.weight for s in stats)
        out[key] = Stat(value, first.reduce, sum(s.weight for s in stats), first.replicated)
    return out
