"""The push's clocks in one place (common/transport/clocks.py): an actor's parts of a push go on
its clock as push_<part>, a transport's own measurements are read once, and a step's record gets
``time/push/*``, the slowest end of each part."""
from __future__ import annotations

from stabledrl.common.actor_time import ActorClock, ActorTimes
from stabledrl.common.transport.clocks import PUSH_PARTS, STAGE, PushTimer, push_metrics


class Broadcast:
    """A sending end after a transfer that waited for its receivers to join."""

    waited_s = 0.25


class Pull:
    """A receiving end after a pull that measured its wait and its parts (as peer does)."""

    waited_s = 0.5
    parts_s = {"map": 0.5, "copy": 1.5}


def test_a_timer_puts_every_part_on_the_actors_clock_and_reads_the_transports_own():
    learner = ActorClock(within=PUSH_PARTS)
    timer = PushTimer(learner)
    with timer.part():
        with timer.part("send"):
            pass
        timer.transfer(Broadcast())
        timer.transfer(object())  # a transport that measures nothing adds nothing
    assert set(learner.busy) == {"push", "push_send", "push_wait"} and learner.busy["push_wait"] == 0.25
    assert learner.snapshot()["clock/main_busy"] == learner.busy["push"]  # its parts are not counted twice
    worker = ActorClock(background=STAGE)
    timer = PushTimer(worker)
    with timer.part("stage"):
        pass
    timer.transfer(Pull(), "stage")
    with timer.part("receive"):
        pass
    assert set(worker.busy) == {"push_stage", "push_stage_wait", "push_stage_map", "push_stage_copy", "push_receive"}
    assert worker.busy["push_stage_copy"] == 1.5
    assert worker.snapshot()["clock/main_busy"] == worker.busy["push_receive"]  # staging runs beside the requests


def test_a_steps_record_reports_the_slowest_end_of_each_part_as_time_push():
    times = ActorTimes()
    times.update("learner0", {"clock/wall": 10.0, "clock/main_busy": 3.0, "clock/push": 3.0, "clock/push_send": 2.0,
                              "clock/push_wait": 0.5, "clock/train": 1.0})
    times.update("learner1", {"clock/wall": 10.0, "clock/main_busy": 3.0, "clock/push": 2.5, "clock/push_send": 2.2})
    times.update("rollout0", {"clock/wall": 10.0, "clock/main_busy": 1.0, "clock/push_stage": 4.0,
                              "clock/push_stage_copy": 3.0, "clock/pushed_rows": 7.0})
    out = push_metrics(times.step_metrics())
    assert out == {"time/push/total": 3.0, "time/push/send": 2.2, "time/push/wait": 0.5, "time/push/stage": 4.0,
                   "time/push/stage_copy": 3.0}
    assert push_metrics({**out, "time/weight_push": 1.0}) == {}  # its own keys and the scheduler's are not parts
