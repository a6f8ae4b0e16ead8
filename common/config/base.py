"""Config plumbing: strict pydantic models, YAML files and dotted command-line overrides.

Every component gets one section (a ``StrictModel``); unknown keys are errors, constraints live in
the field types, and a failure names the dotted path of the offending field. Overrides are applied
to the raw YAML dict *before* validation, so ``loss.clip_max=abc`` fails exactly like a bad file.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError
from stabledrl.common.config import schema

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """Base of every config section: unknown keys are rejected, values are validated on assignment,
    and no float may be infinite or NaN (``lr=1e400`` reads as inf and would train nothing)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False)


# The longest wait any timeout field may name: 1e300 s passes `gt=0` but overflows every timer it
# reaches (select, setitimer, a timedelta, RLIMIT_CPU); eleven days is beyond any wait a job means.
MAX_SECONDS = 1e6
MAX_MIB = 1 << 20  # a size in MiB (1 TiB): << 20 of more overflows the limits the kernel takes


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


def apply_overrides(data: dict[str, Any], overrides: list[str], model: Optional[type[BaseModel]] = None
                    ) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (value parsed as YAML: ``3``, ``1e-6``, ``true``, ``[1,2]``).

    With ``model``, an override that switches a section to another member of its union
    (``task.source.kind=file`` on a recipe whose source is a Hugging Face dataset) also drops the
    keys the section had that the new member does not take (``dataset``, ``split``), unless an
    override sets them: ``task.source.kind=file task.source.path=x.jsonl`` swaps the source and
    keeps its ``columns``."""
    out = _deepcopy(data)
    set_by_overrides = {item.split("=", 1)[0].strip() for item in overrides}
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
        if model is not None and parts[-1] in node and node[parts[-1]] != value:
            _drop_other_members_keys(model, parts, node, value, set_by_overrides)
        node[parts[-1]] = value
    return out


def _drop_other_members_keys(model: type[BaseModel], parts: list[str], node: dict[str, Any], tag: Any,
                             keep: set[str]) -> None:
    """``parts`` sets the tag field of the union at ``parts[:-1]`` (``node``) to ``tag``: drop the
    keys of ``node`` the member ``tag`` names does not take, but those an override sets."""
    walked = schema.walk(model, parts[:-1])
    members = {t: m for c in walked.candidates for t, m in schema.variants(c).items()}
    field = schema.tag_field(list(dict.fromkeys(members.values())))
    member = members.get(str(tag))
    if field != parts[-1] or member is None:
        return
    prefix = ".".join(parts[:-1])
    for key in [k for k in node if k not in member.model_fields and f"{prefix}.{k}" not in keep]:
        del node[key]


def validate(model: type[M], data: dict[str, Any], source: str = "config") -> M:
    """Validate ``data`` into ``model``; re-raise as a ConfigError with one line per problem, each
    starting with the dotted path an override would spell (``task.reward.timeout_s``, never the
    union member pydantic tried), the value given, what is allowed and, for a misspelled key or
    choice, the closest valid one."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        lines = [error_line(model, err) for err in e.errors()]
        raise ConfigError(f"invalid {source}:\n" + "\n".join(f"  {line}" for line in lines)) from None


_LEADING_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*")


def error_line(model: type[BaseModel], err: Any) -> str:
    """One pydantic error as a line that starts with the field's override path."""
    kind, loc, ctx = err["type"], tuple(err["loc"]), err.get("ctx") or {}
    walked = schema.walk(model, loc)
    path = walked.dotted
    given = err.get("input")
    given_s = "" if isinstance(given, (dict, BaseModel)) else f" (got {given!r})"
    msg = err["msg"].removeprefix("Value error, ")
    if walked.items:
        msg = f"item {', '.join(map(str, walked.items))}: {msg}"
    if kind == "extra_forbidden":
        key, section = str(loc[-1]), schema.walk(model, loc[:-1]).dotted
        valid = schema.keys_at(model, loc[:-1])
        hint = _suggestion(model, key, valid, section)
        return f"{section + '.' if section else ''}{key}: unknown key{given_s}{hint}; valid keys: {', '.join(valid)}"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        return _tag_line(model, loc, path, ctx)
    if kind == "literal_error":
        expected = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        close = schema.did_you_mean(str(given), expected) if isinstance(given, str) else None
        return f"{path}: {msg}{given_s}" + (f"; did you mean {close!r}?" if close else "")
    if kind == "value_error" and walked.models() and not walked.items:
        return _model_rule_line(model, path, msg)
    return f"{path}: {msg}{given_s}" if path else msg


def _suggestion(model: type[BaseModel], key: str, valid: list[str], section: str) -> str:
    """'; did you mean X?' for a misspelled key: the closest key of its section; else the closest
    key of another member of the section's union (``task.source.path`` on a generated source: a
    file's); else the same key in another section (``algorithm.lr``: ``learner.optimizer.lr``)."""
    close = schema.did_you_mean(key, valid)
    if close is not None:
        return f"; did you mean {close}?"
    members = schema.union_members(model, section)
    field = schema.tag_field(members)
    for member in members:
        close = schema.did_you_mean(key, list(member.model_fields))
        if close is not None and field is not None and close not in valid:
            tag = schema.literal_values(member.model_fields[field].annotation)[0]
            if close == key:
                return f"; {key} is a key of {section}.{field}={tag}, not of this {field}"
            return f"; did you mean {close}? (a key of {section}.{field}={tag}: set that too)"
    other = schema.elsewhere(model, key)
    return f"; did you mean {' or '.join(other[:3])}?" if other else ""


def _tag_line(model: type[BaseModel], loc: tuple, path: str, ctx: dict[str, Any]) -> str:
    """A union member named wrongly (``task.name=chess``) or not at all: the tag field's path, the
    tags allowed and the closest one."""
    walked = schema.walk(model, loc)
    members = {tag: m for c in walked.candidates for tag, m in schema.variants(c).items()}
    field = schema.tag_field(list(dict.fromkeys(members.values()))) or str(ctx.get("discriminator", "")).strip("'")
    tags = ", ".join(repr(t) for t in members) or str(ctx.get("expected_tags", ""))
    where = f"{path}.{field}" if path else field
    if "tag" not in ctx:
        return f"{where}: required, one of {tags}"
    close = schema.did_you_mean(ctx["tag"], list(members))
    return f"{where}: {ctx['tag']!r} is not one of {tags}" + (f"; did you mean {close!r}?" if close else "")


def _model_rule_line(model: type[BaseModel], path: str, msg: str) -> str:
    """A rule of a whole section (a model validator): its message starts with the field to change,
    named relative to the section (``min_numbers must be ...``) or from the top (``learner.lr ...``);
    the line starts with that field's full path."""
    lead = _LEADING_PATH.match(msg)
    if lead and path and schema.resolves(model, f"{path}.{lead.group(0)}"):
        return f"{path}.{msg}"
    if lead and schema.resolves(model, lead.group(0)):
        return msg
    return f"{path}: {msg}" if path else msg


def _deepcopy(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _deepcopy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deepcopy(v) for v in d]
    return d
