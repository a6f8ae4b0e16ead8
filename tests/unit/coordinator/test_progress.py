"""Progress where the output is not a terminal: a line on the first step, then one per
run.progress_every_s of a (fake) clock and on the last step, with samples/s over the window and an
ETA from the mean step time; on a terminal the bar, and no lines."""
from __future__ import annotations

from stabledrl.coordinator.progress import Progress, duration
from job_lines import job_lines


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def record(reward: float = 0.5) -> dict[str, float]:
    return {"rollout/reward_mean": reward, "train/loss": 0.0123, "staleness/dropped_total": 2.0,
            "staleness/mean": 0.5, "rollout/samples": 64.0}


def run(terminal: bool, steps: int = 10, step_s: float = 12.0, initial: int = 0):
    clock = Clock()
    with job_lines() as lines:
        progress = Progress(steps, initial, True, every_s=30.0, clock=clock, terminal=terminal)
        for step in range(initial + 1, steps + 1):
            clock.now += step_s
            progress.step(step, record())
        progress.close()
    return lines


def test_a_line_every_30_seconds_and_on_the_first_and_last_step():
    lines = run(terminal=False)  # steps of 12 s: lines at steps 1, 4 (36 s after 1), 7, 10 (the last)
    assert [line.split(":")[0] for line in lines] == ["step 1/10", "step 4/10", "step 7/10", "step 10/10"]
    assert lines[0] == ("step 1/10: 5.3 samples/s, reward 0.500, staleness 0.50 (dropped 2), loss 0.0123, "
                        "ETA 1m 48s")  # 64 samples in 12 s; 9 steps left at 12 s each
    assert "5.3 samples/s" in lines[1] and "ETA 1m 12s" in lines[1]  # 3 x 64 samples in 36 s; 6 steps left
    assert lines[-1].endswith("ETA 0s")


def test_a_resumed_run_counts_its_eta_from_its_own_steps():
    lines = run(terminal=False, steps=20, initial=15, step_s=60.0)
    assert [line.split(":")[0] for line in lines] == [f"step {s}/20" for s in range(16, 21)]  # every step > 30 s
    assert lines[0].endswith("ETA 4m 00s")


def test_on_a_terminal_the_bar_and_no_lines():
    assert run(terminal=True) == []


def test_durations_read_as_a_person_writes_them():
    assert [duration(s) for s in (0, 59.4, 160, 3600 * 3 + 300)] == ["0s", "59s", "2m 40s", "3h 05m"]
