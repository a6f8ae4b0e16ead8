"""Config plumbing: strict pydantic models, YAML files and dotted command-line overrides.

Every component gets one section (a ``StrictModel``); unknown keys are errors, constraints live in
the field types, and a failure names the dotted path of the offending field. Overrides are applied
to the raw YAML dict *before* validation, so ``loss.clip_max=abc`` fails exactly like a bad file.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """Base of every config section: unknown keys are rejected, values are validated on assignment,
    and no float may be infinite or NaN (``lr=1e400`` reads as inf and would train nothing)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False)


class ConfigError(ValueError):
    """A config that cannot run, with every problem named by its dotted field path."""


MAX_CONFIG_BYTES = 1 << 20  # a job config is a few KB; the largest shipped one is under 4 KB
MAX_CONFIG_NODES = 100_000  # values after every alias is expanded (an alias bomb expands to billions)


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (plain YAML keeps the last one
    silently, so a second ``run:`` section would replace the first) and a document whose aliases
    expand to more than MAX_CONFIG_NODES values (a "billion laughs" file would hang what reads it)."""

    def compose_document(self) -> yaml.Node:
        node = super().compose_document()
        sizes: dict[int, int] = {}

        def expanded(n: yaml.Node) -> int:  # aliases share their node, so each distinct node is sized once
            if id(n) not in sizes:
                sizes[id(n)] = 0  # a recursive alias counts once
                children = n.value if isinstance(n, yaml.SequenceNode) else (
                    [x for kv in n.value for x in kv] if isinstance(n, yaml.MappingNode) else [])
                sizes[id(n)] = min(1 + sum(expanded(c) for c in children), MAX_CONFIG_NODES + 1)
            return sizes[id(n)]

        if node is not None and expanded(node) > MAX_CONFIG_NODES:
            raise yaml.YAMLError(f"its aliases expand to more than {MAX_CONFIG_NODES} values (an alias bomb?); "
                                 "write the values out")
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *anchor`` merges are meant to override
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in first_line:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice in one mapping (line {first_line[key]} and line {line})",
                    key_node.start_mark,
                )
            first_line[key] = line
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path} has {path.stat().st_size} bytes; a job config is at most "
                          f"{MAX_CONFIG_BYTES} (is it the right file?)")
    try:
        with path.open(encoding="utf-8") as f:
            data = yaml.load(f, Loader=_UniqueKeyLoader) or {}  # noqa: S506 - a SafeLoader subclass
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {e.start})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path}: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level, got {type(data).__name__}")
    return data


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (value parsed as YAML: ``3``, ``1e-6``, ``true``, ``[1,2]``)."""
    out = _deepcopy(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key.path=value")
        key, raw = item.split("=", 1)
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise ConfigError(f"override {item!r} has an empty key")
        try:
            value = yaml.load(raw, Loader=_UniqueKeyLoader) if raw.strip() else None  # noqa: S506 - a SafeLoader
        except yaml.YAMLError as e:
            raise ConfigError(f"override {item!r}: {e}") from None
        node = out
        for p in parts[:-1]:
            child = node.get(p)
            if child is None:
                child = node[p] = {}
            elif not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {p!r} is a value, not a section")
            node = child
        node[parts[-1]] = value
    return out


def validate(model: type[M], data: dict[str, Any], source: str = "config") -> M:
    """Validate ``data`` into ``model``; re-raise as a ConfigError that lists dotted field paths,
    the value given and what is allowed."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = ".".join(str(p) for p in err["loc"])
            given = err.get("input")
            given_s = "" if isinstance(given, (dict, BaseModel)) else f" (got {given!r})"
            if err["type"] == "extra_forbidden":
                given_s += f"; valid keys: {', '.join(_keys_at(model, err['loc'][:-1]))}"
            msg = err["msg"].removeprefix("Value error, ")
            # a whole-model validator has no location; its message starts with the field to change
            lines.append(f"  {loc}: {msg}{given_s}" if loc else f"  {msg}")
        raise ConfigError(f"invalid {source}:\n" + "\n".join(lines)) from None


def _keys_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The field names of the section at ``loc`` (a union member is named by its tag in ``loc``)."""
    from typing import get_args

    def models_in(annotation: Any) -> list[type[BaseModel]]:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return [annotation]
        return [m for a in get_args(annotation) for m in models_in(a)]

    candidates = [model]
    for part in loc:
        fields = [f for m in candidates for name, f in m.model_fields.items() if name == part]
        if fields:
            candidates = [m for f in fields for m in models_in(f.annotation)]
        else:  # a discriminated union's tag: keep the member with a literal field (name, kind) of that value
            tagged = [m for m in candidates if any(part in get_args(f.annotation) for f in m.model_fields.values())]
            candidates = tagged or candidates
    return sorted({name for m in candidates[:1] for name in m.model_fields})


def _deepcopy(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _deepcopy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deepcopy(v) for v in d]
    return d
