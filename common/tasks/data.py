"""A task's prompts: generated, or read from a file or a Hugging Face dataset; validated and split.

Record schema (canonical field names; ``source.columns`` maps a canonical name to the data's column
or to a dotted path into nested fields, e.g. ``{prompt: question}`` or ``{answer:
reward_model.ground_truth}``; every task also reads an optional ``id``):

| task       | required                               | optional            |
|------------|----------------------------------------|---------------------|
| arithmetic | prompt, answer (an integer)            | id                  |
| countdown  | numbers (list of ints or "3,5,7"), target (int) | id, solution (expression) |
| sudoku4    | puzzle (16 chars 0-4, 0 = empty)       | id, solution        |
| gsm8k      | prompt, answer (number or "... #### N")| id                  |
| math       | prompt, answer (answer or \\boxed solution) | id, solution   |
| generic    | prompt                                 | id, answer, any other column |

``prompt`` may be text or chat messages (``[{role, content}, ...]`` ending with the user's turn):
messages are the conversation as the data gives it (the task's template is not applied to them; its
system prompt is added only when they carry none). Data in verl's layout (``prompt`` as messages,
``reward_model.ground_truth``, ``data_source``, ``extra_info``) loads as it is: with no ``answer``
column, ``answer`` is read from ``reward_model.ground_truth``. Every row keeps its whole source
record in ``Row.record``, so a custom reward can read any column.

Rows without an ``id`` get one derived from their content, so ids are stable under reordering.
A bad row (missing or empty field, invalid value, prompt over ``max_prompt_tokens``, duplicate id,
a JSONL line that is not UTF-8 or not JSON) stops loading with its number (JSONL: the file line;
otherwise the record, 1-based) when ``on_bad_row: error``, or is skipped and counted by reason when
``on_bad_row: skip``. A Parquet file pyarrow cannot read is an error either way.

Prompt length: with the model's tokenizer (``load_task_data(..., tokenizer=...)``, what the driver
passes), the number of tokens of the prompt exactly as the model reads it
(``stabledrl.common.tasks.prompts.prompt_ids``, chat template included); without one, ``count_tokens`` of the
rendered text (default: characters, exact for the character tokenizer).

Train / held-out split: row r is held out by ``stable_hash("split", split_seed, r.prompt_id)``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

from stabledrl.common.tasks.base import BadRow, Filtered, Row, Task, stable_hash
from stabledrl.common.tasks.prompts import ChatTemplateError, PromptError, prompt_ids, prompt_text, uses_chat_template
from stabledrl.common.tasks.sources import (
    MISSING, DataError, Records, chat_messages, column_present, column_value, read_file, read_source,
)
from stabledrl.common.tasks.build import build_task

CountTokens = Callable[[str], int]
PromptLength = Callable[[Row], int]
_HASH_RANGE = 1 << 63
VERL_ANSWER = "reward_model.ground_truth"


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


def read_records(path: Any, fmt: str = "auto") -> list[dict[str, Any]]:
    """All records of a JSONL or Parquet file (DataError at the first unreadable line)."""
    records = read_file(path, fmt)
    if records.unreadable:
        number, message, _ = records.unreadable[0]
        raise DataError(f"{records.source}: line {number}: {message}")
    return records.rows


def prompt_length(task: Task, tokenizer: Any = None, count_tokens: Optional[CountTokens] = None,
                  limit: Optional[int] = None) -> PromptLength:
    """A row's prompt length: the model's tokens of the prompt as the model reads it (with
    ``tokenizer``), else ``count_tokens`` of the rendered text (default: characters). With
    ``limit`` (max_prompt_tokens) a huge prompt is refused from a prefix of its text: a fast
    tokenizer takes minutes over a 10 MB row."""
    if tokenizer is not None:
        try:
            uses_chat_template(tokenizer, task)  # a template the config requires but the tokenizer lacks
        except PromptError as e:
            raise DataError(str(e)) from None

        def tokens(row: Row) -> int:
            try:
                if limit is not None and task.keep_last_tokens is None:  # kept from its end: never too long
                    _refuse_from_prefix(tokenizer, prompt_text(tokenizer, task, row), limit)
                return len(prompt_ids(tokenizer, task, row))
            except PromptError as e:
                raise BadRow(str(e), "chat_markup") from None
            except ChatTemplateError as e:  # the model's template, not the row: stops the job
                raise DataError(str(e)) from None

        return tokens
    count = count_tokens or len
    keep = task.keep_last_tokens
    return lambda row: count(task.render_prompt(row)) if keep is None else min(keep, count(task.render_prompt(row)))


def _refuse_from_prefix(tokenizer: Any, text: str, limit: int) -> None:
    """BadRow (too_long) when the first characters of a long prompt already hold more than
    ``limit`` tokens (by a margin no merge across the cut can close); nothing otherwise."""
    prefix = max(64 * limit, 1 << 16)
    if len(text) <= prefix:
        return
    head = len(tokenizer.encode(text[:prefix], add_special_tokens=False))
    if head > limit + 16:
        raise BadRow(f"prompt has {len(text)} characters; its first {prefix} alone are {head} tokens, more than "
                     f"max_prompt_tokens={limit}", "too_long")


def rows_from_records(
    task: Task,
    records: Union[Records, Sequence[dict[str, Any]]],
    *,
    source: Optional[str] = None,
    columns: Optional[dict[str, str]] = None,
    max_prompt_tokens: int,
    on_bad_row: str = "error",
    length: Optional[PromptLength] = None,
) -> tuple[list[Row], LoadReport]:
    """Validate ``records`` into rows of ``task``; see the module docstring for the rules."""
    if not isinstance(records, Records):
        records = Records(source or "records", list(records), list(range(1, len(records) + 1)))
    source = source or records.source
    length = length or prompt_length(task)
    report = LoadReport(source=source, read=len(records.rows) + len(records.unreadable))
    columns = _columns(task, records.rows, dict(columns or {}), source)
    rows: list[Row] = []
    seen: set[str] = set()

    def bad(number: int, error: BadRow) -> None:
        if on_bad_row == "error" and not isinstance(error, Filtered):
            raise DataError(f"{source}: {records.unit} {number}: {error} (set on_bad_row: skip to drop such rows)")
        report.skipped[error.reason] = report.skipped.get(error.reason, 0) + 1
        if len(report.examples) < 5:
            report.examples.append(f"{records.unit} {number}: {error}")

    problems = [(n, BadRow(message, reason)) for n, message, reason in records.unreadable]
    entries = sorted(
        [(n, None, e) for n, e in problems] + [(n, r, None) for n, r in zip(records.numbers, records.rows)],
        key=lambda x: x[0],
    )
    for number, raw, problem in entries:
        try:
            if problem is not None:
                raise problem
            row = _row(task, raw, columns)
            if row.prompt_id in seen:
                raise BadRow(f"duplicate id {row.prompt_id!r}", "duplicate_id")
            n_tokens = length(row)
            if n_tokens > max_prompt_tokens:
                raise BadRow(
                    f"prompt has {n_tokens} tokens, more than max_prompt_tokens={max_prompt_tokens}", "too_long"
                )
        except BadRow as e:
            bad(number, e)
            continue
        seen.add(row.prompt_id)
        rows.append(row)
    report.kept = len(rows)
    return rows, report


def _columns(task: Task, records: Sequence[dict[str, Any]], columns: dict[str, str], source: str) -> dict[str, str]:
    """``columns`` checked against the records' keys, with verl's answer path filled in."""
    if not records:
        return columns
    keys = set().union(*(r.keys() for r in records))
    if "answer" in task.required_fields and "answer" not in columns and "answer" not in keys and "reward_model" in keys:
        columns["answer"] = VERL_ANSWER
    absent = sorted(c for c in {columns.get(f, f) for f in task.required_fields} if not column_present(c, records))
    if absent:
        raise DataError(
            f"{source}: no column {absent} (columns: {sorted(keys)}); map it with source.columns, "
            "e.g. {prompt: question} or a dotted path such as {answer: reward_model.ground_truth}"
        )
    return columns


def _row(task: Task, raw: dict[str, Any], columns: dict[str, str]) -> Row:
    """One record as a Row of ``task`` (BadRow if it cannot be one)."""
    _check_text(raw)
    record = dict(raw)
    for canonical, column in columns.items():
        value = column_value(raw, column)
        record[canonical] = None if value is MISSING else value
    messages: tuple[dict[str, str], ...] = ()
    if isinstance(record.get("prompt"), (list, tuple)):
        messages = chat_messages(record["prompt"])
        record["prompt"] = messages[-1]["content"]
    row = task.from_record(record)
    return dataclasses.replace(row, messages=messages, record=raw)


def _check_text(value: Any, where: str = "") -> None:
    """BadRow (not_text) for a string anywhere in ``value`` that is not Unicode text: JSON's
    escapes can spell a lone surrogate ("\\ud800"), which no tokenizer or UTF-8 writer accepts."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise BadRow(f"field {where or 'value'!r} holds {value[e.start]!r} at character {e.start}, a lone "
                         "surrogate (JSON's \\ud800..\\udfff escapes outside a pair): not text", "not_text") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key, where)
            _check_text(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_text(item, f"{where}[{i}]")


def generate_rows(
    task: Task, n: int, seed: int, *, max_prompt_tokens: int, length: Optional[PromptLength] = None
) -> list[Row]:
    """``n`` distinct rows; draw i comes from ``stable_hash(task, seed, i)`` so any prefix is stable."""
    if task.generate is None:
        raise DataError(f"task {task.name!r} has no generator: give it a file source")
    length = length or prompt_length(task)
    rows: list[Row] = []
    seen: set[str] = set()
    draws, max_draws = 0, 50 * n + 1000
    while len(rows) < n:
        if draws >= max_draws:
            raise DataError(
                f"{task.name}: only {len(rows)} distinct problems in {draws} draws; "
                "lower source.n or raise the difficulty"
            )
        row = task.generate(stable_hash(task.name, seed, draws))
        draws += 1
        if row.prompt_id in seen:
            continue
        try:
            n_tokens = length(row)
        except BadRow as e:
            raise DataError(f"{task.name}: a generated prompt cannot be encoded: {e}") from None
        if n_tokens > max_prompt_tokens:
            raise DataError(
                f"{task.name}: a generated prompt has {n_tokens} tokens, "
                f"more than max_prompt_tokens={max_prompt_tokens}"
            )
        seen.add(row.prompt_id)
        rows.append(row)
    return rows


def split_rows(rows: Sequence[Row], held_out: Union[int, float], seed: int,
               source: str = "the task's data") -> tuple[list[Row], list[Row]]:
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
            raise DataError(f"{source}: task.held_out = {held_out} leaves no training rows out of its {len(rows)} "
                            "rows: lower task.held_out, or give more rows")
        held = set(sorted(keys, key=keys.__getitem__)[:held_out])
    return [r for r in rows if r.prompt_id not in held], [r for r in rows if r.prompt_id in held]


@dataclass
class TaskData:
    task: Task
    train: list[Row]
    held_out: list[Row]
    reports: list[LoadReport]


def load_task_data(
    cfg: Any, *, task: Optional[Task] = None, tokenizer: Any = None, count_tokens: Optional[CountTokens] = None
) -> TaskData:
    """Rows of the task described by a task config section, split into train and held-out.

    ``tokenizer``: the model's, so that ``max_prompt_tokens`` counts the tokens the model reads
    (module docstring); without it prompt lengths are ``count_tokens`` of the text (characters)."""
    task = task or build_task(cfg)
    length = prompt_length(task, tokenizer, count_tokens, limit=cfg.max_prompt_tokens)
    reports: list[LoadReport] = []

    def from_source(src: Any) -> list[Row]:
        if src.kind == "generated":
            rows = generate_rows(task, src.n, src.seed, max_prompt_tokens=cfg.max_prompt_tokens, length=length)
            reports.append(LoadReport(source=f"generated(n={src.n}, seed={src.seed})", read=len(rows), kept=len(rows)))
            return rows
        rows, report = rows_from_records(
            task, read_source(src), columns=src.columns, max_prompt_tokens=cfg.max_prompt_tokens,
            on_bad_row=cfg.on_bad_row, length=length,
        )  # fmt: skip
        reports.append(report)
        return rows

    rows = from_source(cfg.source)
    if not rows:
        report = reports[0]
        skipped = f", skipped {report.n_skipped} ({', '.join(report.examples[:2])})" if report.n_skipped else ""
        raise DataError(f"{report.source}: no rows to train on (read {report.read}{skipped})")
    if cfg.held_out_source is not None:
        held = from_source(cfg.held_out_source)
        held_ids = {r.prompt_id for r in held}
        train = [r for r in rows if r.prompt_id not in held_ids]  # a problem in both files is held out
        if len(train) < len(rows):
            reports[0].skipped["in_held_out"] = len(rows) - len(train)
            reports[0].kept = len(train)
    else:
        train, held = split_rows(rows, cfg.held_out, cfg.split_seed, reports[0].source)
    if not train:
        raise DataError(f"task {task.name!r}: no training rows left ({', '.join(r.source for r in reports)})")
    return TaskData(task=task, train=train, held_out=held, reports=reports)
