"""Ratio-based objectives: PG-IS, PG-TIS, PPO/GRPO clip (and MiniRL, relaxed clipping), CISPO.

All are the shared surrogate `M * min(r, C) * A` (objectives.md §2.1-2.2) except CISPO, whose clipped ratio is
itself the detached weight. `r = pi/mu` is always rollout-anchored; the clip uses the config's anchor, so
MiniRL is "GRPO with anchor=old" (Stable-RL `ppo_recompute`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from harness.objectives.base import ObjectiveConfig
from harness.objectives.common import ObjectiveOutput, masked_pg, pg_loss, prepare, trust_region_metrics


@dataclass(frozen=True)
class PGConfig(ObjectiveConfig):
    """PG-IS (no trust region) and PG-TIS (`is_cap` = C), P-DPPO §5."""


@dataclass(frozen=True)
class ClipConfig(ObjectiveConfig):
    eps_low: float = field(default=0.2, metadata={"gt": 0, "help": "clip below at 1 - eps_low (A < 0 tokens)"})
    eps_high: float = field(
        default=0.28, metadata={"gt": 0, "help": "clip above at 1 + eps_high (A > 0); 0.28 = DAPO clip-higher"}
    )


@dataclass(frozen=True)
class RelaxConfig(ClipConfig):
    alpha: float = field(
        default=0.1, metadata={"ge": 0, "le": 1, "help": "tokens with mu < alpha are not clipped (P-DPPO §6)"}
    )
    sides: Literal["both", "high", "low"] = field(
        default="both", metadata={"help": "which clip bound is relaxed for low-probability tokens"}
    )


@dataclass(frozen=True)
class CispoConfig(ObjectiveConfig):
    eps_low: float | None = field(default=None, metadata={"gt": 0, "help": "lower clip 1 - eps_low; null = none"})
    eps_high: float = field(default=0.28, metadata={"gt": 0, "help": "upper clip of the detached weight"})


def pg(*, cfg: PGConfig, **tensors: Tensor | None) -> ObjectiveOutput:
    """c = A * min(r, C)."""
    b = prepare(cfg.name, **tensors, needs_old=False, needs_topk=False)
    keep = torch.ones_like(b.mask)
    return ObjectiveOutput(masked_pg(b, keep, cfg.is_cap), trust_region_metrics(b, ~keep, is_cap=cfg.is_cap))


def _clip_drops(b, cfg: ClipConfig) -> tuple[Tensor, Tensor]:
    """(drop_high, drop_low): the PPO-clip mask in gradient form (P-DPPO Eq. 9), strict inequalities."""
    r_anchor = torch.exp(b.log_ratio(cfg.anchor))
    a = b.advantages
    return (a > 0) & (r_anchor > 1 + cfg.eps_high), (a < 0) & (r_anchor < 1 - cfg.eps_low)


def clip(*, cfg: ClipConfig, **tensors: Tensor | None) -> ObjectiveOutput:
    """c = A * min(r, C) unless the anchored ratio left [1 - eps_low, 1 + eps_high] in A's direction, then 0."""
    b = prepare(cfg.name, **tensors, needs_old=cfg.needs_old, needs_topk=False)
    high, low = _clip_drops(b, cfg)
    dropped = high | low
    return ObjectiveOutput(masked_pg(b, ~dropped, cfg.is_cap), trust_region_metrics(b, dropped, is_cap=cfg.is_cap))


def clip_relax(*, cfg: RelaxConfig, **tensors: Tensor | None) -> ObjectiveOutput:
    """GRPO clip-higher, but tokens with mu < alpha escape the relaxed side(s) (Stable-RL `ppo_ablation_*`)."""
    b = prepare(cfg.name, **tensors, needs_old=cfg.needs_old, needs_topk=False)
    high, low = _clip_drops(b, cfg)
    low_prob = torch.exp(b.behavior_logp) < cfg.alpha
    if cfg.sides in ("both", "high"):
        high = high & ~low_prob
    if cfg.sides in ("both", "low"):
        low = low & ~low_prob
    dropped = high | low
    metrics = trust_region_metrics(b, dropped, is_cap=cfg.is_cap)
    with torch.no_grad():
        metrics["objective/relaxed_frac"] = ((low_prob & b.mask).sum() / b.mask.sum().clamp(min=1)).detach()
    return ObjectiveOutput(masked_pg(b, ~dropped, cfg.is_cap), metrics)


def cispo(*, cfg: CispoConfig, **tensors: Tensor | None) -> ObjectiveOutput:
    """c = A * sg(clip(r, 1 - eps_low, 1 + eps_high)): clipped tokens keep a bounded gradient (MiniMax-M1)."""
    b = prepare(cfg.name, **tensors, needs_old=cfg.needs_old, needs_topk=False)
    r_anchor = torch.exp(b.log_ratio(cfg.anchor))
    lo = 0.0 if cfg.eps_low is None else 1 - cfg.eps_low
    weight = torch.clamp(r_anchor, min=lo, max=1 + cfg.eps_high).clamp(max=cfg.is_cap)
    clipped = (r_anchor > 1 + cfg.eps_high) | (r_anchor < lo)
    return ObjectiveOutput(pg_loss(b, weight * b.advantages), trust_region_metrics(b, clipped, is_cap=cfg.is_cap))
