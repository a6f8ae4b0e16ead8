"""A scripted stand-in for the Ray runtime: it keeps the scheduler's commands, and a test answers
them with events, as the runtime would (finished, failed, late). No Ray, no model: every event is
a few microseconds, so a fault scenario or a long random event sequence runs in milliseconds."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from stabledrl.common.config.base import validate
from stabledrl.common.config.job import JobConfig
from stabledrl.common.stats import Reduce, Stat
from stabledrl.common.tasks import PromptStream, Row
from stabledrl.common.types import Episode, EvalResult, Group, Sample
from stabledrl.coordinator.decisions import events as ev
from stabledrl.coordinator.decisions.scheduler import Scheduler

ROWS = [Row(f"p{i}", f"{i}+1=", str(i + 1)) for i in range(64)]


def job(**sections: dict) -> JobConfig:
    """η = 0, 4 groups per step of 2 samples, 1 prompt per request, 2 rollout workers (each takes 2
    requests at once), 2 learner ranks, 4 steps; ``sections`` update the sections key by key."""
    data = {
        "model": {"preset": "tiny-llada"},
        "task": {"name": "arithmetic", "held_out": 0, "source": {"kind": "generated", "n": 8}},
        "sampler": {"gen_length": 4, "block_length": 4, "steps": 4},
        "estimator": {"name": "block_random", "block_length": 4, "num_draws": 2},
        "loss": {"name": "stabledrl"},
        "algorithm": {"group_size": 2, "groups_per_step": 4, "max_staleness": 0},
        "rollout": {"num_workers": 2, "prompts_per_request": 1, "requests_per_worker": 2, "request_timeout_s": 5,
                    "max_restarts": 2},
        "learner": {"num_ranks": 2},
        "run": {"steps": 4, "output_dir": "/tmp/sim-run", "seed": 3},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return validate(JobConfig, data)


def episode(uid: int, row: Row, version: int, worker: int, samples: int = 2) -> Episode:
    group = Group(row.prompt_id, [
        Sample(sample_id=f"{row.prompt_id}/{i}", prompt_id=row.prompt_id, index=i, prompt_ids=torch.tensor([5]),
               completion_ids=torch.tensor([6, 1]), completion_length=2, reward=float(i), policy_version=version)
        for i in range(samples)])
    return Episode(uid=uid, prompt_id=row.prompt_id, group=group if samples else None, worker=worker)


def result(rows: Sequence[Row], correct: int = 1) -> EvalResult:
    return EvalResult(len(rows), 1, {1: correct / max(1, len(rows))}, correct / max(1, len(rows)),
                      [1 if i < correct else 0 for i in range(len(rows))])


class Sim:
    def __init__(self, cfg: JobConfig, *, collective: bool = False, held_out: Sequence[Row] = (),
                 workers: Optional[int] = None) -> None:
        self.scheduler = Scheduler(cfg, PromptStream(ROWS[: cfg.task.source.n], seed=cfg.run.seed), held_out,
                                   collective_push=collective)
        n = cfg.rollout.num_workers if workers is None else workers
        self.commands: list[Any] = []  # every command, in order
        self.open: list[Any] = []  # commands not answered yet
        self.send(ev.JobStarted({i: {"node_id": f"node{i}", "pid": 100 + i, "parameters": 1000} for i in range(n)},
                                cfg.learner.num_ranks))

    # ---- driving ------------------------------------------------------------------------------
    def begin(self, goal: str) -> list[Any]:
        return self._keep(self.scheduler.begin(goal))

    def send(self, event: Any) -> list[Any]:
        return self._keep(self.scheduler.handle(event))

    def _keep(self, commands: list[Any]) -> list[Any]:
        self.commands += commands
        self.open += [c for c in commands if not isinstance(c, (ev.Log, ev.Record, ev.SetupWorkerPush,
                                                                    ev.RemoveWorker, ev.Stop))]
        return commands

    def take(self, kind: type, **where: Any) -> list[Any]:
        """The open commands of ``kind`` matching ``where`` (field = value), now answered."""
        found = [c for c in self.open if isinstance(c, kind) and all(getattr(c, k) == v for k, v in where.items())]
        for c in found:
            self.open.remove(c)
        return found

    def pending(self, kind: type, **where: Any) -> list[Any]:
        return [c for c in self.open if isinstance(c, kind) and all(getattr(c, k) == v for k, v in where.items())]

    # ---- answers ------------------------------------------------------------------------------
    def rollout_done(self, command: ev.Generate, version: Optional[int] = None) -> list[Any]:
        if command in self.open:
            self.open.remove(command)
        worker = self.scheduler.fleet.get(command.worker)
        v = version if version is not None else (worker.version if worker is not None else 0)
        episodes = [episode(r.uid, r.row, v, command.worker) for r in command.requests]
        return self.send(ev.RolloutDone(command.call, episodes, {"calls": 2.0 * len(episodes)}))

    def finish_rollouts(self, worker: Optional[int] = None) -> None:
        for command in list(self.pending(ev.Generate)):
            if worker is None or command.worker == worker:
                self.rollout_done(command)

    def step_done(self, at: float = 1.0) -> list[Any]:
        (train,) = self.take(ev.Train)
        rank = {"learner/staleness_max": Stat(0.0, Reduce.MAX), "learner/samples": Stat(8.0, Reduce.COUNT),
                "learner/tokens": Stat(16.0, Reduce.COUNT), "time/train_rank": Stat(0.1, Reduce.MAX),
                "train/loss": Stat(0.5, replicated=True)}
        return self.send(ev.StepDone(train.step, [rank] * 2, 0.1, at=at))

    def push_done(self, at: float = 1.0) -> list[Any]:
        (push,) = self.take(ev.Push)
        out = self.send(ev.PushDone(push.version, 0.01, at=at))
        for load in self.take(ev.LoadWeights):
            out += self.send(ev.WeightsLoaded(load.call, load.version))
        return out

    def poll_done(self, requested: Optional[int] = None, room: bool = False) -> list[Any]:
        out = []
        for poll in self.take(ev.PollControl):
            out += self.send(ev.ControlPolled(poll.call, requested, room))
        return out

    def started(self, command: ev.StartWorker) -> list[Any]:
        self.open.remove(command)
        return self.send(
            ev.WorkerStarted(
                command.call, {"node_id": f"node{command.worker}", "pid": 200 + command.worker, "parameters": 1000}
            )
        )

    def step(self) -> None:
        """Every rollout back, the step trained, its weights out, the poll answered."""
        self.finish_rollouts()
        self.step_done()
        self.push_done()
        self.poll_done()

    # ---- reading ------------------------------------------------------------------------------
    def logs(self) -> list[str]:
        return [c.line for c in self.commands if isinstance(c, ev.Log)]

    def trained(self) -> list[list[int]]:
        return [[e.uid for e in c.batch] for c in self.commands if isinstance(c, ev.Train)]

    def stop(self) -> Optional[str]:
        stops = [c.reason for c in self.commands if isinstance(c, ev.Stop)]
        return stops[0] if stops else None
