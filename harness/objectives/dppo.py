"""DPPO: PG-IS with a detached, directional divergence mask (P-DPPO §4.3, Eq. 11-16; Stable-RL, verl dppo_tv/kl).

    M = 0  if A > 0  and pi > mu and D > delta_high    (pushing an up-moved token further up)
    M = 0  if A <= 0 and pi < mu and D > delta_low     (pushing a down-moved token further down; A = 0 goes here)
    M = 1  otherwise — corrective moves are never dropped, and the boundary itself is kept (strict >).

D is Binary-TV |pi - mu|, Binary-KL KL(mu||pi), or their Top-K versions. The direction always comes from the
sampled token. `mask_neg` (P-DPPO §5.3) is Binary-TV with delta_high = inf: only the A < 0 side is guarded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from harness import divergence
from harness.objectives.base import ObjectiveConfig
from harness.objectives.common import Batch, ObjectiveOutput, masked_pg, prepare, trust_region_metrics


@dataclass(frozen=True)
class DPPOConfig(ObjectiveConfig):
    divergence: Literal["binary_tv", "binary_kl", "topk_tv", "topk_kl"] = field(
        default="binary_tv", metadata={"help": "D in the mask: Binary or Top-K, TV or KL(mu||pi)"}
    )
    delta: float = field(
        default=0.15, metadata={"gt": 0, "help": "trust-region threshold (0.15 for TV, 0.05 for KL in the paper)"}
    )
    delta_low: float | None = field(
        default=None, metadata={"gt": 0, "help": "threshold for A <= 0 tokens; null = delta"}
    )
    delta_high: float | None = field(
        default=None,
        metadata={"gt": 0, "inf": True, "help": "threshold for A > 0 tokens; null = delta; .inf = never mask"},
    )

    def __post_init__(self) -> None:
        if self.divergence.startswith("topk") and self.anchor == "old":
            raise ValueError(
                f"objective.anchor: a Top-K objective ({self.name or self.divergence}) supports only 'behavior' "
                "(the trainer has no top-K log-probs of pi_old)"
            )

    @property
    def needs_topk(self) -> bool:
        return self.divergence.startswith("topk")

    @property
    def thresholds(self) -> tuple[float, float]:
        low = self.delta if self.delta_low is None else self.delta_low
        high = self.delta if self.delta_high is None else self.delta_high
        return low, high


def dppo_divergence(b: Batch, cfg: DPPOConfig) -> Tensor:
    anchor = b.anchor_logp(cfg.anchor)
    if cfg.divergence == "binary_tv":
        return divergence.binary_tv(b.logp.detach(), anchor)
    if cfg.divergence == "binary_kl":
        return divergence.binary_kl(b.logp.detach(), anchor)
    if cfg.divergence == "topk_tv":
        return divergence.topk_tv(b.topk_logp.detach(), b.topk_behavior_logp)
    return divergence.topk_kl(b.topk_logp.detach(), b.topk_behavior_logp)


def dppo_mask(b: Batch, cfg: DPPOConfig) -> tuple[Tensor, Tensor]:
    """(dropped [B, T] bool, D [B, T] float64): the tokens DPPO removes from the gradient, and the divergence."""
    with torch.no_grad():
        d = dppo_divergence(b, cfg)
        low, high = cfg.thresholds
        lp, lq = b.logp.detach(), b.anchor_logp(cfg.anchor)
        a = b.advantages
        up = (a > 0) & (lp > lq) & (d > high)  # a threshold of inf never fires
        down = (a <= 0) & (lp < lq) & (d > low)
        return (up | down) & b.mask, d


def dppo(*, cfg: DPPOConfig, **tensors: Tensor | None) -> ObjectiveOutput:
    """c = A * min(r, C) * M, M the directional divergence mask above."""
    b = prepare(cfg.name, **tensors, needs_old=cfg.needs_old, needs_topk=cfg.needs_topk)
    dropped, d = dppo_mask(b, cfg)
    metrics = trust_region_metrics(b, dropped, is_cap=cfg.is_cap)
    with torch.no_grad():
        metrics["objective/divergence_mean"] = (torch.where(b.mask, d, 0).sum() / b.mask.sum().clamp(min=1)).float()
    return ObjectiveOutput(masked_pg(b, ~dropped, cfg.is_cap), metrics)
