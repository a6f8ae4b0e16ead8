"""Reading a task's records: JSONL and Parquet files, Hugging Face datasets; columns and messages.

    records = read_source(src)          # Records: dicts with their 1-based row (or line) numbers

- **JSONL** is read line by line with Python's json, so a line of any size is fine, each line
  stands on its own (a field may be a number in one line and text in another), and a line that is
  not UTF-8 or not a JSON object is reported with its *line* number (a file in another encoding,
  or a truncated last line) and handled by ``task.on_bad_row`` like any bad row. A ``.json`` file
  holding one JSON array of objects is read as a whole.
- **Parquet** goes through pyarrow; its schema makes every column one type.
- **CSV** (a header line, then one record per line) through Python's csv: every value is text.
- **Hugging Face datasets** (``source: {kind: hf, dataset: ...}``): a directory written by
  ``save_to_disk`` is read with ``datasets.load_from_disk``; a hub id (``openai/gsm8k``, with
  ``config`` and ``split``) with ``datasets.load_dataset``, which reads its local cache and obeys
  ``HF_DATASETS_OFFLINE`` / ``HF_HUB_OFFLINE`` (offline, a dataset missing from the cache is an
  error that says how to fetch it).

``column_value(record, "reward_model.ground_truth")`` follows a dotted path into nested fields
(list items by index: ``prompt.0.content``); a column whose own name has dots is found first.
``chat_messages`` validates a prompt given as chat messages (``[{role, content}, ...]``, verl's
layout), whose last turn must be the user's.
"""
from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from stabledrl.common.tasks.base import BadRow

MISSING = object()
ROLES = ("system", "user", "assistant")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class DataError(ValueError):
    """Data that cannot be used: an unreadable file, a missing column, or a bad row (on_bad_row=error)."""


@dataclass
class Records:
    """What one source held: its records, each record's number, and the entries that could not be
    parsed (number, message, reason) for ``on_bad_row`` to stop on or count."""

    source: str
    rows: list[dict[str, Any]]
    numbers: list[int]
    unit: str = "row"  # JSONL numbers are file lines
    unreadable: list[tuple[int, str, str]] = field(default_factory=list)


def read_source(src: Any) -> Records:
    """The records of a ``FileSource`` or ``HFDatasetSource`` config."""
    if src.kind == "hf":
        return read_hf_dataset(src.dataset, config=src.config, split=src.split, revision=src.revision)
    return read_file(src.path, src.format)


def read_file(path: Any, fmt: str = "auto") -> Records:
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataError(f"data file {path} does not exist")
    if fmt == "auto":
        fmt = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}.get(path.suffix, "jsonl")
    if fmt == "csv":
        return _read_csv(path)
    if fmt == "parquet":
        try:
            import pyarrow.parquet as pq

            rows = pq.read_table(path).to_pylist()
        except Exception as e:  # ArrowInvalid / OSError: a truncated or non-Parquet file
            raise DataError(f"cannot read {path} as parquet: {e}") from e
        return Records(str(path), rows, list(range(1, len(rows) + 1)))
    return _read_jsonl(path)


def _read_jsonl(path: Path) -> Records:
    records = Records(str(path), [], [], unit="line")
    with path.open("rb") as f:
        head = f.read(64).lstrip(b"\xef\xbb\xbf \t\r\n")
        f.seek(0)
        if head.startswith(b"["):
            return _read_json_array(path, f.read())
        for number, raw in enumerate(f, start=1):
            if number == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte-order mark
            if not raw.strip():
                continue
            raw = raw.rstrip(b"\r\n")
            try:
                value = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                message = f"not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1}); save the file as UTF-8"
                records.unreadable.append((number, message, "not_utf8"))
                continue
            except json.JSONDecodeError as e:
                records.unreadable.append((number, f"not valid JSON ({e.msg}, column {e.colno})", "bad_json"))
                continue
            if not isinstance(value, dict):
                records.unreadable.append((number, f"a JSON {type(value).__name__}, not an object", "bad_json"))
                continue
            records.rows.append(value)
            records.numbers.append(number)
    return records


def _read_csv(path: Path) -> Records:
    """A CSV file with a header line; every value stays text (``0140...`` keeps its leading zero)."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            rows = [dict(r) for r in csv.DictReader(f)]
    except (UnicodeDecodeError, csv.Error) as e:
        raise DataError(f"cannot read {path} as CSV (UTF-8 with a header line): {e}") from None
    return Records(str(path), rows, list(range(1, len(rows) + 1)))


def _read_json_array(path: Path, data: bytes) -> Records:
    try:
        value = json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise DataError(
            f"{path}: line {line} is not UTF-8 (byte 0x{data[e.start]:02x}); save the file as UTF-8"
        ) from None
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON ({e.msg}, line {e.lineno}, column {e.colno})") from None
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise DataError(f"{path}: a .json file must hold one object per line or one array of objects")
    return Records(str(path), value, list(range(1, len(value) + 1)))


def read_hf_dataset(dataset: str, *, config: Optional[str] = None, split: str = "train",
                    revision: Optional[str] = None) -> Records:
    """Records of a ``save_to_disk`` directory or of a hub dataset from the datasets cache."""
    import datasets

    where = Path(dataset).expanduser()
    if where.is_dir():
        try:
            loaded = datasets.load_from_disk(str(where))
        except FileNotFoundError as e:
            raise DataError(f"{where} is not a directory written by save_to_disk: {e}") from None
        name = str(where)
    elif _HUB_ID.match(dataset):
        loaded = _load_hub_dataset(dataset, config, split, revision)
        name = f"{dataset}" + (f" ({config})" if config else "")
    else:
        raise DataError(f"dataset {dataset!r} is neither a directory written by save_to_disk nor a hub id (org/name)")
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DataError(f"{name} has no split {split!r} (splits: {sorted(loaded)}); set source.split")
        loaded = loaded[split]
    rows = loaded.to_list()
    return Records(f"{name}[{split}]", rows, list(range(1, len(rows) + 1)))


def _load_hub_dataset(dataset: str, config: Optional[str], split: str, revision: Optional[str]) -> Any:
    import datasets

    try:
        return datasets.load_dataset(dataset, config, split=split, revision=revision)
    except ConnectionError:
        args = ", ".join(repr(a) for a in (dataset, config) if a is not None)
        raise DataError(
            f"dataset {dataset!r} is not in the local datasets cache ({datasets.config.HF_DATASETS_CACHE}) and the "
            f"hub cannot be reached (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE, or no network). Fetch it once where the "
            f"hub is reachable: python -c \"import datasets; datasets.load_dataset({args})\" (same HF_HOME), or "
            "save it with save_to_disk and give that directory as source.dataset"
        ) from None
    except ValueError as e:  # an unknown split or config, named by datasets with the valid ones
        raise DataError(f"dataset {dataset!r}: {e}") from None


def column_value(record: Mapping[str, Any], column: str) -> Any:
    """``record[column]``, or the value at a dotted path into nested fields; MISSING if absent."""
    if column in record:
        return record[column]
    node: Any = record
    for part in column.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif (
            isinstance(node, (list, tuple)) and re.fullmatch(r"-?[0-9]+", part) and -len(node) <= int(part) < len(node)
        ):
            node = node[int(part)]
        else:
            return MISSING
    return node


def column_present(column: str, records: list[dict[str, Any]]) -> bool:
    """Whether some record holds ``column`` (its own name, or a dotted path that resolves)."""
    return any(column_value(r, column) is not MISSING for r in records)


def chat_messages(value: Any) -> tuple[dict[str, str], ...]:
    """A prompt given as chat messages, validated: roles system/user/assistant, text content, and
    a user turn last (the model answers it). Raises BadRow."""
    if not value:
        raise BadRow("field 'prompt' is an empty message list", "empty_field")
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, Mapping) or "role" not in message or "content" not in message:
            raise BadRow(f"prompt message {i} is not a {{role, content}} object")
        role, content = message["role"], message["content"]
        if role not in ROLES or not isinstance(content, str):
            raise BadRow(f"prompt message {i} has role {role!r} (allowed: {', '.join(ROLES)}) or non-text content")
        out.append({"role": role, "content": content})
    if out[-1]["role"] != "user":
        raise BadRow(f"the last prompt message is the {out[-1]['role']}'s; it must be the user's")
    if not out[-1]["content"].strip():
        raise BadRow("the user's prompt message is empty", "empty_field")
    return tuple(out)
