"""``generic``: any prompts and any columns; the user's reward functions decide.

File records: ``prompt`` (text, or chat messages ``[{role, content}, ...]`` ending with the user's
turn; ``source.columns`` maps another column to it); every other column is kept as it is and
reaches the reward (``row.record``, or a batched function's keyword lists: docs/rewards.md). An
``answer`` column, when there is one, is shown beside samples in logs; nothing requires it. The
prompt is the data's own: ``template`` is ``{prompt}`` unless the config writes an instruction
around it, and nothing is appended otherwise.

There is no checker of its own: ``task.reward.custom`` is required, and held-out evaluation judges
a completion by its whole reward, correct when it is at least ``task.correct_at``. There are no
reference completions, so no warm start.

Rows without an ``id`` get one derived from every column, so two rows are duplicates only when
they are the same record.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

from stabledrl.common.tasks.base import TASKS, Row, Task, configured_task, record_id, record_text

NAME = "generic"
DEFAULT_TEMPLATE = "{prompt}"


def from_record(record: Mapping[str, Any]) -> Row:
    prompt = record_text(record, "prompt")
    answer = record.get("answer")
    content = json.dumps(record, sort_keys=True, default=repr)
    return Row(prompt_id=record_id(record, NAME, content), prompt=prompt,
               answer="" if answer is None else str(answer))


def _no_checker(completion: str, row: Row) -> float:
    raise RuntimeError("the generic task has no checker of its own: task.reward.custom scores it")


def _no_reference(row: Row) -> str:
    raise RuntimeError("the generic task has no reference completions (no warm start)")


@TASKS.register(NAME)
def build(cfg: Any) -> Task:
    task = configured_task(cfg, NAME, DEFAULT_TEMPLATE, ("prompt",), correctness=_no_checker,
                           format_score=lambda completion, row: 0.0, reference=_no_reference,
                           from_record=from_record)
    return dataclasses.replace(task, judged_by="reward", correct_at=cfg.correct_at)
