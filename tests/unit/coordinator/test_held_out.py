"""The job's held-out evaluation without Ray: rows dealt into parts, a lost part run again, the
merge exact whatever the number of parts, a resumed run's BEFORE read back from metrics.jsonl."""
from __future__ import annotations

import json

import pytest

from stabledrl.common.tasks import Row
from stabledrl.coordinator.driver import Driver
from stabledrl.coordinator.decisions.held_out import HeldOutResult, HeldOutRun, held_out_rows
from stabledrl.common.metrics import pass_at_k
from stabledrl.common.types import EvalResult
from scheduler_sim import job

ROWS = [Row(f"p{i}", f"{i}+1=", str(i + 1)) for i in range(7)]
CORRECT = [2, 0, 1, 2, 2, 0, 1]  # correct samples of each prompt, out of 2


def answer(rows):
    correct = [CORRECT[int(r.prompt_id[1:])] for r in rows]
    return EvalResult(
        len(rows), 2, {1: sum(c / 2 for c in correct) / len(rows)}, sum(correct) / (2 * len(rows)), correct
    )


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_the_merged_result_does_not_depend_on_the_parts_or_on_a_lost_part(workers):
    run = HeldOutRun.deal(ROWS, workers)
    assert sorted(r.prompt_id for part in run.parts for r in part) == sorted(r.prompt_id for r in ROWS)
    calls = dict(enumerate(run.assign(list(range(workers)))))
    run.running.update(calls)
    assert run.lost_worker(0) == 1 and run.waiting == [0]  # worker 0 froze: its part waits again
    assert run.assign([1] if workers > 1 else [0]) == [(0, 1 if workers > 1 else 0)]
    for part in range(len(run.parts)):
        run.done[part] = (3, answer(run.parts[part]))
    result = run.merge()
    assert result.num_prompts == 7 and result.version == 3
    assert result.pass_at_1 == pytest.approx(sum(pass_at_k(2, c, 1) for c in CORRECT) / 7)
    if workers > 1:  # parts evaluated with different weights are no paired comparison: refused
        run.done[0] = (2, answer(run.parts[0]))
        with pytest.raises(ValueError, match="different weights versions"):
            run.merge()


def test_num_prompts_beyond_the_held_out_rows_is_said_not_silently_capped():
    rows, note = held_out_rows(ROWS, 200)
    assert rows == ROWS and "eval.num_prompts = 200, but the task has 7 held-out rows" in note
    assert held_out_rows(ROWS, 3) == (ROWS[:3], None) and held_out_rows([], 200) == ([], None)


def test_a_resumed_run_takes_before_from_its_own_step_0_evaluation(tmp_path):
    cfg = job(run={"output_dir": str(tmp_path)})
    lines = [
        {"step": 0, "data/rows_read": 8.0},
        {"step": 0, "eval/pass@1": 0.25, "eval/prompts": 8.0, "eval/version": 0.0},
        {"step": 4, "train/loss": 1.0},
        {"step": 4, "eval/pass@1": 0.5, "eval/prompts": 8.0, "eval/version": 4.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    before = Driver(cfg).first_evaluation()
    assert isinstance(before, HeldOutResult) and before.pass_at_1 == 0.25 and before.version == 0
    (tmp_path / "metrics.jsonl").write_text(json.dumps(lines[2]) + "\n")
    assert Driver(cfg).first_evaluation() is None



def test_a_resumed_runs_final_window_covers_the_runs_evaluations_once_per_step(tmp_path):
    cfg = job(run={"output_dir": str(tmp_path), "steps": 6}, eval={"final_window": 3, "every": 2})
    evals = [(0, 0.25), (2, 0.5), (4, 0.625), (4, 0.75), (6, 0.875)]  # step 4 twice: the checkpoint's and the resume's
    lines = [{"step": s, "eval/pass@1": p, "eval/prompts": 8.0, "eval/version": float(s)} for s, p in evals]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    driver = Driver(cfg)
    driver.evaluations = driver.recorded_evaluations()
    assert [r.pass_at_1 for r in driver.evaluations] == [0.25, 0.5, 0.75, 0.875]
    assert driver.final_window_text() == "; mean of the last 3 evaluations: 70.8%"  # (0.5 + 0.75 + 0.875) / 3


def test_a_resumed_runs_final_line_has_the_uninterrupted_runs_format(tmp_path):
    """eval.every 0: the run evaluates before and after only; the evaluation the resumed process
    ran at its checkpoint's step (3) is not one of them, so no 'mean of the last 2 evaluations'."""
    cfg = job(run={"output_dir": str(tmp_path), "steps": 6}, eval={"final_window": 3})
    lines = [{"step": s, "eval/pass@1": p, "eval/prompts": 8.0, "eval/version": float(s)}
             for s, p in [(0, 0.25), (3, 0.5), (6, 0.75)]]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    driver = Driver(cfg)
    driver.evaluations = driver.recorded_evaluations()
    assert [r.pass_at_1 for r in driver.evaluations] == [0.25, 0.75]
    assert driver.final_window_text() == ""
