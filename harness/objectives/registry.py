"""Objective registry: name (= presets/<name>.yaml stem) -> pure function + validated config.

A preset is data: its YAML names the family (the function and its config schema) and the values. Adding an
objective touches three files: a family module (or a new preset of an existing one), the YAML, and a test.
The presets ship inside the package (package data), so an installed wheel has them all; in a checkout
`conf/objective` links to the same folder, so Hydra's `objective=<name>` group reads these very files.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from torch import Tensor

from harness.objectives import dppo, ratio, regularized
from harness.objectives.base import ObjectiveConfig
from harness.objectives.common import ObjectiveOutput
from harness.schema import build

PRESET_DIR = Path(__file__).resolve().parent / "presets"

FAMILIES: dict[str, tuple[Callable[..., ObjectiveOutput], type[ObjectiveConfig]]] = {
    "pg": (ratio.pg, ratio.PGConfig),
    "clip": (ratio.clip, ratio.ClipConfig),
    "clip_relax": (ratio.clip_relax, ratio.RelaxConfig),
    "cispo": (ratio.cispo, ratio.CispoConfig),
    "gspo": (ratio.gspo, ratio.GSPOConfig),
    "icepop": (ratio.icepop, ratio.IcePopConfig),
    "dppo": (dppo.dppo, dppo.DPPOConfig),
    "cppo": (dppo.cppo, dppo.CPPOConfig),
    "spo": (regularized.spo, regularized.SPOConfig),
    "drpo": (regularized.drpo, regularized.DRPOConfig),
    "penalty": (regularized.penalty, regularized.PenaltyConfig),
}


@cache
def _presets() -> dict[str, dict[str, Any]]:
    out = {}
    for path in sorted(PRESET_DIR.glob("*.yaml")):
        values = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
        if not isinstance(values, dict) or values.get("family") not in FAMILIES:
            raise ValueError(f"{path}: 'family' must be one of {', '.join(FAMILIES)}")
        values.pop("defaults", None)  # Hydra's link to the schema defaults; the schema itself holds those
        out[path.stem] = values
    if not out:  # an install without its package data would otherwise look like a registry with no objectives
        raise RuntimeError(f"{PRESET_DIR}: no objective presets (*.yaml); the package was installed without its data")
    return out


OBJECTIVE_NAMES: tuple[str, ...] = tuple(_presets())


@dataclass(frozen=True)
class Objective:
    """A registered objective bound to its config. Call it with keyword tensors; it never mutates anything."""

    name: str
    cfg: ObjectiveConfig
    fn: Callable[..., ObjectiveOutput]

    def __call__(self, **tensors: Tensor | None) -> ObjectiveOutput:
        """logp, behavior_logp, advantages, mask (required), old_logp, topk_logp, topk_behavior_logp (when the
        objective needs them), all [B, T] or [B, T, K]: `prepare` checks the names, shapes and values."""
        return self.fn(cfg=self.cfg, **tensors)

    @property
    def needs_old(self) -> bool:
        return self.cfg.needs_old

    @property
    def topk(self) -> int:
        return self.cfg.topk


def objective_config(name: str, overrides: Mapping[str, Any] | None = None) -> ObjectiveConfig:
    """The validated config of preset `name` with `overrides` applied (ValueError names the bad key)."""
    presets = _presets()
    if name not in presets:
        raise ValueError(f"unknown objective '{name}'; valid objectives: {', '.join(presets)}")
    values = {**presets[name], **dict(overrides or {})}
    if values.get("name", name) != name:
        raise ValueError(f"objective.name: '{values['name']}' does not match the preset '{name}'")
    if values["family"] != presets[name]["family"]:
        raise ValueError(f"objective.family: preset '{name}' is family '{presets[name]['family']}'")
    values["name"] = name
    _, schema = FAMILIES[values["family"]]
    return build(schema, values, where="objective")


def get_objective(name: str, **overrides: Any) -> Objective:
    """`get_objective("dppo", delta=0.2)`: the preset's YAML values, then keyword overrides, validated."""
    cfg = objective_config(name, overrides)
    return Objective(name=name, cfg=cfg, fn=FAMILIES[cfg.family][0])


def objective_from_config(values: Mapping[str, Any]) -> Objective:
    """From a composed Hydra `objective` group (it carries its own `name`)."""
    values = dict(values)
    if "name" not in values:
        raise ValueError(f"objective: missing 'name'; valid objectives: {', '.join(OBJECTIVE_NAMES)}")
    return get_objective(values.pop("name"), **values)
