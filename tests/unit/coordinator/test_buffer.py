"""GroupBuffer: exactly-once delivery, the drop rule at take time, admission order, freed places."""
from __future__ import annotations

import torch

from stabledrl.common.types import Episode, Group, Sample
from stabledrl.coordinator.decisions.buffer import GroupBuffer
from stabledrl.coordinator.decisions.staleness import StalenessController


def episode(uid: int, version: int, samples: int = 2) -> Episode:
    group = Group(f"p{uid}", [
        Sample(sample_id=f"p{uid}/{i}", prompt_id=f"p{uid}", index=i, prompt_ids=torch.tensor([5]),
               completion_ids=torch.tensor([6, 1]), completion_length=2, reward=float(i), policy_version=version)
        for i in range(samples)
    ])
    return Episode(uid=uid, prompt_id=f"p{uid}", group=group if samples else None, worker=0)


def admitted(eta: int, batch: int, n: int) -> tuple[StalenessController, GroupBuffer]:
    control = StalenessController(eta, batch)
    assert control.try_start(n)
    return control, GroupBuffer(control)


def test_take_returns_the_oldest_uids_first_and_none_until_enough():
    control, buffer = admitted(eta=1, batch=2, n=3)
    for uid in (2, 0):
        buffer.add(episode(uid, version=0))
    assert buffer.take(3) is None and len(buffer) == 2  # nothing is taken from a short buffer
    buffer.add(episode(1, version=0))
    assert [e.uid for e in buffer.take(2)] == [0, 1]
    assert control.consumed == 2 and control.buffered == 1 and control.in_flight == 0


def test_a_uid_delivered_twice_counts_once():
    control, buffer = admitted(eta=0, batch=2, n=2)
    assert buffer.add(episode(0, 0)) and not buffer.add(episode(0, 0))
    assert buffer.duplicates == 1 and control.buffered == 1 and control.in_flight == 1


def test_groups_older_than_eta_are_dropped_counted_and_free_their_place():
    control, buffer = admitted(eta=1, batch=1, n=2)
    buffer.add(episode(0, version=0))
    buffer.add(episode(1, version=0))
    control.advance()
    control.advance()  # learner at version 2: both groups have staleness 2 > η = 1
    assert buffer.take(1) is None
    assert len(buffer) == 0 and control.dropped_total == 2
    assert control.capacity() == (1 + 2 + 1) * 1  # dropped units no longer hold admission places
    assert control.step_metrics()["staleness/dropped"] == 2


def test_a_fresh_group_survives_next_to_a_stale_one():
    control, buffer = admitted(eta=1, batch=1, n=2)
    buffer.add(episode(0, version=0))
    control.advance()
    control.advance()
    assert control.try_start(1)
    buffer.add(episode(5, version=2))
    assert [e.uid for e in buffer.take(1)] == [5]
    assert control.dropped_total == 1


def test_an_episode_without_samples_releases_its_admission():
    control, buffer = admitted(eta=0, batch=2, n=2)
    assert not buffer.add(episode(0, 0, samples=0))
    assert buffer.empty == 1 and control.in_flight == 1 and control.capacity() == 1


def test_pending_uids_list_what_a_checkpoint_must_requeue():
    _, buffer = admitted(eta=1, batch=2, n=2)
    buffer.add(episode(3, 0))
    buffer.add(episode(1, 0))
    assert buffer.pending_uids() == [(1, "p1"), (3, "p3")]
