"""Per-actor clocks (common/actor_time.py): cumulative busy seconds per activity inside an actor,
turned by the coordinator into per-step deltas whose idle time is the wall minus the main
thread's busy time, with background activities reported but not subtracted."""
from __future__ import annotations

import pytest

from stabledrl.common.actor_time import ActorClock, ActorTimes


class FakeClock(ActorClock):
    def __init__(self, background=(), within=()):
        super().__init__(background, within)
        self.now = 0.0

    def snapshot(self):
        out = super().snapshot()
        out["clock/wall"] = self.now
        return out


def test_deltas_idle_and_background_activities():
    clock, times = FakeClock(background=("push_stage",)), ActorTimes()
    clock.add("generate", 3.0)
    clock.add("score", 1.0)
    clock.add("push_stage", 2.5)  # beside the generation: not subtracted from the wall
    clock.now = 5.0
    times.update("rollout0", clock.snapshot())
    first = times.step_metrics()
    assert first["time/rollout0/wall"] == 5.0
    assert first["time/rollout0/idle"] == pytest.approx(1.0)  # 5 - (3 + 1)
    assert first["time/rollout0/push_stage"] == 2.5
    clock.add("generate", 4.0)
    clock.now = 12.0
    times.update("rollout0", clock.snapshot())
    second = times.step_metrics()
    assert second["time/rollout0/wall"] == pytest.approx(7.0)
    assert second["time/rollout0/generate"] == pytest.approx(4.0)
    assert second["time/rollout0/score"] == 0.0
    assert second["time/rollout0/idle"] == pytest.approx(3.0)
    assert times.step_metrics() == {}  # no newer snapshot: nothing to log


def test_a_restarted_actor_starts_from_zero_and_actors_are_kept_apart():
    times = ActorTimes()
    times.update("learner0", {"clock/wall": 10.0, "clock/main_busy": 8.0, "clock/train": 8.0})
    times.update("learner1", {"clock/wall": 10.0, "clock/main_busy": 6.0, "clock/train": 6.0})
    times.step_metrics()
    times.update("learner0", {"clock/wall": 2.0, "clock/main_busy": 1.5, "clock/train": 1.5})  # a new process
    out = times.step_metrics()
    assert out == {"time/learner0/wall": 2.0, "time/learner0/idle": 0.5, "time/learner0/train": 1.5}


def test_snapshot():
    clock = ActorClock()
    with clock.timed("train"):
        pass
    snap = clock.snapshot()
    assert set(snap) >= {"clock/train", "clock/wall", "clock/main_busy"}
    assert 0.0 <= snap["clock/main_busy"] == snap["clock/train"] <= snap["clock/wall"]


def test_parts_of_an_activity_are_reported_and_not_counted_twice():
    clock, times = FakeClock(within=("push_send", "push_release")), ActorTimes()
    clock.add("train", 4.0)
    clock.add("push", 3.0)  # made of the two parts below
    clock.add("push_send", 2.0)
    clock.add("push_release", 1.0)
    clock.now = 10.0
    times.update("learner0", clock.snapshot())
    out = times.step_metrics()
    assert out["time/learner0/push_send"] == 2.0 and out["time/learner0/push_release"] == 1.0
    assert out["time/learner0/idle"] == pytest.approx(3.0)  # 10 - (4 + 3), not 10 - (4 + 3 + 2 + 1)
