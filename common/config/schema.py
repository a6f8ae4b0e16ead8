"""The config's models read as the tree a user types: dotted paths, the fields at a path, the
members of a tagged union.

Pydantic locates an error by the path it validated, which names the member of a tagged union it
tried (``task.gsm8k.source.hf.dataset``); a user types ``task.source.dataset=...``. ``walk``
turns the first into the second (the members' tags dropped, dict keys kept), and what it finds on
the way (the candidate models at the end) gives the valid keys, the close matches of a misspelled
key and a union's tag field. ``common/config/reference.py`` reads the same tree to print the
config reference.
"""
from __future__ import annotations

import difflib
import types
import typing
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence, Union, get_args, get_origin

from pydantic import BaseModel


def leaves(annotation: Any) -> list[Any]:
    """The alternatives of an annotation: Optional, Union and Annotated unwrapped (None dropped)."""
    origin = get_origin(annotation)
    if origin is typing.Annotated:
        return leaves(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [leaf for arg in get_args(annotation) for leaf in leaves(arg)]
    return [] if annotation is type(None) else [annotation]


def is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def models_in(annotation: Any) -> list[type[BaseModel]]:
    return [leaf for leaf in leaves(annotation) if is_model(leaf)]


def literal_values(annotation: Any) -> tuple[Any, ...]:
    """The values of a Literal annotation (through Optional and Annotated), else ()."""
    return tuple(v for leaf in leaves(annotation) if get_origin(leaf) is typing.Literal for v in get_args(leaf))


def tag_field(members: Sequence[type[BaseModel]]) -> Optional[str]:
    """The field that tells a union's models apart (``name``, ``kind``): a Literal field of every
    member, with values no two members share; None for a single model or an untagged union."""
    if len(members) < 2:
        return None
    for name in members[0].model_fields:
        values = [literal_values(m.model_fields[name].annotation) if name in m.model_fields else () for m in members]
        flat = [v for vs in values for v in vs]
        if all(values) and len(flat) == len(set(flat)):
            return name
    return None


def variants(annotation: Any) -> dict[str, type[BaseModel]]:
    """A tagged union's members by tag value ({} when the annotation is not one)."""
    members = models_in(annotation)
    field = tag_field(members)
    if field is None:
        return {}
    return {str(v): m for m in members for v in literal_values(m.model_fields[field].annotation)}


def _container(annotation: Any) -> Optional[tuple[str, Any]]:
    """('dict', value type) or ('list', item type) for a dict / list annotation, else None."""
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin in (dict, typing.Mapping) or annotation is dict:
        return "dict", args[1] if len(args) == 2 else Any
    if origin in (list, tuple, set, typing.Sequence) or annotation in (list, tuple):
        return "list", args[0] if args else Any
    return None


@dataclass
class Walked:
    """Where a pydantic location leads: the path as a user types it, list items met on the way, and
    the models (or other types) the last segment can be."""

    path: list[str]
    items: list[int]
    candidates: list[Any]

    @property
    def dotted(self) -> str:
        return ".".join(self.path)

    def models(self) -> list[type[BaseModel]]:
        return list(dict.fromkeys(m for c in self.candidates for m in models_in(c)))


def walk(root: type[BaseModel], loc: Sequence[Any]) -> Walked:
    """Follow ``loc`` (a pydantic error location, or a dotted path split) from ``root``: field
    names and dict keys are kept, a union member's tag narrows the candidates and is dropped, a list
    index is noted apart (an override sets a whole list)."""
    path: list[str] = []
    items: list[int] = []
    candidates: list[Any] = [root]
    for part in loc:
        options = [leaf for c in candidates for leaf in leaves(c)]
        fields = [m.model_fields[part] for m in options if is_model(m) and isinstance(part, str) and
                  part in m.model_fields]
        containers = [c for c in (_container(o) for o in options) if c is not None]
        if fields:
            path.append(str(part))
            candidates = [f.annotation for f in fields]
        elif isinstance(part, int) and any(kind == "list" for kind, _ in containers):
            items.append(part)
            candidates = [item for kind, item in containers if kind == "list"]
        elif any(kind == "dict" for kind, _ in containers) and not _is_tag(options, part):
            path.append(str(part))
            candidates = [value for kind, value in containers if kind == "dict"]
        else:  # a union member's tag (or a scalar alternative such as 'constrained-int'): narrow to it
            tagged = [m for m in options if is_model(m) and _has_tag(m, part)]
            candidates = tagged or options
    return Walked(path, items, candidates)


def _has_tag(model: type[BaseModel], value: Any) -> bool:
    return any(str(value) in map(str, literal_values(f.annotation)) for f in model.model_fields.values())


def _is_tag(options: list[Any], part: Any) -> bool:
    return any(is_model(m) and _has_tag(m, part) for m in options)


def resolves(root: type[BaseModel], dotted: str) -> bool:
    """Whether ``dotted`` names a field (or a key of a dict field) of ``root``'s tree."""
    parts = dotted.split(".")
    walked = walk(root, parts)
    return walked.path == parts


def keys_at(root: type[BaseModel], loc: Sequence[Any]) -> list[str]:
    """The field names of the section at ``loc`` (the first candidate model: the union member the
    location's tag named)."""
    models = walk(root, loc).models()
    return sorted(models[0].model_fields) if models else []


def field_paths(root: type[BaseModel], prefix: str = "", seen: Optional[set] = None) -> Iterator[str]:
    """Every dotted field path of ``root``'s tree (each union member's fields included)."""
    seen = set() if seen is None else seen
    if root in seen:  # a recursive model (a DiPOD loss wraps another loss) is listed once
        return
    seen = seen | {root}
    for name, field in root.model_fields.items():
        path = f"{prefix}{name}"
        yield path
        for model in models_in(field.annotation):
            yield from field_paths(model, f"{path}.", seen)


def union_members(root: type[BaseModel], dotted: str) -> list[type[BaseModel]]:
    """Every model the section at ``dotted`` can be (the members of its union)."""
    walked = walk(root, dotted.split(".") if dotted else [])
    return list(dict.fromkeys(m for c in walked.candidates for m in models_in(c)))


def did_you_mean(word: str, choices: Sequence[str]) -> Optional[str]:
    """The choice closest to ``word`` (a misspelling), or None."""
    found = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return found[0] if found else None


def elsewhere(root: type[BaseModel], key: str) -> list[str]:
    """Full paths in ``root``'s tree whose last field is ``key`` (a key put in the wrong section)."""
    return sorted({p for p in field_paths(root) if p.rsplit(".", 1)[-1] == key})
