"""A task's prompts: generated, or read from a local JSONL / Parquet file; validated and split.

File schema (canonical field names; ``source.columns`` maps a canonical name to the file's
column, e.g. ``{prompt: question}``; every task also reads an optional ``id``):

| task       | required                               | optional            |
|------------|----------------------------------------|---------------------|
| arithmetic | prompt, answer (an integer)            | id                  |
| countdown  | numbers (list of ints or "3,5,7"), target (int) | id, solution (expression) |
| sudoku4    | puzzle (16 chars 0-4, 0 = empty)       | id, solution        |
| gsm8k      | prompt, answer (number or "... #### N")| id                  |
| math       | prompt, answer (answer or \\boxed solution) | id, solution   |

Rows without an ``id`` get one derived from their content, so ids are stable under reordering.
A bad row (missing or empty field, invalid value, rendered prompt over ``max_prompt_tokens``,
duplicate id) stops loading with its row number (1-based, counting records) when
``on_bad_row: error``, or is skipped and counted by reason when ``on_bad_row: skip``. A file
pyarrow cannot parse (for example a column whose type changes between rows) is an error either
way. Prompt length is measured on ``task.render_prompt(row)`` with ``count_tokens`` (default:
characters, exact for the character tokenizer and an upper bound for subword tokenizers).

Train / held-out split: row r is held out by ``stable_hash("split", split_seed, r.prompt_id)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

from common.tasks.base import BadRow, Row, Task, stable_hash

CountTokens = Callable[[str], int]
_HASH_RANGE = 1 << 63


class DataError(ValueError):
    """Data that cannot be used: an unreadable file, a missing column, or a bad row (on_bad_row=error)."""


@dataclass
class LoadReport:
    """What loading one source did: records read, rows kept, rows skipped by reason."""

    source: str
    read: int = 0
    kept: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)  # the first few skipped rows, for the log

    @property
    def n_skipped(self) -> int:
        return sum(self.skipped.values())


def read_records(path: Union[str, Path], fmt: str = "auto") -> list[dict[str, Any]]:
    """All records of a JSONL (one object per line) or Parquet file, via pyarrow."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file {path} does not exist")
    if fmt == "auto":
        fmt = "parquet" if path.suffix in (".parquet", ".pq") else "jsonl"
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(path)
        else:
            import pyarrow.json as pj

            table = pj.read_json(path)
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError with the offending row in the message
        raise DataError(f"cannot read {path} as {fmt}: {e}") from e
    return table.to_pylist()


def rows_from_records(
    task: Task,
    records: Sequence[dict[str, Any]],
    *,
    source: str,
    columns: Optional[dict[str, str]] = None,
    max_prompt_tokens: int,
    on_bad_row: str = "error",
    count_tokens: CountTokens = len,
) -> tuple[list[Row], LoadReport]:
    """Validate ``records`` into rows of ``task``; see the module docstring for the rules."""
    columns = columns or {}
    report = LoadReport(source=source, read=len(records))
    present = set().union(*(r.keys() for r in records)) if records else set()
    absent = sorted({columns.get(f, f) for f in task.required_fields} - present) if records else []
    if absent:
        raise DataError(
            f"{source}: no column {absent} (columns: {sorted(present)}); map it with source.columns, e.g. {{prompt: question}}"
        )
    rows: list[Row] = []
    seen: set[str] = set()
    for number, raw in enumerate(records, start=1):
        record = dict(raw)
        for canonical, column in columns.items():
            record[canonical] = raw.get(column)
        try:
            row = task.from_record(record)
            if row.prompt_id in seen:
                raise BadRow(f"duplicate id {row.prompt_id!r}", "duplicate_id")
            n_tokens = count_tokens(task.render_prompt(row))
            if n_tokens > max_prompt_tokens:
                raise BadRow(f"prompt has {n_tokens} tokens, more than max_prompt_tokens={max_prompt_tokens}", "too_long")
        except BadRow as e:
            if on_bad_row == "error":
                raise DataError(f"{source}: row {number}: {e} (set on_bad_row: skip to drop such rows)") from None
            report.skipped[e.reason] = report.skipped.get(e.reason, 0) + 1
            if len(report.examples) < 5:
                report.examples.append(f"row {number}: {e}")
            continue
        seen.add(row.prompt_id)
        rows.append(row)
    report.kept = len(rows)
    return rows, report


def generate_rows(task: Task, n: int, seed: int, *, max_prompt_tokens: int, count_tokens: CountTokens = len) -> list[Row]:
    """``n`` distinct rows; draw i comes from ``stable_hash(task, seed, i)`` so any prefix is stable."""
    if task.generate is None:
        raise DataError(f"task {task.name!r} has no generator: give it a file source")
    rows: list[Row] = []
    seen: set[str] = set()
    draws, max_draws = 0, 50 * n + 1000
    while len(rows) < n:
        if draws >= max_draws:
            raise DataError(f"{task.name}: only {len(rows)} distinct problems in {draws} draws; lower source.n or raise the difficulty")
        row = task.generate(stable_hash(task.name, seed, draws))
        draws += 1
        if row.prompt_id in seen:
            continue
        n_tokens = count_tokens(task.render_prompt(row))
        if n_tokens > max_prompt_tokens:
            raise DataError(f"{task.name}: a generated prompt has {n_tokens} tokens, more than max_prompt_tokens={max_prompt_tokens}")
        seen.add(row.prompt_id)
        rows.append(row)
    return rows


def split_rows(rows: Sequence[Row], held_out: Union[int, float], seed: int) -> tuple[list[Row], list[Row]]:
    """(train, held_out), both in input order.

    An int takes exactly that many rows, those with the smallest split hash; a float in (0, 1)
    holds out each row whose hash falls below that fraction of the hash range, so a row's side
    never depends on the other rows.
    """
    if not held_out:
        return list(rows), []
    keys = {r.prompt_id: stable_hash("split", seed, r.prompt_id) for r in rows}
    if isinstance(held_out, float):
        held = {pid for pid, k in keys.items() if k < held_out * _HASH_RANGE}
    else:
        if held_out >= len(rows):
            raise DataError(f"held_out={held_out} leaves no training rows out of {len(rows)}")
        held = set(sorted(keys, key=keys.__getitem__)[:held_out])
    return [r for r in rows if r.prompt_id not in held], [r for r in rows if r.prompt_id in held]


@dataclass
class TaskData:
    task: Task
    train: list[Row]
    held_out: list[Row]
    reports: list[LoadReport]


def load_task_data(cfg: Any, *, task: Optional[Task] = None, count_tokens: CountTokens = len) -> TaskData:
    """Rows of the task described by a task config section, split into train and held-out."""
    from common.tasks.build import build_task

    task = task or build_task(cfg)
    reports: list[LoadReport] = []

    def from_source(src: Any) -> list[Row]:
        if src.kind == "generated":
            rows = generate_rows(task, src.n, src.seed, max_prompt_tokens=cfg.max_prompt_tokens, count_tokens=count_tokens)
            reports.append(LoadReport(source=f"generated(n={src.n}, seed={src.seed})", read=len(rows), kept=len(rows)))
            return rows
        rows, report = rows_from_records(
            task,
            read_records(src.path, src.format),
            source=src.path,
            columns=src.columns,
            max_prompt_tokens=cfg.max_prompt_tokens,
            on_bad_row=cfg.on_bad_row,
            count_tokens=count_tokens,
        )
        reports.append(report)
        return rows

    rows = from_source(cfg.source)
    if cfg.held_out_source is not None:
        held = from_source(cfg.held_out_source)
        held_ids = {r.prompt_id for r in held}
        train = [r for r in rows if r.prompt_id not in held_ids]  # a problem in both files is held out
        if len(train) < len(rows):
            reports[0].skipped["in_held_out"] = len(rows) - len(train)
            reports[0].kept = len(train)
    else:
        train, held = split_rows(rows, cfg.held_out, cfg.split_seed)
    if not train:
        raise DataError(f"task {task.name!r}: no training rows left ({', '.join(r.source for r in reports)})")
    return TaskData(task=task, train=train, held_out=held, reports=reports)
