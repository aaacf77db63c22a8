"""Rollout correction: an axis beside the objective, as verl composes it (docs/objectives.md §2.10).

Source: verl 0.9.1 (PyPI), verl/trainer/ppo/rollout_corr_helper.py::compute_rollout_correction_and_rejection_mask
and its helpers; the option names, threshold strings and named presets are verl's (RolloutCorrectionConfig).
SkyRL's off_policy_correction_utils.py is the cross-check; where the two differ this module follows verl.

With lambda = log pi_x - log mu per response token (pi_x = pi_old in decoupled mode, sg(pi) in bypass mode):

    IS weight    token:     w_t = exp(clamp(lambda_t, +-20))
                 sequence:  w   = exp(clamp(sum_t lambda_t m_t, +-20))  (token lambda NOT clamped before the sum)
      rollout_is_threshold  C       : w = min(raw, C)            (TIS; no lower truncation)
                            "lo_hi" : w = raw 1[lo <= raw <= hi]  (IcePop; inclusive bounds)
      rollout_is_batch_normalize     : w / masked mean of w (token: over tokens; sequence: over responses)
    rejection    ls = clamp(lambda, +-20);  k1 = -ls,  k2 = ls^2 / 2,  k3 = e^ls - 1 - ls  (per token)
                 token_kN (per token), seq_sum_kN, seq_mean_kN (sum / (n + 1e-8)), seq_max_k2/k3 (per response)
                 k1 keeps log(lower) <= stat <= log(upper): on -log(pi_x/mu), so "lower_upper" keeps pi_x/mu in
                 [1/upper, 1/lower] (verl; SkyRL bounds pi_x/mu itself); k2/k3 keep stat <= upper; options AND-ed.

The weight multiplies the per-token loss; a rejected token leaves the loss mask. A zeroed weight (IcePop) keeps
its token in the mask, so in every denominator. Everything here is detached and pure; the trainer
(harness.loop.step) decides where the denominators count rejected tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from harness.objectives.common import LOG_RATIO_CLAMP, masked_max, masked_mean

RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)
SEQ_MEAN_EPS = 1e-8  # verl_F.masked_mean's sum / (count + 1e-8)
NORM_MIN = 1e-8  # batch normalisation is skipped when the mean weight is not above this (verl)


def _number(text: str, key: str, spec: object) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{key}: {spec!r} is not a number or 'lower_upper' string (e.g. 2.0 or '0.5_5.0')") from None
    if math.isnan(value):
        raise ValueError(f"{key}: {spec!r} is not a number (nan)")
    return value


def parse_is_threshold(spec: float | str, key: str = "correction.rollout_is_threshold") -> tuple[float | None, float]:
    """verl's `_parse_rollout_is_threshold`: a number C -> (None, C) (TIS); 'lo_hi' -> (lo, hi) (IcePop).
    Bounds must be > 0 and lo <= hi; nan is refused too (verl would pass it)."""
    if isinstance(spec, bool) or not isinstance(spec, int | float | str):
        raise ValueError(f"{key}: expected a number or a 'lower_upper' string, got {spec!r}")
    text = str(spec).strip()
    if not text:
        raise ValueError(f"{key}: must not be empty; a number (TIS cap) or 'lower_upper' (IcePop bounds)")
    lower: float | None = None
    if isinstance(spec, str) and "_" in text:
        lo, hi = text.split("_", 1)
        lower, upper = _number(lo, key, spec), _number(hi, key, spec)
    else:
        upper = _number(text, key, spec)
    if upper <= 0 or (lower is not None and lower <= 0):
        raise ValueError(f"{key}: bounds must be > 0, got {spec!r}")
    if lower is not None and lower > upper:
        raise ValueError(f"{key}: lower bound must be <= upper bound, got {spec!r}")
    return lower, upper


def parse_rs(options: str, spec: float | str | None) -> tuple[tuple[str, float | None, float], ...]:
    """verl's rollout_rs / rollout_rs_threshold: ((option, lower, upper), ...) with lower None for k2/k3.

    Options are comma-separated (duplicates dropped, order kept); one threshold is shared by every option, or
    one per option. k1: 'lower_upper', or a single U meaning lower = 1/U; k2/k3: one upper bound, no '_'."""
    key = "correction.rollout_rs"
    names: list[str] = []
    for opt in (o.strip() for o in options.split(",")):
        if not opt:
            continue
        if opt not in RS_OPTIONS:
            raise ValueError(f"{key}: '{opt}' is not one of {', '.join(RS_OPTIONS)} (comma-separated)")
        if opt not in names:
            names.append(opt)
    if not names:
        raise ValueError(f"{key}: no option in {options!r}; choose from {', '.join(RS_OPTIONS)}")
    tkey = "correction.rollout_rs_threshold"
    if spec is None:
        raise ValueError(f"{tkey}: rejection sampling ({options}) needs a threshold ('lower_upper' for k1)")
    if isinstance(spec, bool) or not isinstance(spec, int | float | str):
        raise ValueError(f"{tkey}: expected a number or a string, got {spec!r}")
    specs = [s.strip() for s in str(spec).split(",") if s.strip()] if isinstance(spec, str) else [str(spec)]
    if not specs:
        raise ValueError(f"{tkey}: must contain at least one threshold")
    if len(specs) not in (1, len(names)):
        raise ValueError(f"{tkey}: {len(specs)} thresholds for {len(names)} options; give one or one per option")
    specs = specs * len(names) if len(specs) == 1 else specs
    out = []
    for name, s in zip(names, specs, strict=True):
        if name.endswith("k1"):
            if "_" in s:
                lo, hi = s.split("_", 1)
                lower, upper = _number(lo, tkey, spec), _number(hi, tkey, spec)
            else:
                upper = _number(s, tkey, spec)
                lower = 1.0 / upper if upper > 0 else upper
            if lower <= 0 or upper <= 0:
                raise ValueError(f"{tkey}: bounds for {name} must be > 0, got {s!r}")
            if lower > upper:
                raise ValueError(f"{tkey}: bounds for {name} must be lower <= upper, got {s!r}")
            out.append((name, lower, upper))
        else:
            if "_" in s:
                raise ValueError(f"{tkey}: {name} takes one upper bound without '_', got {s!r}")
            upper = _number(s, tkey, spec)
            if upper <= 0:
                raise ValueError(f"{tkey}: bound for {name} must be > 0, got {s!r}")
            out.append((name, None, upper))
    return tuple(out)


@dataclass(frozen=True)
class CorrectionConfig:
    """verl's `algorithm.rollout_correction`, one level deep (`correction.<key>`); the YAML default is off."""

    name: str = field(default="none", metadata={"help": "preset name: a conf/correction/<name>.yaml stem"})
    rollout_is: Literal["token", "sequence"] | None = field(
        default=None,
        metadata={"help": "IS weight on pi_x/mu: per token, per response (product of token ratios), null = none"},
    )
    rollout_is_threshold: float | str = field(
        default=2.0,
        metadata={
            "inf": True,
            "help": "a number C: w = min(raw, C) (TIS); a string 'lo_hi': w = raw inside [lo, hi] (inclusive), "
            "else 0 (IcePop)",
        },
    )
    rollout_is_batch_normalize: bool = field(
        default=False, metadata={"help": "divide w by its masked mean (tokens, or responses for 'sequence')"}
    )
    rollout_rs: str | None = field(
        default=None,
        metadata={
            "help": "rejection sampling, comma-separated and AND-ed: token_k1..3, seq_sum_k1..3, seq_mean_k1..3, "
            "seq_max_k2/k3 (token = token_k1, sequence = seq_sum_k1, geometric = seq_mean_k1); null = none"
        },
    )
    rollout_rs_threshold: float | str | None = field(
        default=None,
        metadata={
            "inf": True,
            "help": "per option (or one for all): k1 'lower_upper' on -log(pi_x/mu) (keeps pi_x/mu in "
            "[1/upper, 1/lower]; a single U means lower = 1/U); k2/k3 an upper bound",
        },
    )
    bypass_mode: bool = field(
        default=False,
        metadata={
            "help": "false: decoupled (lambda = log pi_old - log mu, once per step); true: bypass (mu stands in "
            "for pi_old, no recompute; lambda = log pi - log mu per mini-batch, no gradient)"
        },
    )
    loss_type: Literal["ppo_clip", "reinforce"] = field(
        default="ppo_clip",
        metadata={
            "help": "bypass only: ppo_clip = the objective on pi/mu, w logged but not applied (verl); reinforce = "
            "-A w log pi (objective family pg)"
        },
    )

    def __post_init__(self) -> None:
        self.is_bounds  # noqa: B018  (parses rollout_is_threshold; a bad string fails here, in one line)
        if self.rollout_rs is not None:
            self.rs_thresholds  # noqa: B018
        elif self.rollout_rs_threshold is not None:
            raise ValueError(
                f"correction.rollout_rs_threshold: set to {self.rollout_rs_threshold!r} but correction.rollout_rs is "
                "null; name the rejection options or drop the threshold"
            )
        if self.rollout_is_batch_normalize and self.rollout_is is None:
            raise ValueError("correction.rollout_is_batch_normalize: true needs correction.rollout_is (token/sequence)")
        if self.loss_type == "reinforce" and not self.bypass_mode:
            raise ValueError("correction.loss_type: reinforce is a bypass-mode loss; set correction.bypass_mode=true")

    @property
    def is_bounds(self) -> tuple[float | None, float]:
        """(lower, upper) of the IS weight: lower None = TIS cap at upper; else IcePop's inclusive band."""
        return parse_is_threshold(self.rollout_is_threshold)

    @property
    def rs_thresholds(self) -> tuple[tuple[str, float | None, float], ...]:
        return () if self.rollout_rs is None else parse_rs(self.rollout_rs, self.rollout_rs_threshold)

    @property
    def active(self) -> bool:
        """Anything to do: a weight, a rejection, or bypass (mu in pi_old's place)."""
        return self.rollout_is is not None or self.rollout_rs is not None or self.bypass_mode

    @property
    def applies_weight(self) -> bool:
        """The IS weight multiplies the loss (decoupled, or bypass REINFORCE); bypass PPO-clip only logs it."""
        return self.rollout_is is not None and (not self.bypass_mode or self.loss_type == "reinforce")


@dataclass(frozen=True)
class Correction:
    weight: Tensor | None  # [B, T] detached IS weight, 0 on padding; None without rollout_is
    keep: Tensor  # [B, T] bool: response tokens not rejected
    metrics: dict[str, Tensor]  # "correction/<name>" -> 0-dim detached tensor


def is_weight(cfg: CorrectionConfig, log_ratio: Tensor, m: Tensor) -> tuple[Tensor, Tensor]:
    """(w, band): the weight after its threshold (before any batch normalisation), and which tokens the threshold
    touched (TIS: raw > C; IcePop: raw outside [lo, hi], so w = 0). `log_ratio` is unclamped; padding holds 0."""
    zero = torch.zeros((), dtype=log_ratio.dtype, device=log_ratio.device)
    if cfg.rollout_is == "token":
        raw = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    else:  # the sum of unclamped token log-ratios, clamped once
        seq = log_ratio.sum(-1, keepdim=True).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        raw = torch.exp(seq).expand_as(log_ratio)
    raw = torch.where(m, raw, zero)
    lower, upper = cfg.is_bounds
    if lower is None:
        return raw.clamp(max=upper), (raw > upper) & m
    inside = (raw >= lower) & (raw <= upper)
    return torch.where(inside, raw, zero), ~inside & m


def batch_normalize(cfg: CorrectionConfig, w: Tensor, m: Tensor) -> tuple[Tensor, Tensor]:
    """(w / mean, mean): the masked mean over tokens (token level) or over responses of their per-response mean
    (sequence level); w is left as it is when the mean is not above 1e-8 (verl)."""
    if cfg.rollout_is == "token":
        mean = masked_mean(w, m).to(w.dtype)
    else:
        rows = m.any(-1)
        per_row = w.sum(-1) / (m.sum(-1) + SEQ_MEAN_EPS)
        mean = torch.where(rows, per_row, torch.zeros((), dtype=w.dtype, device=w.device)).sum() / rows.sum().clamp(
            min=1
        )
    return torch.where(mean > NORM_MIN, w / mean.clamp(min=NORM_MIN), w), mean


def rejection_keep(cfg: CorrectionConfig, log_ratio: Tensor, m: Tensor) -> Tensor:
    """[B, T] bool: the response tokens every rejection option keeps (verl's combined mask, AND-ed)."""
    ls = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    stats = {"k1": -ls, "k2": 0.5 * ls**2, "k3": torch.expm1(ls) - ls}
    zero = torch.zeros((), dtype=ls.dtype, device=ls.device)
    n = m.sum(-1, keepdim=True).to(ls.dtype)
    keep = m.clone()
    for option, lower, upper in cfg.rs_thresholds:
        level, k = option.rsplit("_", 1)
        tok = torch.where(m, stats[k], zero)
        if level == "token":
            stat = tok
        elif level == "seq_sum":
            stat = tok.sum(-1, keepdim=True)
        elif level == "seq_mean":
            stat = tok.sum(-1, keepdim=True) / (n + SEQ_MEAN_EPS)
        else:  # seq_max: 0 for a response without tokens, as verl's
            stat = masked_max_rows(stats[k], m)
        if lower is None:
            ok = stat <= upper
        else:
            ok = (stat >= math.log(lower)) & (stat <= math.log(upper))
        keep = keep & ok.expand_as(m)
    return keep


def masked_max_rows(x: Tensor, m: Tensor) -> Tensor:
    """[B, 1]: each row's max over its mask; 0 for an empty row."""
    lowest = torch.full((), float("-inf"), dtype=x.dtype, device=x.device)
    out = torch.where(m, x, lowest).amax(-1, keepdim=True) if x.shape[-1] else x.new_zeros((x.shape[0], 1))
    return torch.where(torch.isinf(out) & (out < 0), torch.zeros((), dtype=x.dtype, device=x.device), out)


def rollout_correction(cfg: CorrectionConfig, logp_x: Tensor, behavior_logp: Tensor, mask: Tensor) -> Correction:
    """The IS weight, the rejection mask and their metrics for lambda = logp_x - behavior_logp on `mask`'s tokens.

    logp_x is pi_old (decoupled) or the policy's detached log pi (bypass); all inputs [B, T]. Computed in at least
    fp32. Padding is replaced with `where` before any sum, so a NaN there never reaches a response (verl multiplies
    by the mask instead)."""
    m = mask > 0
    dtype = torch.promote_types(logp_x.dtype, torch.float32)
    zero = torch.zeros((), dtype=dtype, device=logp_x.device)
    with torch.no_grad():
        lam = torch.where(m, logp_x.detach().to(dtype) - behavior_logp.to(dtype), zero)
        keep = rejection_keep(cfg, lam, m) if cfg.rollout_rs is not None else m
        rows = m.any(-1)
        n_rows = rows.sum().clamp(min=1)
        rejected = m & ~keep
        metrics: dict[str, Tensor] = {"correction/log_ratio_mean": masked_mean(lam, m)}
        if cfg.rollout_rs is not None:
            metrics["correction/rejected_frac"] = masked_mean(rejected.float(), m)
            metrics["correction/rejected_seq_frac"] = rejected.any(-1).sum() / n_rows
            metrics["correction/rejected_row_frac"] = (rows & ~keep.any(-1)).sum() / n_rows
        weight = None
        if cfg.rollout_is is not None:
            weight, band = is_weight(cfg, lam, m)
            # Statistics of the weight before batch normalisation (verl's rollout_is_mean/max/min).
            lowest = torch.full((), float("inf"), dtype=dtype, device=lam.device)
            metrics["correction/is_weight_mean"] = masked_mean(weight, m)
            metrics["correction/is_weight_max"] = masked_max(weight, m)
            w_min = torch.where(m, weight, lowest).min() if weight.numel() else zero
            metrics["correction/is_weight_min"] = torch.where(m.any(), w_min, zero)
            name = "capped" if cfg.is_bounds[0] is None else "zeroed"
            metrics[f"correction/is_{name}_frac"] = masked_mean(band.float(), m)
            metrics[f"correction/is_{name}_seq_frac"] = band.any(-1).sum() / n_rows
            if cfg.rollout_is_batch_normalize:
                weight, metrics["correction/is_norm_factor"] = batch_normalize(cfg, weight, m)
        metrics = {k: v.detach().float() for k, v in metrics.items()}
    return Correction(weight=weight, keep=keep, metrics=metrics)
