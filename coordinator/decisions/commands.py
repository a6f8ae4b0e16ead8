"""The scheduler's commands: what to do (coordinator/decisions/events.py has what happened). No Ray here.

The runtime (coordinator/runtime/executor.py) carries out every ``RuntimeCommand`` with one exhaustive
``match``; the driver itself carries out the ``DriverCommand``s (a metrics line, a log line, the
end of the job). A command the scheduler waits for carries the ``CallId`` it chose.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Protocol, Sequence, Union

from stabledrl.common.config.sampler import SamplerConfig
from stabledrl.common.tasks import Row
from stabledrl.common.types import Episode, PromptRequest

CallId = int

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


class ProtocolRunner(Protocol):
    """What carries out the protocol commands (``eval.protocol``; the command layer passes one in,
    stabledrl/evaluation/protocol.py's InTraining): it opens a step's results, builds each unit's request,
    grades what comes back, and writes the table."""

    def start(self, step: int) -> tuple[int, str]: ...  # (units still to run, a line to log or '')

    def request(self, unit: int) -> tuple[Any, ...]: ...  # RolloutWorker.complete's arguments

    def graded(self, unit: int, completions: Sequence[str]) -> None: ...

    def finish(self) -> tuple[dict[str, float], str]: ...  # (protocol/* metrics, the log line)


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


RuntimeCommand = Union[StartWorker, RemoveWorker, Generate, SetupWorkerPush, LoadWeights, Push, Train, Evaluate,
                       StartProtocol, Complete, FinishProtocol, Checkpoint, PollControl]  # carried out by the runtime
DriverCommand = Union[Record, Log, Stop]  # carried out by the driver itself (metrics.jsonl, the log, the end)
Command = Union[RuntimeCommand, DriverCommand]
