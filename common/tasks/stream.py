"""An endless, seeded, exactly resumable order over a task's training rows.

Epoch e visits every row once, in increasing ``stable_hash("shuffle", seed, e, prompt_id)``:
the order is a function of (seed, epoch, the set of prompt ids) only, not of file order, RNG
state or Python version. The position is a ``DataCursor(epoch, index)``; saving it with the
checkpoint and restoring it continues with exactly the row that would have come next.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from stabledrl.common.tasks.base import Row, stable_hash


@dataclass(frozen=True)
class DataCursor:
    epoch: int = 0
    index: int = 0  # rows of this epoch already handed out


class PromptStream:
    def __init__(self, rows: Sequence[Row], seed: int, cursor: Optional[DataCursor] = None) -> None:
        if not rows:
            raise ValueError("a prompt stream needs at least one row")
        self.rows = list(rows)
        self.seed = seed
        self.fingerprint = f"{stable_hash(sorted(r.prompt_id for r in self.rows)):016x}"
        self._epoch, self._index = 0, 0
        self._order: list[int] = []
        self._order_epoch = -1
        if cursor is not None:
            self.seek(cursor)

    def epoch_order(self, epoch: int) -> list[int]:
        """Row indices in the order epoch ``epoch`` visits them."""
        if epoch != self._order_epoch:
            keys = [stable_hash("shuffle", self.seed, epoch, r.prompt_id) for r in self.rows]
            self._order = sorted(range(len(self.rows)), key=keys.__getitem__)
            self._order_epoch = epoch
        return self._order

    @property
    def cursor(self) -> DataCursor:
        return DataCursor(self._epoch, self._index)

    def seek(self, cursor: DataCursor) -> None:
        if cursor.epoch < 0 or not 0 <= cursor.index <= len(self.rows):
            raise ValueError(f"cursor {cursor} is outside a stream of {len(self.rows)} rows")
        self._epoch, self._index = cursor.epoch, cursor.index

    def next(self) -> Row:
        if self._index >= len(self.rows):
            self._epoch, self._index = self._epoch + 1, 0
        row = self.rows[self.epoch_order(self._epoch)[self._index]]
        self._index += 1
        return row

    def take(self, n: int) -> list[Row]:
        return [self.next() for _ in range(n)]

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self._epoch, "index": self._index, "seed": self.seed, "fingerprint": self.fingerprint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict()``; refuses a state saved over different rows or another seed."""
        if state["fingerprint"] != self.fingerprint or state["seed"] != self.seed:
            raise ValueError(
                f"data cursor was saved for rows {state['fingerprint']} / seed {state['seed']}, "
                f"this stream has rows {self.fingerprint} / seed {self.seed}"
            )
        self.seek(DataCursor(int(state["epoch"]), int(state["index"])))
