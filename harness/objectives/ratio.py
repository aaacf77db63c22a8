"""Ratio-based objectives: PG-IS, PG-TIS, PPO/GRPO clip (and MiniRL, relaxed clipping), CISPO, GSPO, IcePop.

All are the shared surrogate `M * min(r, C) * A` (objectives.md §2.1-2.2) except CISPO, whose clipped ratio is
itself the detached weight, and GSPO, whose weight is its sequence ratio. `r = pi/mu` is always rollout-anchored;
the clip uses the config's anchor, so MiniRL is "GRPO with anchor=old" (Stable-RL `ppo_recompute`).

    gspo    every token of a response takes the sequence's ratio s = exp(min(mean_t log(pi/anchor), 10)) and is
            clipped by it (PPO-clip on s), the gradient through its own log pi (objectives.md §2.7). Source: verl
            0.9.1 (PyPI), verl/trainer/ppo/core_algos.py::compute_policy_loss_gspo; verl 1dda039 agrees.
    icepop  MiniRL (the clip on pi/pi_old, the weight pi/mu) times IcePop's mask: a token counts only while
            mask_low <= k = pi_old/mu <= mask_high, both inclusive (objectives.md §2.8). Source: THUDM/slime
            624b824a, slime/backends/megatron_utils/loss.py::icepop_function on
            slime/utils/ppo_utils.py::compute_policy_loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from harness.objectives.base import ObjectiveConfig
from harness.objectives.common import (
    ObjectiveOutput,
    masked_max,
    masked_mean,
    masked_pg,
    pg_loss,
    prepare,
    trust_region_metrics,
)

# verl clamps GSPO's sequence log-ratio from above only (no lower clamp), "for numerical stability".
GSPO_LOG_RATIO_MAX = 10.0


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


@dataclass(frozen=True)
class GSPOConfig(ObjectiveConfig):
    eps_low: float = field(
        default=3e-4,
        metadata={"gt": 0, "help": "clip the sequence ratio s below at 1 - eps_low (A < 0; verl clip_ratio_low)"},
    )
    eps_high: float = field(
        default=4e-4, metadata={"gt": 0, "help": "clip s above at 1 + eps_high (A > 0; verl clip_ratio_high)"}
    )


@dataclass(frozen=True)
class IcePopConfig(ClipConfig):
    anchor: Literal["behavior", "old"] = field(
        default="old",
        metadata={"help": "'old' only: the clip is on pi/pi_old and the mask on k = pi_old/mu (both needed)"},
    )
    mask_low: float = field(
        default=0.5, metadata={"ge": 0, "help": "drop a token when k = pi_old/mu < mask_low (slime tis_clip_low)"}
    )
    mask_high: float = field(
        default=5.0, metadata={"gt": 0, "help": "drop a token when k = pi_old/mu > mask_high (slime tis_clip)"}
    )

    def __post_init__(self) -> None:
        if self.anchor != "old":
            raise ValueError(
                f"objective.anchor: {self.name or 'icepop'} supports only 'old' (k = pi_old/mu needs pi_old; on mu "
                f"alone k = 1 and it is PPO-clip on pi/mu), got {self.anchor!r}"
            )
        if not self.mask_low < self.mask_high:
            raise ValueError(
                f"objective.mask_low: must be < objective.mask_high ({self.mask_high!r}), got {self.mask_low!r}"
            )


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


def gspo(*, cfg: GSPOConfig, **tensors: Tensor | None) -> ObjectiveOutput:
    """c_t = A_t min(s, C) unless s left [1 - eps_low, 1 + eps_high] in A's direction, then 0 (a tie is kept).

    s is one number per response: exp(min(L, 10)) with L = sum_t log(pi/anchor) m / max(sum_t m, 1), so a fully
    masked row gets s = 1. Past the clamp (L > 10) the value stays and the gradient is 0, as in verl.
    """
    b = prepare(cfg.name, **tensors, needs_old=cfg.needs_old, needs_topk=False)
    m = b.mask
    with torch.no_grad():
        # Padding already holds 0 in both log-probs (prepare), so a NaN there cannot reach L as it would in verl.
        log_r = b.logp.detach() - b.anchor_logp(cfg.anchor)
        mean_log_r = (log_r * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)
        seq_s = torch.exp(mean_log_r.clamp(max=GSPO_LOG_RATIO_MAX))  # [B, 1]
        s = seq_s.expand_as(log_r)
        a = b.advantages
        clipped = ((a > 0) & (s > 1 + cfg.eps_high)) | ((a < 0) & (s < 1 - cfg.eps_low))
        weight = s.clamp(max=cfg.is_cap)
        coef = torch.where(clipped, torch.zeros((), dtype=a.dtype, device=a.device), a * weight)
    loss = pg_loss(b, coef, flows=mean_log_r <= GSPO_LOG_RATIO_MAX)
    metrics = trust_region_metrics(b, clipped & m, is_cap=cfg.is_cap)
    with torch.no_grad():
        rows = m.any(-1)
        signal_rows = (m & (a != 0)).any(-1)
        metrics["objective/is_capped_frac"] = masked_mean((s > cfg.is_cap).float(), m)  # the cap is on s here
        metrics["objective/seq_ratio_mean"] = masked_mean(seq_s[:, 0], rows)
        metrics["objective/seq_ratio_max"] = masked_max(seq_s[:, 0], rows)
        seq_clipped = (clipped & m).any(-1)
        metrics["objective/seq_clipped_frac"] = (seq_clipped & signal_rows).sum() / signal_rows.sum().clamp(min=1)
    return ObjectiveOutput(loss, {k: v.detach() for k, v in metrics.items()})


def icepop(*, cfg: IcePopConfig, **tensors: Tensor | None) -> ObjectiveOutput:
    """c = A min(r, C) unless the clip on pi/pi_old drops the token or k = pi_old/mu lies outside
    [mask_low, mask_high], then 0. slime's loss is w * PPO-clip(pi/pi_old) with w = k inside the bounds: its
    gradient w * A * pi/pi_old is A * pi/mu on a kept token."""
    b = prepare(cfg.name, **tensors, needs_old=True, needs_topk=False)
    with torch.no_grad():
        # k unclamped, as slime's: a k that overflows is above mask_high either way.
        k = torch.exp(b.old_logp - b.behavior_logp)
        outside = ~((k >= cfg.mask_low) & (k <= cfg.mask_high)) & b.mask
        high, low = _clip_drops(b, cfg)
        dropped = (high | low | outside) & b.mask
    metrics = trust_region_metrics(b, dropped, is_cap=cfg.is_cap)
    with torch.no_grad():
        metrics["objective/mismatch_masked_frac"] = masked_mean(outside.float(), b.mask)
        metrics["objective/mismatch_weight_mean"] = masked_mean(k, b.mask)
    return ObjectiveOutput(masked_pg(b, ~dropped, cfg.is_cap), metrics)
