"""The scheduler's language: events in (what happened), commands out (what to do). No Ray here.

The runtime (coordinator/runtime.py) turns every command into Ray calls and every finished, failed
or late call into an event; the scheduler (coordinator/scheduler.py) decides. A call the scheduler
waits for carries a ``CallId`` it chose, so that a late answer from a worker that was already
replaced is recognised and ignored. Events that time a phase carry ``at`` (the runtime's
``time.perf_counter()`` when it saw them); the scheduler reads no clock of its own.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

from common.config.sampler import SamplerConfig
from common.tasks import Row
from common.types import Episode, PromptRequest, WorkerInfo
from rollout.evaluate import EvalResult

CallId = int
Failure = Literal["died", "raised", "timed_out"]  # the process died; the call raised; no answer in time


class ActorFailure(RuntimeError):
    """The job stops: an actor failed or did not answer in time; the message names it and the call."""


# ---- events ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobStarted:
    """The actors of the job's start are up (RolloutPool.start, learner ranks started)."""

    workers: dict[int, WorkerInfo]  # index -> RolloutWorker.ready()
    learner_ranks: int
    startup: dict[str, float] = field(default_factory=dict)  # time/startup_* of step 1's record


@dataclass(frozen=True)
class WorkerStarted:
    call: CallId
    info: WorkerInfo


@dataclass(frozen=True)
class RolloutDone:
    call: CallId
    episodes: list[Episode]


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
    results: list[dict[str, float]]  # one per learner rank, rank order
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
    """A collective push failed: ``died`` names the receivers whose processes died during it."""

    version: int
    died: tuple[int, ...]
    detail: str


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


Event = Union[JobStarted, WorkerStarted, RolloutDone, WeightsLoaded, EvalDone, CallFailed, StepDone, LearnerFailed,
              PushDone, PushFailed, CheckpointDone, CheckpointWritten, ControlPolled, ProtocolStarted, UnitDone,
              ProtocolDone, Stalled]


# ---- commands -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StartWorker:
    """Start a process for worker ``worker``; ``replaces``: its previous process is killed first and
    its placement reused. Answered by WorkerStarted or CallFailed."""

    call: CallId
    worker: int
    replaces: bool
    timeout_s: float


@dataclass(frozen=True)
class RemoveWorker:
    """Stop the worker's process and give its placement back; its calls are forgotten."""

    worker: int


@dataclass(frozen=True)
class Generate:
    call: CallId
    worker: int
    requests: tuple[PromptRequest, ...]
    timeout_s: float


@dataclass(frozen=True)
class SetupWorkerPush:
    """The worker's end of the object-store push (queued before its first LoadWeights)."""

    worker: int


@dataclass(frozen=True)
class LoadWeights:
    """The worker holds ``version`` before its next request. Object store: it loads the newest
    push; a staged collective push (``weights.staging``): it swaps in the copy it staged, in order
    with its requests."""

    call: CallId
    worker: int
    version: int
    timeout_s: float


@dataclass(frozen=True)
class Push:
    """Learner rank 0 sends ``version``. Object store: every worker then loads it with LoadWeights.
    Collective (``barrier``): every one of ``receivers`` takes part at once, and the push ends when
    all of them have the weights (staged: received into a second copy beside the running request,
    then applied by a LoadWeights); the scheduler sends them no new requests meanwhile."""

    version: int
    receivers: tuple[int, ...]
    barrier: bool
    timeout_s: float


@dataclass(frozen=True)
class Train:
    step: int
    version: int
    batch: list[Episode]
    timeout_s: float


@dataclass(frozen=True)
class Evaluate:
    call: CallId
    worker: int
    rows: list[Row]
    samples_per_prompt: int
    seed: int
    sampler: SamplerConfig
    timeout_s: float


@dataclass(frozen=True)
class StartProtocol:
    """Open the step's protocol evaluation (``eval.protocol``: its benchmarks encoded, results.jsonl
    under output_dir/protocol/step<N>/); answered at once by ProtocolStarted."""

    step: int


@dataclass(frozen=True)
class Complete:
    """The worker completes protocol unit ``unit`` (RolloutWorker.complete); answered by UnitDone
    or CallFailed."""

    call: CallId
    worker: int
    unit: int
    timeout_s: float


@dataclass(frozen=True)
class FinishProtocol:
    """Every unit is graded: write the table; answered at once by ProtocolDone."""

    step: int


@dataclass(frozen=True)
class Checkpoint:
    step: int
    state: dict[str, Any]  # the scheduler's client state (Scheduler.state_dict)
    episodes: list[Episode]  # buffered groups, by uid


@dataclass(frozen=True)
class PollControl:
    call: CallId
    status: dict[str, Any]
    timeout_s: float


@dataclass(frozen=True)
class Record:
    """A metrics.jsonl line; ``batch`` is set on a finished step's record (tests may keep it)."""

    step: int
    metrics: dict[str, float]
    batch: Optional[list[Episode]] = None


@dataclass(frozen=True)
class Log:
    line: str


@dataclass(frozen=True)
class Stop:
    """The job fails with ``reason`` (it names what failed and how to continue)."""

    reason: str


Command = Union[StartWorker, RemoveWorker, Generate, SetupWorkerPush, LoadWeights, Push, Train, Evaluate, StartProtocol,
                Complete, FinishProtocol, Checkpoint, PollControl, Record, Log, Stop]
