"""What every objective shares: the input contract, the shared surrogate, and the trust-region metrics.

Tensor contract (DESIGN.md): `logp`, `behavior_logp`, `advantages`, `mask`, `old_logp` are [B, T];
`topk_logp`, `topk_behavior_logp` are [B, T, K]. All objectives return a per-token loss to MINIMISE.

Loss values follow one form for every objective (objectives.md §1 form (i)): `loss_mat = -(surrogate value)`,
where a masked policy-gradient method's value is `M * min(r, C) * A` and a regularised one's is its objective
(e.g. DRPO `r*A - |A|/(2 delta) * mu * (r-1)^2`). Loss curves of different objectives are therefore on the same
scale, and the gradient is exactly the spec's `c * grad(log pi)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

ANCHORS = ("behavior", "old")
# log-ratios are clamped before exp so a token whose probability collapsed cannot overflow (objectives.md P6).
LOG_RATIO_CLAMP = 20.0


class NonFiniteInputError(ValueError):
    """NaN/inf in inputs where the mask is on; `counts`: each such input's name and its number of tokens."""

    def __init__(self, objective: str, counts: dict[str, int]) -> None:
        where = ", ".join(f"{name}: {count}" for name, count in counts.items())
        super().__init__(f"{objective}: non-finite values in unmasked (response) positions ({where} tokens)")
        self.counts = counts


@dataclass(frozen=True)
class ObjectiveOutput:
    loss_mat: Tensor  # [B, T], 0 where mask == 0, differentiable w.r.t. logp
    metrics: dict[str, Tensor]  # "objective/<name>" -> 0-dim detached tensor


@dataclass(frozen=True)
class Batch:
    """Validated, >= fp32, padding-sanitised inputs. Padding positions hold 0 so NaN/inf there never propagate."""

    logp: Tensor  # differentiable
    behavior_logp: Tensor
    advantages: Tensor
    mask: Tensor  # bool
    old_logp: Tensor | None
    topk_logp: Tensor | None
    topk_behavior_logp: Tensor | None
    # What the importance ratio is taken against when it is not mu: a rollout correction's stand-in
    # (harness.objectives.correction): pi_old in decoupled mode, sg(log pi) in bypass REINFORCE.
    is_logp: Tensor | None = None

    def anchor_logp(self, anchor: str) -> Tensor:
        """The trust region's reference: the rollout engine's mu, or the trainer's recompute (ablations)."""
        out = self.old_logp if anchor == "old" else self.behavior_logp
        assert out is not None  # prepare() guarantees old_logp when anchor == "old"
        return out

    @property
    def ratio_logp(self) -> Tensor:
        """The importance ratio's reference: mu (SRL; DPPO Takeaway 2), or a rollout correction's `is_logp`."""
        return self.behavior_logp if self.is_logp is None else self.is_logp

    def log_ratio(self, anchor: str | None = None) -> Tensor:
        """log(pi/anchor), detached; anchor None: the importance ratio's reference (`ratio_logp`). The importance
        ratio is rollout-anchored (SRL; DPPO Takeaway 2) unless a rollout correction owns the pi_old/mu part of
        it: only a trust region's own test reads the config's anchor."""
        ref = self.ratio_logp if anchor is None else self.anchor_logp(anchor)
        return (self.logp.detach() - ref).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)

    def ratio(self) -> Tensor:
        return torch.exp(self.log_ratio())

    def grad_carrier(self) -> Tensor:
        """Value 1, gradient grad(log pi): `coef * carrier` has value coef and gradient coef * grad(log pi)."""
        return torch.exp(self.logp - self.logp.detach())


def _check_shape(name: str, t: Tensor | None, shape: torch.Size, ref: str) -> None:
    if t is not None and t.shape != shape:
        raise ValueError(f"{name} has shape {tuple(t.shape)} but {ref} has shape {tuple(shape)}; they must match")


def prepare(
    objective: str,
    logp: Tensor,
    behavior_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    old_logp: Tensor | None = None,
    topk_logp: Tensor | None = None,
    topk_behavior_logp: Tensor | None = None,
    is_logp: Tensor | None = None,
    *,
    needs_old: bool,
    needs_topk: bool,
) -> Batch:
    """Check shapes and finiteness, upcast to fp32 and zero the padding with `where` (not multiplication)."""
    _check_shapes(
        objective,
        logp,
        behavior_logp,
        advantages,
        mask,
        old_logp,
        topk_logp,
        topk_behavior_logp,
        is_logp,
        needs_old=needs_old,
        needs_topk=needs_topk,
    )
    m = mask > 0
    _check_finite(
        objective,
        m,
        logp,
        behavior_logp,
        advantages,
        old_logp,
        is_logp,
        (topk_logp, topk_behavior_logp) if needs_topk else None,
    )

    # At least fp32 (bf16 log-probs would blur the trust region); fp64 inputs stay fp64.
    dtype = torch.promote_types(logp.dtype, torch.float32)
    zero = torch.zeros((), dtype=dtype, device=logp.device)

    def clean(t: Tensor | None) -> Tensor | None:
        return None if t is None else torch.where(m, t.to(dtype), zero)

    def clean_k(t: Tensor | None) -> Tensor | None:
        # -inf is a legal log-prob for a top-K entry (probability 0); only padding is replaced.
        return None if t is None else torch.where(m.unsqueeze(-1), t.to(dtype), zero)

    return Batch(
        logp=clean(logp), behavior_logp=clean(behavior_logp), advantages=clean(advantages), mask=m,
        old_logp=clean(old_logp), is_logp=clean(None if is_logp is None else is_logp.detach()),
        topk_logp=clean_k(topk_logp) if needs_topk else None,
        topk_behavior_logp=clean_k(topk_behavior_logp) if needs_topk else None,
    )  # fmt: skip


def _check_shapes(
    objective: str,
    logp: Tensor,
    behavior_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    old_logp: Tensor | None,
    topk_logp: Tensor | None,
    topk_behavior_logp: Tensor | None,
    is_logp: Tensor | None,
    *,
    needs_old: bool,
    needs_topk: bool,
) -> None:
    if logp.dim() != 2:
        raise ValueError(f"logp must be [B, T], got shape {tuple(logp.shape)}")
    shape = logp.shape
    for name, t in (("behavior_logp", behavior_logp), ("advantages", advantages), ("mask", mask)):
        if t is None:
            raise ValueError(f"{objective}: {name} is required")
        _check_shape(name, t, shape, "logp")
    _check_shape("old_logp", old_logp, shape, "logp")
    _check_shape("is_logp", is_logp, shape, "logp")
    if needs_old and old_logp is None:
        raise ValueError(f"{objective}: anchor=old needs old_logp (the trainer's recompute before the update)")
    if needs_topk:
        if topk_logp is None or topk_behavior_logp is None:
            raise ValueError(f"{objective}: a Top-K objective needs topk_logp and topk_behavior_logp [B, T, K]")
        if topk_logp.dim() != 3 or topk_logp.shape[:2] != shape:
            raise ValueError(
                f"topk_logp has shape {tuple(topk_logp.shape)}; expected [B, T, K] with [B, T] = {tuple(shape)}"
            )
        _check_shape("topk_behavior_logp", topk_behavior_logp, topk_logp.shape, "topk_logp")


def _check_finite(
    objective: str,
    m: Tensor,
    logp: Tensor,
    behavior_logp: Tensor,
    advantages: Tensor,
    old_logp: Tensor | None,
    is_logp: Tensor | None,
    topk: tuple[Tensor | None, Tensor | None] | None,
) -> None:
    # One host sync for all inputs: NaN/inf where the mask is on must not be trained on. This is the training
    # loop's check too: it skips the update when the NaN came from the model (harness.loop.step).
    checks = [("logp", logp.detach()), ("behavior_logp", behavior_logp), ("advantages", advantages)]
    if old_logp is not None:
        checks.append(("old_logp", old_logp))
    if is_logp is not None:
        checks.append(("is_logp", is_logp.detach()))
    counts = torch.stack([(~torch.isfinite(t) & m).sum() for _, t in checks])
    if topk is not None:
        topk_logp, topk_behavior_logp = topk
        mk = m.unsqueeze(-1)
        counts = torch.cat(
            [counts, torch.stack([(torch.isnan(t) & mk).sum() for t in (topk_logp, topk_behavior_logp)])]
        )
        checks += [("topk_logp", topk_logp), ("topk_behavior_logp", topk_behavior_logp)]
    bad = {name: c for (name, _), c in zip(checks, counts.tolist(), strict=True) if c}
    if bad:
        raise NonFiniteInputError(objective, bad)


def masked_mean(x: Tensor, m: Tensor) -> Tensor:
    x = torch.where(m, x.float(), torch.zeros((), device=x.device))
    return x.sum() / m.sum().clamp(min=1)


def masked_max(x: Tensor, m: Tensor) -> Tensor:
    if x.numel() == 0:
        return torch.zeros((), device=x.device)
    lowest = torch.tensor(float("-inf"), device=x.device)
    out = torch.where(m, x.float(), lowest).max()
    return torch.where(m.any(), out, torch.zeros((), device=x.device))


def trust_region_metrics(
    b: Batch, dropped: Tensor, *, is_cap: float, weight: Tensor | None = None
) -> dict[str, Tensor]:
    """Metrics every objective reports (objectives.md §4; names defined here to avoid P4's collisions).

    `dropped` marks tokens whose gradient the trust region removed or clipped. The masked fractions are over
    tokens with A != 0 (SRL's denominator), split by the sign of A so the two directions can be told apart.
    `weight` (SPO/DRPO family) is w in c = A * r * w; it adds the fraction of corrective (w < 0) and amplified
    (w > 1) tokens.
    """
    with torch.no_grad():
        m = b.mask
        a = b.advantages
        signal = m & (a != 0)
        n_signal = signal.sum().clamp(min=1)
        log_r = b.log_ratio()
        r = torch.exp(log_r)
        log_r_mu = log_r if b.is_logp is None else b.log_ratio("behavior")
        k3 = torch.expm1(log_r_mu) - log_r_mu  # unbiased, non-negative estimator of KL(mu || pi) from samples of mu
        out = {
            "objective/masked_frac_pos": (dropped & signal & (a > 0)).sum() / n_signal,
            "objective/masked_frac_neg": (dropped & signal & (a < 0)).sum() / n_signal,
            "objective/ratio_mean": masked_mean(r, m),
            "objective/ratio_max": masked_max(r, m),
            "objective/is_capped_frac": masked_mean((r > is_cap).float(), m),
            "objective/approx_kl_k3": masked_mean(k3, m),
        }
        out["objective/masked_frac"] = out["objective/masked_frac_pos"] + out["objective/masked_frac_neg"]
        if weight is not None:
            out["objective/neg_weight_frac"] = (signal & (weight < 0)).sum() / n_signal
            out["objective/weight_gt1_frac"] = (signal & (weight > 1)).sum() / n_signal
            out["objective/weight_mean"] = masked_mean(weight, signal)
    return {k: v.detach() for k, v in out.items()}


def pg_loss(b: Batch, coef: Tensor, flows: Tensor | None = None) -> Tensor:
    """Per-token loss with value `-coef` and gradient `-coef * grad(log pi)`; `coef` is detached, padding is 0.

    `flows` (bool, [B, T] or broadcastable): where the gradient flows. Elsewhere the value stays `-coef` with no
    gradient: a reference that differentiates through a clamped log-ratio gives a token past the clamp none (CPPO's
    +-20 as UniRL's, GSPO's +10 as verl's; torch.clamp passes the gradient at the bound itself).
    """
    carrier = b.grad_carrier()
    if flows is not None:
        carrier = torch.where(flows, carrier, torch.ones((), dtype=carrier.dtype, device=carrier.device))
    loss = -(coef.detach() * carrier)
    return torch.where(b.mask, loss, torch.zeros((), device=loss.device))


def masked_pg(b: Batch, keep: Tensor, is_cap: float) -> Tensor:
    """The shared surrogate of every "PG-IS + mask" method (Stable-RL's core abstraction).

    Per token: value `keep * min(r, C) * A`, gradient `keep * min(r, C) * A * grad(log pi)`, `keep` detached.
    """
    return pg_loss(b, keep.float() * torch.clamp(b.ratio(), max=is_cap) * b.advantages)
