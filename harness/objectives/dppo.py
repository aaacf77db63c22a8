"""DPPO: PG-IS with a detached, directional divergence mask (P-DPPO §4.3, Eq. 11-16; Stable-RL, verl dppo_tv/kl).

    M = 0  if A > 0  and pi > mu and D > delta_high    (pushing an up-moved token further up)
    M = 0  if A <= 0 and pi < mu and D > delta_low     (pushing a down-moved token further down; A = 0 goes here)
    M = 1  otherwise — corrective moves are never dropped, and the boundary itself is kept (strict >).

D is Binary-TV |pi - mu|, Binary-KL KL(mu||pi), or their Top-K versions. The direction always comes from the
sampled token. `mask_neg` (P-DPPO §5.3) is Binary-TV with delta_high = inf: only the A < 0 side is guarded.

CPPO ("Beyond Uniform Token-Level Trust Region", arXiv 2606.10968; objectives.md §2.9) keeps the Binary-TV
surrogate and replaces the uniform delta by a position-weighted threshold with a cumulative prefix budget, per
response. Source: Tencent-Hunyuan/UniRL 73dc8be6 (PR #58), unirl/algorithms/cppo.py::_cppo_mask, _cppo_loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from harness import divergence
from harness.objectives.base import ObjectiveConfig
from harness.objectives.common import (
    LOG_RATIO_CLAMP,
    Batch,
    NonFiniteInputError,
    ObjectiveOutput,
    masked_mean,
    masked_pg,
    pg_loss,
    prepare,
    trust_region_metrics,
)

CPPO_BUDGET_QUANTILE = 0.9  # delta_b_seq = clamp(P90(D), delta_b, 2 delta_b), linear interpolation (UniRL, Eq. 22)


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


@dataclass(frozen=True)
class CPPOConfig(ObjectiveConfig):
    delta: float = field(
        default=0.2, metadata={"gt": 0, "help": "threshold on w_t |pi - mu| before the budget tightens it (cppo_delta)"}
    )
    w_min: float = field(
        default=0.8,
        metadata={"gt": 0, "le": 1, "help": "position weight of a response's last token, 1 at its first (cppo_w_min)"},
    )
    delta_b: float = field(
        default=0.02,
        metadata={"ge": 0, "help": "prefix budget per unit weight: clamp(P90 of D, delta_b, 2 delta_b) (cppo_delta_b)"},
    )


def _response_span(
    name: str, b: Batch, tensors: dict[str, Tensor | None], anchor: str
) -> tuple[Tensor, Tensor, Tensor]:
    """(inside [B, T] bool, log pi, log anchor) over each response: its positions up to its last unmasked token.

    A mask-0 position inside a response is a loss-masked token (tool output): it trains nothing but has a
    position and spends the budget with its own |pi - mu|, as in UniRL's packed rows. Its log-probs are read
    from the raw inputs and must be finite there; positions past a response's end are padding and never read.
    """
    m = b.mask
    inside = m.flip(-1).cumsum(-1).flip(-1) > 0  # an unmasked token at or after the position
    loss_masked = inside & ~m
    key = "old_logp" if anchor == "old" else "behavior_logp"
    names, out, counts = ("logp", key), [], []
    for raw_name, clean in zip(names, (b.logp.detach(), b.anchor_logp(anchor)), strict=True):
        raw = tensors[raw_name].detach().to(clean.dtype)
        counts.append((~torch.isfinite(raw) & loss_masked).sum())
        out.append(torch.where(loss_masked, raw, clean))
    bad = {n: c for n, c in zip(names, torch.stack(counts).tolist(), strict=True) if c}  # one host sync
    if bad:
        raise NonFiniteInputError(name, bad)
    return inside, out[0], out[1]


def cppo_mask(b: Batch, cfg: CPPOConfig, tensors: dict[str, Tensor | None]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dropped, c, D, budget): the tokens CPPO removes, their threshold c_t and divergence D_t ([B, T]), and each
    response's budget per unit weight ([B, 1]).

    Per response of length T (loss-masked tokens included, padding excluded), t = 1..T:
        D_t = |pi_t - mu_t|;  w_t = 1 - (1 - w_min)(t - 1)/max(T - 1, 1);  Z_t = w_t D_t
        S_{t-1} = sum_{j<t} Z_j,  W_{t-1} = sum_{j<t} w_j  (both 0 at t = 1)
        budget = clamp(P90(D_1..D_T), delta_b, 2 delta_b)  (torch.quantile's linear interpolation)
        c_t = min(delta, delta + budget W_{t-1} - S_{t-1});  keep_t = [A_t (r_t - 1) <= 0] or [Z_t <= c_t]
    Every earlier token spends the budget: kept ones, masked ones and loss-masked ones alike; c_t may go negative.
    A = 0 and r = 1 tokens are always kept (unlike DPPO, which routes A = 0 through its negative rule).
    Computed in the inputs' precision (>= fp32; UniRL: fp32).
    """
    with torch.no_grad():
        inside, lp, la = _response_span(cfg.name, b, tensors, cfg.anchor)
        zero = torch.zeros((), dtype=lp.dtype, device=lp.device)
        d = torch.where(inside, (torch.exp(lp) - torch.exp(la)).abs(), zero)
        n = inside.sum(-1, keepdim=True)
        pos = torch.arange(lp.shape[-1], device=lp.device, dtype=lp.dtype)
        w = torch.where(inside, 1.0 - (1.0 - cfg.w_min) * pos / (n - 1).clamp(min=1).to(lp.dtype), zero)
        z = w * d
        first = torch.zeros_like(z[:, :1])
        s_prev = torch.cat([first, z.cumsum(-1)[:, :-1]], -1)
        w_prev = torch.cat([first, w.cumsum(-1)[:, :-1]], -1)
        budget = _quantile(d, inside, n, CPPO_BUDGET_QUANTILE).clamp(min=cfg.delta_b, max=2.0 * cfg.delta_b)
        c = torch.minimum(torch.full_like(z, cfg.delta), cfg.delta + budget * w_prev - s_prev)
        r_anchor = torch.exp(b.log_ratio(cfg.anchor))
        toward = (b.advantages * (r_anchor - 1.0)) <= 0
        dropped = ~(toward | (z <= c)) & b.mask
        return dropped, c, d, budget


def _quantile(x: Tensor, inside: Tensor, n: Tensor, q: float) -> Tensor:
    """Per row, torch.quantile(x[row, inside], q) (linear interpolation) as [B, 1]; 0 for an empty row."""
    if x.shape[-1] == 0:
        return x.new_zeros((x.shape[0], 1))
    ordered = torch.where(inside, x, torch.full_like(x, float("inf"))).sort(-1).values
    rank = torch.tensor(q, dtype=x.dtype, device=x.device) * (n - 1).clamp(min=0).to(x.dtype)
    below = rank.long()
    above = rank.ceil().long()
    lo, hi = ordered.gather(-1, below), ordered.gather(-1, above)
    out = torch.lerp(lo, hi, rank - below.to(x.dtype))
    return torch.where(n > 0, out, torch.zeros((), dtype=x.dtype, device=x.device))


def cppo(*, cfg: CPPOConfig, **tensors: Tensor | None) -> ObjectiveOutput:
    """c = A * min(r, C) * keep, keep the position-weighted prefix-budget mask above; r = exp(clamp(log pi - log mu,
    -20, 20)) is differentiable in UniRL, so a token past the clamp gets no gradient."""
    b = prepare(cfg.name, **tensors, needs_old=cfg.needs_old, needs_topk=False)
    dropped, c, d, budget = cppo_mask(b, cfg, tensors)
    a = b.advantages
    coef = torch.where(dropped, torch.zeros((), dtype=a.dtype, device=a.device), a * b.ratio().clamp(max=cfg.is_cap))
    flows = (b.logp.detach() - b.ratio_logp).abs() <= LOG_RATIO_CLAMP
    metrics = trust_region_metrics(b, dropped, is_cap=cfg.is_cap)
    with torch.no_grad():
        m = b.mask
        metrics["objective/budget_masked_frac"] = masked_mean(dropped.float(), m)  # A = 0 tokens counted too
        metrics["objective/negative_threshold_frac"] = masked_mean((c < 0).float(), m)
        metrics["objective/divergence_mean"] = masked_mean(d, m)
        metrics["objective/prefix_budget_mean"] = masked_mean(budget[:, 0], m.any(-1))  # over responses
    return ObjectiveOutput(pg_loss(b, coef, flows), {k: v.detach() for k, v in metrics.items()})
