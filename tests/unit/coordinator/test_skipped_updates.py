"""Huge rewards made train/loss NaN at 3 of 4 steps and the job ended with the weights it
started from, exit 0, nothing in the log. A skipped update is now said in the log, and
MAX_SKIPPED_IN_A_ROW of them in a row stop the job naming the likely causes."""
from __future__ import annotations

from stabledrl.coordinator.decisions import events as ev
from stabledrl.coordinator.decisions.skipped_updates import MAX_IN_A_ROW as MAX_SKIPPED_IN_A_ROW
from scheduler_sim import Sim, job


def step(sim: Sim, skipped: bool) -> None:
    sim.finish_rollouts()
    (train,) = sim.take(ev.Train)
    rank = {"learner/staleness_max": 0.0, "learner/samples": 8.0, "learner/tokens": 16.0, "time/train_rank": 0.1,
            "train/loss": float("nan") if skipped else 0.5, "train/grad_norm": float("nan") if skipped else 1.0,
            "train/skipped": float(skipped)}
    sim.send(ev.StepDone(train.step, [rank, {**rank, "train/skipped": 0.0}], 0.1, at=1.0))
    if sim.stop() is None:
        sim.push_done()
        sim.poll_done()


def test_skipped_updates_are_logged_and_too_many_in_a_row_stop_the_job():
    sim = Sim(job(run={"steps": 10}))
    sim.begin("train")
    step(sim, skipped=True)
    step(sim, skipped=False)  # a good step resets the count
    for _ in range(MAX_SKIPPED_IN_A_ROW - 1):
        step(sim, skipped=True)
    assert sim.stop() is None
    warnings = [line for line in sim.logs() if "skipped its update" in line]
    assert len(warnings) == MAX_SKIPPED_IN_A_ROW and "train/loss nan" in warnings[0]
    step(sim, skipped=True)
    assert sim.stop().startswith(f"the learner skipped {MAX_SKIPPED_IN_A_ROW} updates in a row for a non-finite loss")
    assert "task.reward.max_abs" in sim.stop()
