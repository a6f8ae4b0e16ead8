"""The training progress the driver shows (``run.progress``): a tqdm bar on a terminal; where the
output goes to a file (``ray job submit``, ``make > log``), a line on the first step, then at most one
every ``run.progress_every_s`` seconds, and on the last step:

    step 40/150: 41.3 samples/s, reward 0.512, staleness 0.50 (dropped 0), loss 0.0123, ETA 2m 40s

samples/s counts the samples trained since the line before; ETA is the steps left at this process's
mean time per step so far."""
from __future__ import annotations

import logging
import sys
import time
from typing import Callable, Optional

log = logging.getLogger(__name__)


class Progress:
    def __init__(self, steps: int, initial: int, enabled: bool, every_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic, terminal: Optional[bool] = None) -> None:
        from tqdm import tqdm

        self.steps, self.enabled, self.every_s, self.clock = steps, enabled, every_s, clock
        terminal = sys.stdout.isatty() and sys.stderr.isatty() if terminal is None else terminal
        self.bar = tqdm(total=steps, initial=initial, desc="train", dynamic_ncols=True,
                        disable=not enabled or not terminal)
        self.start_step, self.start = initial, clock()
        self.last_line: Optional[float] = None
        self.samples = 0.0  # trained since the last line

    def step(self, step: int, record: dict[str, float]) -> None:
        """Step ``step`` is recorded (``record``: its metrics.jsonl line)."""
        self.bar.update(1)
        self.bar.set_postfix(
            reward=f"{record['rollout/reward_mean']:.3f}",
            loss=f"{record['train/loss']:.4f}",
            dropped=int(record["staleness/dropped_total"]),
        )
        self.samples += record.get("rollout/samples", 0.0)
        if not self.enabled or not self.bar.disable:
            return
        now = self.clock()
        if self.last_line is not None and now - self.last_line < self.every_s and step < self.steps:
            return
        window = now - (self.start if self.last_line is None else self.last_line)
        per_step = (now - self.start) / max(1, step - self.start_step)
        log.info(progress_line(step, self.steps, record, self.samples / window if window > 0 else 0.0,
                               per_step * (self.steps - step)))
        self.last_line, self.samples = now, 0.0

    def close(self) -> None:
        self.bar.close()


def progress_line(step: int, steps: int, record: dict[str, float], samples_per_s: float, eta_s: float) -> str:
    return (f"step {step}/{steps}: {samples_per_s:.1f} samples/s, reward {record['rollout/reward_mean']:.3f}, "
            f"staleness {record['staleness/mean']:.2f} (dropped {int(record['staleness/dropped_total'])}), "
            f"loss {record['train/loss']:.4f}, ETA {duration(eta_s)}")


def duration(seconds: float) -> str:
    """'45s', '2m 40s', '3h 05m'."""
    s = int(round(max(0.0, seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"
