"""The clocks of a weight push, in one place: every part of a push an actor times goes through
``PushTimer``, and ``push_metrics`` reports a step's pushes as ``time/push/*``.

A learner rank's push (``push``) is made of the GPU work the step left queued (``pending``), the
send with its ZeRO-3 gathers, settled (``send``; of it ``wait``: the transport waiting for its
receivers to join) and the memory it hands back (``release``). A rollout worker receives a push
between requests (``receive``) or stages it beside its generation on a thread of its own
(``stage``; of it ``stage_wait`` and a pull's parts: ``stage_map``, ``stage_gil``, ``stage_check``,
``stage_issue``, ``stage_copy`` and ``stage_cpu``, common/transport/peer.py). Each is an activity
``push_<part>`` of the actor's clock (common/actor_time.py), so it is reported per actor as
``time/<actor>/push_<part>`` too.

The transports measure only what they alone can see, each transfer's wait for the other end
(``waited_s``) and a pull's parts (``parts_s``); ``PushTimer.transfer`` reads them.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping

from stabledrl.common.actor_time import ActorClock

PREFIX = "push"
# a rollout worker's staging beside its generation, on a thread of its own, and its parts: waiting
# for the sender before a byte moved; a pull's mapping, a yield of the GIL, version check, issuing
# its copies, waiting for them, and the receiving thread's own CPU time over the pull
STAGE = ("push_stage", "push_stage_wait", "push_stage_map", "push_stage_gil", "push_stage_check",
         "push_stage_issue", "push_stage_copy", "push_stage_cpu")
# the parts of a learner rank's push, timed inside "push": the GPU work the step left queued, the
# send with the ZeRO-3 gathers (settled), of it the wait for the receivers to join, the memory
# handed back (cluster.colocate)
PUSH_PARTS = ("push_pending", "push_send", "push_wait", "push_release")


class PushTimer:
    """Times the parts of one actor's pushes on its clock, as ``push`` and ``push_<part>``."""

    def __init__(self, clock: ActorClock) -> None:
        self.clock = clock

    @contextlib.contextmanager
    def part(self, name: str = "") -> Iterator[None]:
        with self.clock.timed(activity(name)):
            yield

    def transfer(self, push: Any, within: str = "") -> None:
        """The last transfer's own clocks, measured by the transport ``push``: its wait for the other
        end (``<within>_wait``) and a pull's parts (``<within>_<part>``); nothing for a transport
        that measures neither."""
        waited = getattr(push, "waited_s", None)
        if waited is not None:
            self.clock.add(activity(_joined(within, "wait")), waited)
        for name, seconds in (getattr(push, "parts_s", None) or {}).items():
            self.clock.add(activity(_joined(within, name)), seconds)


def activity(part: str) -> str:
    """The actor clock's activity of a push's part: ``push``, ``push_send``, ``push_stage_wait``..."""
    return PREFIX if not part else f"{PREFIX}_{part}"


def _joined(within: str, name: str) -> str:
    return f"{within}_{name}" if within else name


def push_metrics(step: Mapping[str, float]) -> dict[str, float]:
    """``time/push/<part>`` of a step's record: the longest any actor spent on that part of the
    step's pushes (``time/<actor>/push_<part>``; ``time/push/total``: of ``push``). The ends of a
    push wait for each other, so the slowest end is the push's."""
    out: dict[str, float] = {}
    for key, seconds in step.items():
        parts = key.split("/")
        if len(parts) != 3 or parts[0] != "time" or parts[1] == PREFIX:
            continue
        name = parts[2].removeprefix(PREFIX)
        if name == parts[2] or name[:1] not in ("", "_"):  # not a push's: push_stage yes, pushed no
            continue
        name = name.removeprefix("_") or "total"
        out[f"time/push/{name}"] = max(out.get(f"time/push/{name}", 0.0), seconds)
    return out
