"""Which of an objective's values a framework's clip settings set: one map for the verl and the TRL adapter, so that
both read their framework's keys the same way (docs/integrations.md lists them).

A bound is one of four sides: "low" and "high" (the two radii of a two-sided trust region), "one" (a single
radius), "cap" (the importance-weight truncation C, `is_cap`). The adapters name the keys of each side:
    verl  low: clip_ratio_low, high: clip_ratio_high (each null -> clip_ratio), one: clip_ratio, cap: clip_ratio_c
          (DPPO's only, as verl's dppo_tv reads it; verl's vanilla reads it as a dual clip, which is not a cap)
    TRL   low: epsilon, high: epsilon_high (None -> epsilon), one: epsilon, cap: delta (every objective; TRL clamps
          the ratio of every token at delta), None: the objective's own cap stays
"""

from __future__ import annotations

import math

from harness.objectives import Objective

# objective family -> {objective field: side}. Families absent here (pg, penalty) have no such bound.
SIDES: dict[str, dict[str, str]] = {
    "dppo": {"delta_low": "low", "delta_high": "high", "is_cap": "cap"},
    "clip": {"eps_low": "low", "eps_high": "high"},
    "clip_relax": {"eps_low": "low", "eps_high": "high"},
    "cispo": {"eps_low": "low", "eps_high": "high"},
    "gspo": {"eps_low": "low", "eps_high": "high"},
    "icepop": {"eps_low": "low", "eps_high": "high"},
    "spo": {"eps": "one"},
    "drpo": {"delta": "one"},
    "cppo": {"delta": "one"},
}
# A None there means "delta" (DPPO's own fallback), not an open side.
FALLS_BACK = frozenset({"delta_low", "delta_high"})


def is_open(objective: Objective, field: str) -> bool:
    """A side the objective leaves open (None or inf: mask_neg's upper side, cispo_minimax's lower): being open is
    the objective itself, so no framework key sets it."""
    value = getattr(objective.cfg, field)
    return (value is None and field not in FALLS_BACK) or (isinstance(value, float) and math.isinf(value))


def bound_sides(objective: Objective, *, cap_everywhere: bool = False) -> dict[str, str]:
    """{objective field: side} of the bounds a framework's keys set for `objective`, open sides left out;
    `cap_everywhere`: `is_cap` is the "cap" side of every objective (TRL's delta), not only DPPO's."""
    sides = dict(SIDES.get(objective.cfg.family, {}))
    if cap_everywhere:
        sides["is_cap"] = "cap"
    return {name: side for name, side in sides.items() if not is_open(objective, name)}


def current(objective: Objective, field: str) -> float | None:
    """The value the objective uses for `field` (DPPO's delta_low/high fall back to delta)."""
    value = getattr(objective.cfg, field)
    if value is None and field in FALLS_BACK:
        return objective.cfg.delta  # DPPO family: its one radius
    return value
