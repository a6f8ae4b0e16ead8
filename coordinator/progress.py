"""The training progress the driver shows: a tqdm bar on a terminal, else (``run.progress``) a line
in the log every twentieth of the run (a log file gets lines, not a bar)."""
from __future__ import annotations

import sys
from typing import Callable


class Progress:
    def __init__(self, steps: int, initial: int, enabled: bool, log: Callable[[str], None]) -> None:
        from tqdm import tqdm

        self.steps, self.enabled, self.log = steps, enabled, log
        self.bar = tqdm(total=steps, initial=initial, desc="train", dynamic_ncols=True,
                        disable=not enabled or not sys.stderr.isatty())

    def step(self, step: int, record: dict[str, float]) -> None:
        """Step ``step`` is recorded (``record``: its metrics.jsonl line)."""
        self.bar.update(1)
        self.bar.set_postfix(
            reward=f"{record['rollout/reward_mean']:.3f}",
            loss=f"{record['train/loss']:.4f}",
            dropped=int(record["staleness/dropped_total"]),
        )
        if self.enabled and self.bar.disable and step % max(1, self.steps // 20) == 0:
            self.log(progress_line(step, self.steps, record))

    def close(self) -> None:
        self.bar.close()


def progress_line(step: int, steps: int, record: dict[str, float]) -> str:
    return (f"step {step}/{steps}: reward {record['rollout/reward_mean']:.3f}, loss {record['train/loss']:.4f}, "
            f"grad norm {record['train/grad_norm']:.3f}, staleness {record['staleness/mean']:.2f} "
            f"(dropped {int(record['staleness/dropped_total'])}), {record['time/step']:.2f} s/step")
