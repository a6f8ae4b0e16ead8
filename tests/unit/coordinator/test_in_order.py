"""In-order batches (algorithm.in_order): whatever order rollouts finish in, batch b is exactly
uids b·B .. (b+1)·B − 1 and every one of them was sampled at version max(0, b − η), the schedule
that makes an asynchronous run a function of (config, seed) and its resume exact. Simulated with
the real StalenessController and GroupBuffer: admission at each version advance (every admitted
request sent at once), completions in a random order, the learner taking a batch as soon as
``take(B, before=oldest outstanding uid)`` gives one."""
from __future__ import annotations

import random

import pytest
import torch

from stabledrl.common.types import Group, Sample
from stabledrl.common.types import Episode
from stabledrl.coordinator.decisions.buffer import GroupBuffer
from stabledrl.coordinator.decisions.staleness import StalenessController


def finished(uid: int, version: int) -> Episode:
    sample = Sample(sample_id=f"p{uid}/0", prompt_id=f"p{uid}", index=0, prompt_ids=torch.tensor([1]),
                    completion_ids=torch.tensor([2]), completion_length=1, reward=0.0, policy_version=version)
    return Episode(uid=uid, prompt_id=f"p{uid}", group=Group(f"p{uid}", [sample]), worker=0)


def simulate(eta: int, batch: int, steps: int, seed: int, in_order: bool = True) -> list[list[tuple[int, int]]]:
    """[(uid, sampling version)] of every batch the learner trained on."""
    rng = random.Random(seed)
    staleness = StalenessController(eta, batch)
    buffer = GroupBuffer(staleness)
    next_uid, outstanding, trained = 0, [], []  # outstanding: (uid, version sampled with)
    while len(trained) < steps:
        while staleness.try_start(1):  # in order: everything admissible is sent now, at this version
            outstanding.append((next_uid, staleness.version))
            next_uid += 1
        before = min(u for u, _ in outstanding) if in_order and outstanding else None
        taken = buffer.take(batch, before=before)
        if taken is not None:
            trained.append([(e.uid, e.group.policy_version) for e in taken])
            staleness.advance()
            continue
        uid, version = outstanding.pop(rng.randrange(len(outstanding)))  # any request may finish next
        buffer.add(finished(uid, version))
    return trained


@pytest.mark.parametrize("eta", [0, 1, 2, 3])
def test_in_order_batches_are_a_function_of_the_schedule_only(eta):
    batch, steps = 4, 10
    want = [[(u, max(0, b - eta)) for u in range(b * batch, (b + 1) * batch)] for b in range(steps)]
    for seed in range(20):
        assert simulate(eta, batch, steps, seed) == want


def test_without_in_order_the_batches_depend_on_completion_order():
    runs = {tuple(map(tuple, simulate(2, 4, 6, seed, in_order=False))) for seed in range(20)}
    assert len(runs) > 1


def test_take_waits_for_an_older_uid_still_outstanding():
    staleness = StalenessController(1, 2)
    buffer = GroupBuffer(staleness)
    assert staleness.try_start(4)
    for uid in (1, 2, 3):
        buffer.add(finished(uid, 0))
    assert buffer.take(2, before=0) is None  # uid 0 is still being generated
    assert [e.uid for e in buffer.take(2)] == [1, 2]  # without the rule: the oldest finished
    buffer.add(finished(0, 0))
    assert [e.uid for e in buffer.take(2, before=None)] == [0, 3]
