"""A run directory's config record (`run_config.json`: the validated config a run started with) and which of its
keys two records may differ in: the resume guard refuses a resume that differs, the findings suite reuses a run
only when its record matches, and W&B leaves the free keys out of a run's top-level config."""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any

RECORD = "run_config.json"
CHANGES = "resume_changes.jsonl"


def free_keys() -> tuple[str, ...]:
    """The keys whose field says `"free": True` (harness.schema): they change how a run is carried out or watched,
    not what it computes. A group's field marked free frees the whole group (`logger`)."""
    from harness.config.run import RunConfig  # the schemas hold the mark; they import nothing of rundir

    keys, types = [], typing.get_type_hints(RunConfig)  # the annotations are strings (postponed evaluation)
    for f in dataclasses.fields(RunConfig):
        if f.metadata.get("free"):
            keys.append(f.name)
        elif dataclasses.is_dataclass(group := types[f.name]):
            keys += [f"{f.name}.{g.name}" for g in dataclasses.fields(group) if g.metadata.get("free")]
    return tuple(keys)


FREE = free_keys()


def differences(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{dotted key: (old, new)} of every key that differs, the free ones left out. A key the old config lacks whose
    new value is off (null or empty: a switch added since, such as trainer.save_batches) is no difference: new
    settings default to what runs did before them, so a run made before one was added is still that setting. A
    whole group the old config lacks (`_added_groups`) is read as its defaults, for the same reason."""
    a, b = _flat({**_added_groups(old, new), **old}), _flat(new)
    keys = sorted(set(a) | set(b))
    return {
        k: (a.get(k), b.get(k))
        for k in keys
        if _norm(a.get(k)) != _norm(b.get(k))
        and not any(k == f or k.startswith(f"{f}.") for f in FREE)
        and not (k not in a and _norm(b[k]) in (None, [], {}))
    }


def _added_groups(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The defaults of each group added since runs began recording their config, for a record made before it."""
    from harness.objectives.correction import CorrectionConfig  # the correction axis: none by default

    added = {"correction": CorrectionConfig}
    return {g: dataclasses.asdict(schema()) for g, schema in added.items() if g not in old and g in new}


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _norm(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value  # JSON has no tuples


def show(value: Any) -> str:
    return json.dumps(_norm(value), default=str)
