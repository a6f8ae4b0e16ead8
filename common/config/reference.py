"""The config reference (docs/config.md, `stabledrl config`), generated from the models: every
key as its dotted override path, with its type, default and description.

A section is a model: its keys form one table. A field whose value is a section gets a heading of
its own below (``task.reward.sandbox``). A section that is one of several models (a tagged union:
``task`` by ``name``, ``task.source`` by ``kind``) lists the keys every member shares, then each
member's own keys under ``name: gsm8k``. A model met again inside itself (a DiPOD loss wraps a
loss) points back to its first heading.
"""
from __future__ import annotations

import json
import re
import typing
from pathlib import Path
from typing import Any, Optional, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, to_jsonable_python

from stabledrl.common.config import schema

HEADER = """# Config reference

Every key of a job config (`stabledrl train --config FILE`), generated from the pydantic models by
`stabledrl config > docs/config.md`; `stabledrl config SECTION` prints one section (`stabledrl config
task.reward`). A key is also its command-line override: `stabledrl train --config FILE
task.reward.timeout_s=10 run.steps=20` (values are YAML: quote a string holding braces or a colon,
`"task.template='{prompt}'"`). Unknown keys are refused with the closest valid one. Where a section
is one of several kinds (`task` by `name`, `task.source` by `kind`, `estimator` and `loss` by
`name`), the keys every kind shares come first, then each kind's own; setting the kind by override
(`task.source.kind=file`) drops the keys the file gave that the new kind does not take.
"""


def reference(root: type[BaseModel], only: Optional[str] = None) -> str:
    """The reference of ``root`` (a JobConfig) as markdown; ``only``: one section's dotted path (its
    headings and those below it) or one key's (its rows). KeyError when nothing is at ``only``."""
    seen: dict[type, str] = {}
    body = "\n".join(_section(name, field.annotation, seen).rstrip() + "\n"
                     for name, field in root.model_fields.items())
    if only is None:
        return HEADER + "\n" + body
    chunks = re.split(r"\n(?=#+ `)", "\n" + body)
    picked = [c.strip("\n") for c in chunks if _under(_heading_path(c), only) and "The same keys as" not in c]
    if picked:
        return "\n\n".join(picked) + "\n"
    rows = list(dict.fromkeys(line for line in body.splitlines() if line.startswith(f"| `{only}` |")))
    if not rows:
        raise KeyError(only)
    return "\n".join(["| key | type | default | description |", "|---|---|---|---|", *rows]) + "\n"


def _heading_path(chunk: str) -> str:
    """'task.name' of '### `task.name: gsm8k`', 'eval.protocol.benchmarks' of '... .<key>`'."""
    found = re.match(r"\s*#+ `([^`]*)`", chunk)
    return found.group(1).split(":")[0].replace(".<key>", "") if found else ""


def _under(path: str, only: str) -> bool:
    return path == only or path.startswith(f"{only}.")


def _section(path: str, annotation: Any, seen: dict[type, str], level: int = 2) -> str:
    """One section's heading, table and the sections below it."""
    members = schema.models_in(annotation)
    heading = "#" * min(level, 4) + f" `{path}`"
    repeated = [m for m in members if m in seen]
    if repeated and len(repeated) == len(members):
        return f"{heading}\n\nThe same keys as `{seen[repeated[0]]}`.\n"
    for member in members:
        seen.setdefault(member, path)
    tag = schema.tag_field(members)
    optional = type(None) in get_args(annotation) or any(
        type(None) in get_args(a) for a in get_args(annotation) if get_origin(a) is typing.Annotated)
    note = " Optional: leave it out (or null) for none." if optional else ""
    if tag is None:
        model = members[0]
        out = [f"{heading}\n", (_doc(model) + note).strip() + "\n", _table(path, model.model_fields)]
        out += [_section(f"{path}.{name}{key}", value, seen, level + 1) for name, f in model.model_fields.items()
                for key, value in _below(f.annotation)]
        return "\n".join(out)
    shared = _shared_fields(members)
    kinds = ", ".join(f"`{v}`" for m in members for v in schema.literal_values(m.model_fields[tag].annotation))
    out = [f"{heading}\n", f"One of several kinds, chosen by `{path}.{tag}`: {kinds}.{note}\n",
           "Keys every kind takes:\n\n" + _table(path, {n: members[0].model_fields[n] for n in shared})]
    below = [n for n in shared if schema.models_in(members[0].model_fields[n].annotation)]
    for member in members:
        value = schema.literal_values(member.model_fields[tag].annotation)[0]
        own = {n: f for n, f in member.model_fields.items() if n not in shared and n != tag}
        text = f"{'#' * min(level + 1, 4)} `{path}.{tag}: {value}`\n\n{_doc(member)}"
        out.append(text + ("\n\n" + _table(path, own) if own else "\n\nNo keys of its own."))
        out += [_section(f"{path}.{n}", f.annotation, seen, level + 2) for n, f in own.items()
                if schema.models_in(f.annotation)]
    out += [_section(f"{path}.{n}", members[0].model_fields[n].annotation, seen, level + 1) for n in below]
    return "\n".join(out)


def _below(annotation: Any) -> list[tuple[str, Any]]:
    """The section a field holds ('', its annotation), or the sections of a dict of them ('.<key>', ...)."""
    if schema.models_in(annotation):
        return [("", annotation)]
    for leaf in schema.leaves(annotation):
        if get_origin(leaf) is dict and schema.models_in(get_args(leaf)[1]):
            return [(".<key>", get_args(leaf)[1])]
    return []


def _shared_fields(members: list[type[BaseModel]]) -> list[str]:
    """The keys every member has alike (same type, default and description), in the first's order."""
    def same(name: str) -> bool:
        fields = [m.model_fields.get(name) for m in members]
        return all(f is not None for f in fields) and len({_signature(f) for f in fields}) == 1

    return [n for n in members[0].model_fields if same(n) and schema.tag_field(members) != n]


def _signature(field: FieldInfo) -> tuple[str, str, str]:
    return _type(field), _default(field), field.description or ""


def _doc(model: type[BaseModel]) -> str:
    text = (model.__doc__ or "").strip()
    return " ".join(text.split("\n\n")[0].split()) if text else ""


def _table(path: str, fields: dict[str, FieldInfo]) -> str:
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    for name, field in fields.items():
        models = schema.models_in(field.annotation)
        if models and not _scalar_leaves(field.annotation):
            about = field.description or _doc(models[0])
            rows.append(f"| `{path}.{name}` | section | | {_cell(about)} (below) |")
            continue
        rows.append(f"| `{path}.{name}` | {_cell(_type(field))} | {_cell(_default(field))} | "
                    f"{_cell(field.description or '')} |")
    return "\n".join(rows) if len(rows) > 2 else "No keys."


def _scalar_leaves(annotation: Any) -> list[Any]:
    return [leaf for leaf in schema.leaves(annotation) if not schema.is_model(leaf)]


def _type(field: FieldInfo) -> str:
    text = _annotation(field.annotation)
    bounds = _bounds(field.metadata)
    return f"{text} ({bounds})" if bounds else text


def _annotation(annotation: Any) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is typing.Annotated:
        inner = _annotation(args[0])
        bounds = _bounds(args[1:])
        return f"{inner} ({bounds})" if bounds else inner
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        names = [_annotation(a) for a in args if a is not type(None)]
        return " | ".join(names) + (" | null" if type(None) in args else "")
    if origin in (list, tuple, set):
        return f"list[{', '.join(_annotation(a) for a in args)}]"
    if origin is dict:
        return f"dict[{', '.join(_annotation(a) for a in args)}]"
    if schema.is_model(annotation):
        return "section"
    if isinstance(annotation, type) and issubclass(annotation, Path):
        return "path"
    return getattr(annotation, "__name__", str(annotation))


def _bounds(metadata: Any) -> str:
    words = {Ge: ">= {}", Gt: "> {}", Le: "<= {}", Lt: "< {}", MinLen: "length >= {}", MaxLen: "length <= {}"}
    out = []
    for item in metadata:
        for kind, text in words.items():
            if isinstance(item, kind):
                value = getattr(item, {Ge: "ge", Gt: "gt", Le: "le", Lt: "lt", MinLen: "min_length",
                                       MaxLen: "max_length"}[kind])
                out.append(text.format(value))
    return ", ".join(out)


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        if isinstance(value, BaseModel):
            return "(its defaults)"
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    return json.dumps(to_jsonable_python(value), ensure_ascii=False)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
