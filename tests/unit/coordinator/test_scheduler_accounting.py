"""Exactly-once accounting over long random event sequences (a property test of the scheduler).

Each sequence answers the scheduler's open commands in a random order, and at random lets a
worker die or hang mid-request, a dead process's answer arrive anyway, a collective push lose a
receiver, and `stabledrl scale` change the size. After every event: no prompt uid is trained
twice, and every uid handed out so far is in exactly one place (trained, buffered, being sampled or
re-queued, or dropped as stale), with the staleness controller's counters agreeing. At the end
(drain): no request is out."""
from __future__ import annotations

import random

import pytest

from stabledrl.coordinator.decisions import events as ev
from scheduler_sim import Sim, job


def check(sim: Sim) -> None:
    s, snap = sim.scheduler, sim.scheduler.snapshot()
    trained = sum(sim.trained(), [])  # every batch the scheduler sent to the learner
    assert len(trained) == len(set(trained)), "a uid was trained twice"
    buffered, outstanding = set(snap.buffered), snap.outstanding
    assert len(outstanding) == len(set(outstanding)), "a uid is out twice"
    assert not (set(trained) & buffered) and not (set(trained) & set(outstanding)) and not (buffered & set(outstanding))
    assert len(trained) + len(buffered) + len(outstanding) + snap.dropped_total == snap.next_uid
    assert s.staleness.in_flight == len(s.fleet.requests()) and s.staleness.buffered == len(buffered)
    assert snap.duplicates == 0


def answer(sim: Sim, rng: random.Random, command: object, dead: list[ev.Generate]) -> None:
    """The runtime's report on ``command``: mostly it finished, sometimes its worker died or hung."""
    fault = rng.random() < 0.08
    if isinstance(command, ev.Generate):
        if fault:
            dead.append(command)
            sim.send(ev.CallFailed(command.call, rng.choice(["died", "timed_out"]), "fault"))
        else:
            sim.rollout_done(command)
    elif isinstance(command, ev.LoadWeights):
        sim.send(
            ev.CallFailed(command.call, "died", "fault") if fault else ev.WeightsLoaded(command.call, command.version)
        )
    elif isinstance(command, ev.StartWorker):
        if fault:
            sim.send(ev.CallFailed(command.call, "died", "fault"))
        else:
            sim.open.append(command)
            sim.started(command)
    elif isinstance(command, ev.Train):
        sim.send(
            ev.StepDone(
                command.step,
                [{"learner/staleness_max": 0.0, "learner/samples": 1.0, "learner/tokens": 1.0, "time/train_rank": 0.0}]
                * 2,
                0.0,
            )
        )
    elif isinstance(command, ev.Push):
        if command.barrier and command.receivers and fault:
            sim.send(ev.PushFailed(command.version, (rng.choice(command.receivers),), "a receiver died"))
        else:
            sim.send(ev.PushDone(command.version, 0.0))
    elif isinstance(command, ev.PollControl):
        requested = rng.choice([None, None, None, 1, 2, 3])
        sim.send(ev.ControlPolled(command.call, requested, rng.random() < 0.3))
    elif isinstance(command, ev.Evaluate):
        raise AssertionError("no evaluation in these runs")


def run(seed: int) -> Sim:
    rng = random.Random(seed)
    cfg = job(algorithm={"max_staleness": rng.choice([0, 1, 2]), "in_order": rng.random() < 0.5,
                         "groups_per_step": rng.choice([2, 4])},
              rollout={"num_workers": rng.choice([1, 2, 3]), "prompts_per_request": rng.choice([1, 2]),
                       "max_workers": 3, "max_restarts": 1000, "autoscale": rng.random() < 0.3},
              run={"steps": 6})
    sim = Sim(cfg, collective=rng.random() < 0.4)
    dead: list[ev.Generate] = []
    sim.begin("train")
    for _ in range(2000):
        if sim.scheduler.done:
            break
        if dead and rng.random() < 0.1:  # a replaced process's answer arrives after all: ignored
            sim.rollout_done(dead.pop(rng.randrange(len(dead))))
        elif sim.open:
            answer(sim, rng, sim.open.pop(rng.randrange(len(sim.open))), dead)
        check(sim)
    assert sim.stop() is None and sim.scheduler.step == 6, (seed, sim.stop())
    sim.begin("drain")
    while not sim.scheduler.done:
        answer(sim, random.Random(0), sim.open.pop(0), [])  # no more faults: let everything land
    check(sim)
    assert not sim.scheduler.fleet.requests()  # re-queued prompts may wait (a checkpoint keeps them)
    return sim


@pytest.mark.parametrize("seed", range(60))
def test_every_uid_is_accounted_for_exactly_once(seed):
    run(seed)


def test_the_random_runs_meet_the_faults_they_are_meant_to():
    sims = [run(seed) for seed in range(60)]
    counts = {k: sum(s.scheduler.snapshot().counts[k] for s in sims) for k in sims[0].scheduler.snapshot().counts}
    assert counts["faults/rollout_worker_deaths"] > 10 and counts["faults/rollout_worker_hangs"] > 10
    assert counts["elastic/workers_added"] > 0 and counts["elastic/workers_retired"] > 0
    assert sum(s.scheduler.snapshot().dropped_total for s in sims) > 0
