"""Dataclass schemas with declarative checks, so every bad config fails early with one line naming the key.

A field declares its help text and allowed range in `metadata` (TRL's help strings, verl's frozen configs); a
number must be finite unless the field declares `"inf": True` (and says what infinity means in its help):

    delta: float = field(default=0.15, metadata={"gt": 0, "help": "..."})

A field that changes how a run is carried out or watched, not what it computes, says `"free": True`: two run
records may differ in it (harness.rundir.record).

`build(Schema, values, where="objective")` rejects unknown keys, wrong types and out-of-range values with a
`ValueError` like `objective.delta: must be > 0, got -1.0`.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, get_args, get_origin

T = TypeVar("T")


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if get_origin(tp) in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in get_args(tp))
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any) -> tuple[bool, Any]:
    """Return (ok, converted) for a YAML/CLI value against a type hint; ints are accepted where floats are."""
    origin = get_origin(tp)
    if tp is Any:
        return True, value
    if origin is Literal:
        return value in get_args(tp), value
    if origin in (typing.Union, types.UnionType):
        for arm in get_args(tp):
            ok, v = _coerce(value, arm)
            if ok:
                return True, v
        return False, value
    if tp is type(None):
        return value is None, value
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False, value
        return True, float(value)
    if tp is str:
        return isinstance(value, str), value
    if origin is dict or tp is dict:
        return isinstance(value, Mapping), dict(value) if isinstance(value, Mapping) else value
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            return False, value
        (item_tp, *_) = get_args(tp) or (Any,)
        items = []
        for item in value:
            ok, v = _coerce(item, item_tp)
            if not ok:
                return False, value
            items.append(v)
        return True, tuple(items) if origin is tuple else items
    if dataclasses.is_dataclass(tp):
        return isinstance(value, Mapping | tp), value
    return isinstance(value, tp), value


_BOUNDS = {
    "gt": (lambda v, b: v > b, "> {}"),
    "ge": (lambda v, b: v >= b, ">= {}"),
    "lt": (lambda v, b: v < b, "< {}"),
    "le": (lambda v, b: v <= b, "<= {}"),
}


def check_field(f: dataclasses.Field, value: Any, tp: Any, where: str) -> Any:
    ok, value = _coerce(value, tp)
    if not ok:
        raise ValueError(f"{where}.{f.name}: expected {_type_name(tp)}, got {value!r}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if math.isnan(value):
            raise ValueError(f"{where}.{f.name}: must be a number, got nan")
        if math.isinf(value) and not f.metadata.get("inf"):  # only where a field says what infinity means
            raise ValueError(f"{where}.{f.name}: must be a finite number, got {value!r}")
        for key, (test, text) in _BOUNDS.items():
            if key in f.metadata and not test(value, f.metadata[key]):
                raise ValueError(f"{where}.{f.name}: must be {text.format(f.metadata[key])}, got {value!r}")
    return value


def build(schema: type[T], values: Mapping[str, Any], where: str) -> T:
    """Instantiate `schema` from a plain mapping, validating every key (nested dataclasses included)."""
    fields = {f.name: f for f in dataclasses.fields(schema) if f.init}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(f"{where}: unknown key '{unknown[0]}'; allowed keys: {', '.join(sorted(fields))}")
    hints = typing.get_type_hints(schema)
    kwargs = {}
    for name, value in values.items():
        f, tp = fields[name], hints[name]
        if dataclasses.is_dataclass(tp) and isinstance(value, Mapping):
            kwargs[name] = build(tp, value, f"{where}.{name}")
        else:
            kwargs[name] = check_field(f, value, tp, where)
    obj = schema(**kwargs)
    # Defaults are validated too, so a schema with a bad default cannot slip through.
    for name, f in fields.items():
        if name not in values and not dataclasses.is_dataclass(hints[name]):
            check_field(f, getattr(obj, name), hints[name], where)
    return obj


def describe(schema: type) -> list[tuple[str, str, Any, str]]:
    """(name, type, default, help) per field: for docs and `--help`-style listings."""
    hints = typing.get_type_hints(schema)
    rows = []
    for f in dataclasses.fields(schema):
        default = f.default if f.default is not dataclasses.MISSING else None
        rows.append((f.name, _type_name(hints[f.name]), default, f.metadata.get("help", "")))
    return rows
