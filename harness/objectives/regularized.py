"""Regularised objectives: SPO, DRPO and the DRPO paper's ablations (objectives.md §2.4-2.5).

    objective = min(r, C) * A  -  s(A) * penalty(pi, a)        (a = the anchor's prob, mu by default)

with the ratio and the penalty differentiable (no mask, no detach), s(A) = |A| * scale. Gradient per token:
c = A * min(r, C) - s(A) * d penalty / d log pi, written as c = A * r * w; the metrics report w.

    spo             penalty (x - 1)^2 / (2 eps),       x = pi / a             SPO, arXiv 2401.16025
    drpo            penalty a * (x - 1)^2 / (2 delta) = (pi - a)^2 / (2 a delta)
                    => w = 1 - sign(A) (pi - mu) / delta: damped moving away, amplified moving back
    drpo_mask       the DRPO penalty only where the DPPO-TV mask would fire (|pi - a| > mask_delta, harmful side)
    drpo_no_absadv  |A| replaced by 1 on tokens with a learning signal (A != 0): the boundary no longer scales with A

The DRPO family follows the released code (UniRL `_drpo_loss`) at the log-ratio clamp too: its ratio is
exp(clamp(log pi - log mu, -20, 20)) and differentiable, so a token whose log-ratio lies beyond +-20 gets zero
gradient (not A * min(r, C) as the other families' detached weights give).
    penalty_tv/kl/k3  beta * single-sample TV |pi - a|, KL k1 -log x, KL k3 (x - 1) - log x
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from harness.objectives.base import ObjectiveConfig
from harness.objectives.common import (
    LOG_RATIO_CLAMP,
    Batch,
    ObjectiveOutput,
    prepare,
    trust_region_metrics,
)


@dataclass(frozen=True)
class SPOConfig(ObjectiveConfig):
    eps: float = field(
        default=0.2, metadata={"gt": 0, "help": "ratio deviation at the optimum r = 1 +- eps (0.2 SPO; 12.5 DRPO §4)"}
    )


@dataclass(frozen=True)
class DRPOConfig(ObjectiveConfig):
    delta: float = field(
        default=0.15,
        metadata={
            "gt": 0,
            "help": "|pi - mu| at which w reaches 0 (Binary-TV geometry; the released code's 12.5 is never reached)",
        },
    )
    mask_delta: float | None = field(
        default=None,
        metadata={
            "gt": 0,
            "help": "drpo_mask: penalise only where DPPO-TV with this delta would mask; null = everywhere",
        },
    )
    abs_adv: bool = field(default=True, metadata={"help": "scale the penalty by |A| (false: the 'w/o |A|' ablation)"})


@dataclass(frozen=True)
class PenaltyConfig(ObjectiveConfig):
    penalty: Literal["tv", "kl", "k3"] = field(default="tv", metadata={"help": "single-sample divergence estimator"})
    beta: float = field(default=1.0, metadata={"gt": 0, "help": "penalty coefficient"})


def _anchored(b: Batch, anchor: str) -> tuple[Tensor, Tensor, Tensor]:
    """(log x differentiable, x detached, a) with x = pi / a."""
    la = b.anchor_logp(anchor)
    log_x = (b.logp - la).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return log_x, torch.exp(log_x.detach()), torch.exp(la)


def _regularized(
    b: Batch, cfg: ObjectiveConfig, penalty: Tensor, dpenalty: Tensor, scale: Tensor, *, zero_beyond_clamp: bool = False
) -> ObjectiveOutput:
    """`penalty` differentiable; `dpenalty` its detached derivative w.r.t. log pi (for the reported weight w).

    `zero_beyond_clamp` (the DRPO family): the surrogate's gradient flows through the clamped log-ratio, as in
    the released DRPO code, so a token with |log pi - log mu| > 20 gets no gradient from it; `penalty` must then
    be built on the clamped log-ratio too (`_anchored`), so the whole token's gradient is 0 there.
    """
    a = b.advantages
    r_capped = torch.clamp(b.ratio(), max=cfg.is_cap)
    carrier = b.grad_carrier()  # value 1, gradient grad(log pi)
    inside = (b.logp.detach() - b.ratio_logp).abs() <= LOG_RATIO_CLAMP  # torch.clamp passes gradient at the bound
    if zero_beyond_clamp:
        carrier = torch.where(inside, carrier, torch.ones((), dtype=carrier.dtype, device=carrier.device))
    surrogate = r_capped * a * carrier  # value min(r, C) * A, gradient min(r, C) * A * grad(log pi) (0 past clamp)
    loss = -(surrogate - scale * penalty)
    loss = torch.where(b.mask, loss, torch.zeros((), device=loss.device))
    with torch.no_grad():
        coef = r_capped * a - scale * dpenalty
        if zero_beyond_clamp:
            coef = torch.where(inside, coef, torch.zeros((), dtype=coef.dtype, device=coef.device))
        denom = a * b.ratio()
        weight = torch.where(denom != 0, coef / torch.where(denom != 0, denom, 1.0), 1.0)
    metrics = trust_region_metrics(b, torch.zeros_like(b.mask), is_cap=cfg.is_cap, weight=weight)
    return ObjectiveOutput(loss, metrics)


def spo(*, cfg: SPOConfig, **tensors: Tensor | None) -> ObjectiveOutput:
    b = prepare(cfg.name, **tensors, needs_old=cfg.needs_old, needs_topk=False)
    log_x, x, _ = _anchored(b, cfg.anchor)
    penalty = torch.expm1(log_x) ** 2 / (2 * cfg.eps)
    dpenalty = (x - 1) * x / cfg.eps
    return _regularized(b, cfg, penalty, dpenalty, b.advantages.abs())


def drpo(*, cfg: DRPOConfig, **tensors: Tensor | None) -> ObjectiveOutput:
    b = prepare(cfg.name, **tensors, needs_old=cfg.needs_old, needs_topk=False)
    log_x, x, anchor_p = _anchored(b, cfg.anchor)
    # a * (x - 1)^2 = (pi - a)^2 / a, written with x so the gradient flows through the clamped log-ratio.
    penalty = anchor_p * torch.expm1(log_x) ** 2 / (2 * cfg.delta)
    dpenalty = anchor_p * (x - 1) * x / cfg.delta
    a = b.advantages
    scale = a.abs() if cfg.abs_adv else (a != 0).float()
    fired = None
    if cfg.mask_delta is not None:
        diff = torch.exp(b.logp.detach()) - anchor_p
        fired = ((a > 0) & (diff > cfg.mask_delta)) | ((a <= 0) & (diff < -cfg.mask_delta))
        scale = scale * fired.float()
    out = _regularized(b, cfg, penalty, dpenalty, scale, zero_beyond_clamp=True)
    if fired is not None:
        out.metrics["objective/penalized_frac"] = ((fired & b.mask).sum() / b.mask.sum().clamp(min=1)).float()
    return out


def penalty(*, cfg: PenaltyConfig, **tensors: Tensor | None) -> ObjectiveOutput:
    b = prepare(cfg.name, **tensors, needs_old=cfg.needs_old, needs_topk=False)
    log_x, x, anchor_p = _anchored(b, cfg.anchor)
    if cfg.penalty == "tv":
        p = torch.exp(b.logp)
        value, deriv = (p - anchor_p).abs(), torch.sign(x - 1) * p.detach()
    elif cfg.penalty == "kl":
        value, deriv = -log_x, -torch.ones_like(x)
    else:
        value, deriv = torch.expm1(log_x) - log_x, x - 1
    return _regularized(b, cfg, cfg.beta * value, cfg.beta * deriv, b.advantages.abs())
