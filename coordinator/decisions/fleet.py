"""The rollout workers as the scheduler sees them: indices, states, restarts, versions, and the
calls it waits for on each.

A worker is known by its index ("rollout worker 3"), which a replacement keeps and a new worker
never reuses; ``restarts`` counts its replacements and tells one process of that index from the
next, so an answer from an earlier process is recognised (``take``) and ignored. Its life:

    starting ──▶ active ──▶ retiring ──▶ (removed)          object-store push
    starting ──▶ syncing ──▶ active ...                      collective push: joins at the next push
    starting, syncing ──▶ retiring                           the fleet shrinks before it is active
    any state ──▶ (removed)                                  lost, dropped, retired; ``replace``: a new
                                                             process of the index, starting

``starting``: the process is loading its model. ``syncing``: up, waiting for a push that includes
it. ``active``: gets requests. ``retiring``: gets none; removed once its calls are back.

``Fleet`` is the only writer of a worker's state, info and version: ``move`` makes every state
transition and refuses one the diagram above does not have (``TRANSITIONS``); the state machines
(coordinator/decisions/versions.py, fleet_policy.py) read workers and ask the fleet to move them.
No Ray here: the processes and their placements are the runtime's (coordinator/runtime/pool.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from stabledrl.common.types import PromptRequest, WorkerInfo

State = Literal["starting", "syncing", "active", "retiring"]
# the diagram above: a state -> the states a worker in it may move to (removal: ``remove``, from any)
TRANSITIONS: dict[State, frozenset[State]] = {
    "starting": frozenset({"syncing", "active", "retiring"}),
    "syncing": frozenset({"active", "retiring"}),
    "active": frozenset({"retiring"}),
    "retiring": frozenset(),
}
CallKind = Literal["rollout", "load", "start", "eval", "complete", "poll"]
LossAction = Literal["remove", "drop", "give_up", "replace"]


@dataclass
class WorkerState:
    index: int
    state: State = "starting"
    restarts: int = 0  # replacements of this index after its process died or hung
    version: int = 0  # weights version held (acknowledged)
    info: dict[str, Any] = field(default_factory=dict)  # RolloutWorker.ready(): node_id, pid, device, ...

    @property
    def name(self) -> str:
        return f"rollout worker {self.index}"


@dataclass
class Call:
    """A call the scheduler waits for: on a worker (rollout, load, start, eval, complete: a protocol
    unit) or the control poll."""

    kind: CallKind
    what: str  # names it in messages: "rollout worker 2 (prompts 8..11)"
    worker: int = -1
    incarnation: int = 0  # the worker's restarts when the call was made
    requests: tuple[PromptRequest, ...] = ()


class IllegalTransition(RuntimeError):
    """A state machine asked for a worker transition the diagram does not have (a bug, not a fault)."""


class Fleet:
    def __init__(self, *, target: int, min_workers: int, max_workers: int, max_restarts: int, autoscale: bool) -> None:
        self.workers: dict[int, WorkerState] = {}  # insertion order: a replacement keeps its predecessor's place
        self.calls: dict[int, Call] = {}
        self.next_index = self.next_call = 0
        self.target = target  # the size the fleet is steered to
        self.min_workers, self.max_workers, self.max_restarts = min_workers, max_workers, max_restarts
        self.autoscale = autoscale
        self.nodes_left: set[str] = set()  # Ray nodes known to have left the cluster (with workers on them)

    # ---- workers --------------------------------------------------------------------------
    def __getitem__(self, index: int) -> WorkerState:
        return self.workers[index]

    def get(self, index: int) -> Optional[WorkerState]:
        return self.workers.get(index)

    def active(self) -> list[WorkerState]:
        return [w for w in self.workers.values() if w.state == "active"]

    def live(self) -> list[WorkerState]:
        """Workers that count towards the fleet's size: starting, syncing or active."""
        return [w for w in self.workers.values() if w.state != "retiring"]

    def alive(self) -> list[WorkerState]:
        """Live workers not on a node known to have left: those the job can count on (a worker on a
        node that left is live until its own loss is handled)."""
        return [w for w in self.live() if w.info.get("node_id") not in self.nodes_left]

    def node_left(self, worker: WorkerState) -> list[WorkerState]:
        """``worker``'s node left the cluster: remember it, and return the other live workers on
        that node (lost with it, whether or not their own calls have failed yet)."""
        node = worker.info.get("node_id")
        if node is None:
            return []
        self.nodes_left.add(node)
        return [w for w in self.live() if w is not worker and w.info.get("node_id") == node]

    def serving(self) -> list[WorkerState]:
        """Workers up and in the job (syncing or active): what ``rollout/workers`` counts; a lost
        worker's replacement counts once it has started."""
        return [w for w in self.workers.values() if w.state in ("syncing", "active")]

    def versions(self) -> list[int]:
        """Weights version of each active worker, by index."""
        return [w.version for w in sorted(self.active(), key=lambda w: w.index)]

    def status(self) -> dict[str, int]:
        states = [w.state for w in self.workers.values()]
        return {"workers": len(self.live()), "active": states.count("active"), "starting": states.count("starting"),
                "retiring": states.count("retiring")}

    # ---- the only writers of a worker ----------------------------------------------------------
    def move(self, worker: WorkerState, to: State) -> None:
        """``worker`` goes to state ``to``; IllegalTransition when the diagram has no such edge."""
        if to not in TRANSITIONS[worker.state]:
            raise IllegalTransition(f"{worker.name}: {worker.state} -> {to} is not a transition of a rollout worker "
                                    "(coordinator/decisions/fleet.py)")
        worker.state = to

    def came_up(self, worker: WorkerState, info: WorkerInfo) -> None:
        """The worker's process answered its start (RolloutWorker.ready(): node_id, pid, device, ...)."""
        worker.info = dict(info)

    def holds(self, worker: WorkerState, version: int) -> None:
        """The worker acknowledged weights ``version``."""
        worker.version = version

    def add(self) -> WorkerState:
        worker = WorkerState(self.next_index)
        self.workers[worker.index] = worker
        self.next_index += 1
        return worker

    def replace(self, worker: WorkerState) -> WorkerState:
        new = WorkerState(worker.index, restarts=worker.restarts + 1)
        self.workers[worker.index] = new
        return new

    def remove(self, worker: WorkerState) -> None:
        self.forget(worker.index)
        self.workers.pop(worker.index, None)

    def loss_action(self, worker: WorkerState, node_alive: bool) -> LossAction:
        """What a lost process of ``worker`` leads to: a retiring worker is removed; one lost with its
        node is dropped while ``min_workers`` others remain (the cluster shrank); one whose restarts
        are used up ends the job; any other is replaced in place. Workers on a node that left do
        not count as remaining."""
        if worker.state == "retiring":
            return "remove"
        if not node_alive and len([w for w in self.alive() if w is not worker]) >= self.min_workers:
            return "drop"
        return "give_up" if worker.restarts >= self.max_restarts else "replace"

    def resize(self, requested: Optional[int], room: bool) -> tuple[list[WorkerState], list[WorkerState]]:
        """Steer to ``requested`` workers (`stabledrl scale`; it turns autoscale off), or with
        autoscale one more when the cluster has ``room``. Returns (workers added: starting,
        workers retiring: the newest beyond the target)."""
        if requested is not None:
            self.autoscale, self.target = False, requested
        live = self.live()
        if self.autoscale and len(live) < self.max_workers and room:
            self.target = max(self.target, len(live) + 1)
        added = [self.add() for _ in range(self.target - len(live))]
        excess = sorted(live, key=lambda w: w.index, reverse=True)[: max(0, len(live) - self.target)]
        for worker in excess:
            self.move(worker, "retiring")
        return added, excess

    # ---- calls ----------------------------------------------------------------------------
    def call(self, kind: CallKind, what: str, worker: Optional[WorkerState] = None,
             requests: tuple[PromptRequest, ...] = ()) -> int:
        """Register a call; returns its id (the runtime answers with it)."""
        self.next_call += 1
        index, incarnation = (worker.index, worker.restarts) if worker is not None else (-1, 0)
        self.calls[self.next_call] = Call(kind, what, index, incarnation, requests)
        return self.next_call

    def take(self, call: int) -> Optional[tuple[Call, Optional[WorkerState]]]:
        """The call and its worker as it is now, the call forgotten; None if the call is not
        waited for any more (its worker was lost and its calls forgotten)."""
        found = self.calls.pop(call, None)
        if found is None:
            return None
        worker = self.workers.get(found.worker)
        return found, worker if worker is not None and worker.restarts == found.incarnation else None

    def forget(self, index: int) -> list[tuple[int, Call]]:
        """Forget every call of worker ``index`` (its process is gone); returns them."""
        mine = [c for c, call in self.calls.items() if call.worker == index]
        return [(c, self.calls.pop(c)) for c in mine]

    def busy(self, index: int) -> bool:
        return any(call.worker == index for call in self.calls.values())

    def queued(self, index: int) -> int:
        """Rollout requests sent to worker ``index`` and not back."""
        return sum(1 for call in self.calls.values() if call.kind == "rollout" and call.worker == index)

    def waiting(self) -> bool:
        """Some worker call is out (the control poll does not count)."""
        return any(call.kind != "poll" for call in self.calls.values())

    def requests(self) -> list[PromptRequest]:
        return [r for call in self.calls.values() for r in call.requests]
