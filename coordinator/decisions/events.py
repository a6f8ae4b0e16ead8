"""The scheduler's language: events in (what happened), commands out (what to do). No Ray here.

The runtime (coordinator/runtime/executor.py) turns every command into Ray calls and every finished, failed
or late call into an event; the scheduler (coordinator/decisions/scheduler.py) decides. A call the scheduler
waits for carries a ``CallId`` it chose, so that a late answer from a worker that was already
replaced is recognised and ignored. Events that time a phase carry ``at`` (the runtime's
``time.perf_counter()`` when it saw them); the scheduler reads no clock of its own.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional, Union

from stabledrl.common.stats import Stat
from stabledrl.common.types import Episode, EvalResult, WorkerInfo
from stabledrl.coordinator.decisions.commands import (  # noqa: F401  (the scheduler's language in one place: ev.Push, ev.PushDone)
    CallId,
    ProtocolRunner,
    StartWorker,
    RemoveWorker,
    Generate,
    SetupWorkerPush,
    LoadWeights,
    Push,
    Train,
    Evaluate,
    StartProtocol,
    Complete,
    FinishProtocol,
    Checkpoint,
    PollControl,
    Record,
    Log,
    Stop,
    RuntimeCommand,
    DriverCommand,
    Command,
)

Failure = Literal["died", "raised", "timed_out"]  # the process died; the call raised; no answer in time


class ActorFailure(RuntimeError):
    """The job stops: an actor failed or did not answer in time; the message names it and the call."""


def resume_hint(output_dir: object) -> str:
    """How a stopped job continues (every message that ends a job says it the same way)."""
    return f"`stabledrl train --resume {output_dir}` continues from its last checkpoint"


# ---- events ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobStarted:
    """The actors of the job's start are up (RolloutPool.start, learner ranks started)."""

    workers: dict[int, WorkerInfo]  # index -> RolloutWorker.ready()
    learner_ranks: int
    startup: dict[str, float] = field(default_factory=dict)  # time/startup_* of step 1's record


@dataclass(frozen=True)
class StartupTimed:
    """The job's start is over (actors up, a resume restored): its phases' seconds, which step 1's
    record carries (time/startup_*)."""

    startup: dict[str, float]


@dataclass(frozen=True)
class WorkerStarted:
    call: CallId
    info: WorkerInfo


@dataclass(frozen=True)
class RolloutDone:
    call: CallId
    episodes: list[Episode]
    reward_calls: dict[str, float] = field(default_factory=dict)  # by outcome: calls, ok, failed, ...


@dataclass(frozen=True)
class WeightsLoaded:
    call: CallId
    version: int


@dataclass(frozen=True)
class EvalDone:
    call: CallId
    version: int
    result: EvalResult


@dataclass(frozen=True)
class CallFailed:
    """A worker call (rollout, weights, start, evaluation) or the control poll failed or was late."""

    call: CallId
    failure: Failure
    detail: str  # one line: the cause, or how long it was waited for
    node_alive: bool = True  # False: the worker's node left the cluster with it
    placeable: bool = True  # False: no node left in the cluster could ever hold a rollout worker


@dataclass(frozen=True)
class RankOutcome:
    rank: int
    outcome: Literal["ok", "died", "raised", "running"]
    detail: str = ""


@dataclass(frozen=True)
class StepDone:
    step: int
    results: list[dict[str, Stat]]  # one per learner rank, rank order
    train_s: float
    at: float = 0.0


@dataclass(frozen=True)
class LearnerFailed:
    """A learner call (a step, a push, a checkpoint) failed, or one rank did not answer in time."""

    what: str  # "step 4", "weights version 3"
    ranks: list[RankOutcome]
    timeout_s: Optional[float] = None  # set when a rank was late (it is still running)

    def describe(self) -> str:
        """What failed: a rank that died first (its peers then fail in their collectives), then
        ranks that raised, then ranks still running (stalled, or waiting for the others)."""
        name = lambda r: f"learner rank {r.rank} ({self.what})"  # noqa: E731
        parts = [f"{name(r)} died ({r.detail})" for r in self.ranks if r.outcome == "died"]
        parts += [f"{name(r)} failed: {r.detail}" for r in self.ranks if r.outcome == "raised"]
        running = [name(r) for r in self.ranks if r.outcome == "running"]
        if running and self.timeout_s is not None:
            parts.append(f"no answer within {self.timeout_s:.0f} s from {', '.join(running)}")
        elif running:
            parts.append(f"still running: {', '.join(running)}")
        return "; ".join(parts)


@dataclass(frozen=True)
class PushDone:
    version: int
    push_s: float
    at: float = 0.0
    staged: bool = False  # the receivers staged it (weights.staging): each applies it with a LoadWeights


@dataclass(frozen=True)
class PushFailed:
    """A collective push failed: ``died`` names the receivers whose processes died during it;
    ``retry``: the next group is built over another transport (``auto``'s peer pull failed: the
    broadcast from now on), so the push is made again."""

    version: int
    died: tuple[int, ...]
    detail: str
    retry: bool = False


@dataclass(frozen=True)
class CheckpointDone:
    """The checkpoint's files are written (a background save: its learner files are being written,
    ``background``; CheckpointWritten follows once they are durable)."""

    path: str
    background: bool = False


@dataclass(frozen=True)
class CheckpointWritten:
    """A background save (``run.async_checkpoint``) is over: ``complete`` when every learner
    rank's files were durable and the coordinator's files and ``latest`` followed, else it was not
    written in time and stays incomplete (a resume takes the checkpoint before)."""

    path: str
    seconds: float  # since the save began
    complete: bool = True

    @property
    def line(self) -> str:
        if self.complete:
            return f"checkpoint: {self.path} complete ({self.seconds:.1f} s after it started)"
        return (f"checkpoint: {self.path} was not written in {self.seconds:.0f} s; it stays incomplete (a resume "
                "takes the one before)")


@dataclass(frozen=True)
class ControlPolled:
    call: CallId
    requested: Optional[int]  # the worker count `stabledrl scale` asked for since the last poll
    room: bool  # the cluster has resources for one more worker (autoscale)


@dataclass(frozen=True)
class ProtocolStarted:
    """The protocol evaluation's units still to run at this step (a rerun skips graded ones)."""

    units: int
    note: str = ""  # a line to log (what earlier runs already graded), or nothing


@dataclass(frozen=True)
class UnitDone:
    """A protocol unit's completions came back (the runtime graded and appended them)."""

    call: CallId


@dataclass(frozen=True)
class ProtocolDone:
    metrics: dict[str, float]  # protocol/<benchmark>@<length> (0..1), protocol/time_s
    line: str  # the log line with the table's values and where it was written


@dataclass(frozen=True)
class Stalled:
    """The runtime has no call to wait for (the scheduler asked for nothing it could finish)."""


Event = Union[
    JobStarted,
    StartupTimed,
    WorkerStarted,
    RolloutDone,
    WeightsLoaded,
    EvalDone,
    CallFailed,
    StepDone,
    LearnerFailed,
    PushDone,
    PushFailed,
    CheckpointDone,
    CheckpointWritten,
    ControlPolled,
    ProtocolStarted,
    UnitDone,
    ProtocolDone,
    Stalled,
]

