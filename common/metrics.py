"""Per-step metrics: JSONL always, TensorBoard when asked, Weights & Biases when configured.

Names as in docs/design.md: ``rollout/*`` (rewards, lengths, generation), ``train/*`` (loss parts,
ratio statistics, clip fraction, ESS, grad norm), ``staleness/*`` (mean, max, dropped),
``time/*`` (generate, train, weight push, step), ``perf/*`` (tokens/s, MFU), ``eval/*``.

One line of ``metrics.jsonl`` per call: ``{"step": s, "time": unix seconds, name: value, ...}``;
values are plain floats, so ``pandas.read_json(path, lines=True)`` reads a run back. A resumed run
drops the lines after its checkpoint's step (``restore_metrics``).
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Mapping, Optional


class MetricsLogger:
    """Writes metric dictionaries under ``output_dir`` (metrics.jsonl and tensorboard/)."""

    def __init__(self, output_dir: str | Path, *, tensorboard: bool = True, wandb_project: Optional[str] = None,
                 run_config: Optional[Mapping[str, Any]] = None, append: bool = False) -> None:
        """``append``: continue an existing metrics.jsonl (a resumed run); otherwise start it afresh."""
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        self._file = self.path.open(
            "a" if append else "w", buffering=1
        )  # line-buffered: a crash loses at most one line
        self._tb = None
        self._wandb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.dir / "tensorboard"))
        if wandb_project:
            import wandb  # optional dependency: pip install 'stabledrl[wandb]'

            self._wandb = wandb.init(project=wandb_project, dir=str(self.dir), config=dict(run_config or {}))

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict[str, float]:
        """Record ``metrics`` at ``step``; non-numeric values are skipped. Returns what was written."""
        clean = {k: _number(v) for k, v in metrics.items()}
        clean = {k: v for k, v in clean.items() if v is not None}
        record = {"step": int(step), "time": round(time.time(), 3), **clean}
        self._file.write(json.dumps(record, allow_nan=True) + "\n")
        if self._tb is not None:
            for key, value in clean.items():
                self._tb.add_scalar(key, value, global_step=step)
        if self._wandb is not None:
            self._wandb.log(clean, step=step)
        return clean

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _number(value: Any) -> Optional[float]:
    """A float for numbers and 0-d tensors / numpy scalars; None for anything else."""
    if isinstance(value, (str, bytes)) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def read_metrics(path: str | Path) -> list[dict[str, float]]:
    """Every record of a metrics.jsonl file, in order (a truncated last line is ignored)."""
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one prompt with c correct out of n samples: 1 - C(n-c, k) / C(n, k).

    Evaluated as 1 - Π_{m=n-c+1}^{n} (1 - k/m) (numerically stable; Chen et al.'s form)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / m for m in range(n - c + 1, n + 1))


def restore_metrics(output_dir: Path, step: int) -> Optional[int]:
    """A resumed run recomputes every step after ``step``: drop their lines from metrics.jsonl (the
    old file is kept as metrics.before_resume.jsonl). Returns how many lines were dropped."""
    path = Path(output_dir) / "metrics.jsonl"
    if not path.is_file():
        return None
    lines = path.read_text().splitlines(keepends=True)
    keep = [line for line in lines if _line_step(line) <= step]
    if len(keep) < len(lines):
        _write_atomically(path.with_name("metrics.before_resume.jsonl"), "".join(lines))
        _write_atomically(path, "".join(keep))
    return len(lines) - len(keep)


def _write_atomically(path: Path, text: str) -> None:
    """``path`` holds ``text`` or what it held before, never a part (a full disk leaves no 0-byte file)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def _line_step(line: str) -> float:
    try:
        return float(json.loads(line).get("step", 0))
    except (json.JSONDecodeError, AttributeError):
        return float("inf")  # a torn last line goes
