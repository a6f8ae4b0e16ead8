"""common/gil.py: a weight push's thread beside busy ones. ``prompt_gil`` shortens Python's switch
interval and keeps the cyclic collector from starting while any such block runs, restoring both
after the last; ``settle_heap`` freezes what an actor holds after its set-up, and only in an actor."""
from __future__ import annotations

import gc
import sys
import threading

import pytest

from stabledrl.common.gil import SWITCH_S, prompt_gil, settle_heap


def test_no_collection_starts_and_the_interval_is_short_inside_and_both_come_back_after():
    before, enabled = sys.getswitchinterval(), gc.isenabled()
    assert enabled
    with prompt_gil():
        assert not gc.isenabled() and sys.getswitchinterval() == pytest.approx(min(before, SWITCH_S))
    assert gc.isenabled() and sys.getswitchinterval() == pytest.approx(before)


def test_a_collector_switched_off_before_stays_off():
    gc.disable()
    try:
        with prompt_gil():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_overlapping_blocks_on_two_threads_restore_only_when_the_last_leaves():
    """The first block out must not restore while another still runs; the last restores what the
    first found, whatever their order."""
    before = sys.getswitchinterval()
    inside, release = threading.Event(), threading.Event()

    def other():
        with prompt_gil(1e-4):
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    try:
        with prompt_gil(3e-4):
            t.start()
            assert inside.wait(10)
        assert sys.getswitchinterval() == pytest.approx(1e-4) and not gc.isenabled()  # the other still runs
    finally:
        release.set()
        t.join(10)
    assert sys.getswitchinterval() == pytest.approx(before) and gc.isenabled()


def test_settle_heap_freezes_only_in_an_actor_unless_told():
    assert gc.get_freeze_count() == 0
    assert settle_heap() == 0 and gc.get_freeze_count() == 0  # this test process is no actor
    try:
        frozen = settle_heap(actors_only=False)
        # An object freed by its reference count leaves the frozen set, and another thread of this
        # process (the test runner's) may free a few between the two counts: at most, never more.
        assert frozen > 1000 and frozen - 100 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0
