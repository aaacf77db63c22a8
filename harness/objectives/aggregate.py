"""Loss aggregation over tokens: one function, chosen independently of the objective (objectives.md §2.6).

On a [B, T] loss L with mask m:
    token-mean               sum(L m) / sum(m)                                 (DAPO; verl default)
    token-sum                sum(L m)
    seq-mean-token-mean      mean over sequences of per-sequence token means   (original GRPO)
    seq-mean-token-sum       mean over sequences of per-sequence token sums
    seq-mean-token-sum-norm  seq-mean-token-sum / H, H a constant horizon      (Dr.GRPO; DPPO and DRPO)
"Sequences" are rows with at least one response token: a fully masked row is ignored, not averaged in as 0.
H must be a constant (the max response length), never the batch's own lengths, or the length bias returns (P8).
"""

from __future__ import annotations

import torch
from torch import Tensor

AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def aggregate(loss_mat: Tensor, mask: Tensor, mode: str = "token-mean", horizon: float | None = None) -> Tensor:
    if mode not in AGG_MODES:
        raise _unknown_mode(mode)
    if loss_mat.shape != mask.shape:
        raise ValueError(f"loss_mat {tuple(loss_mat.shape)} and mask {tuple(mask.shape)} must have the same shape")
    m = mask > 0
    zero = torch.zeros((), dtype=loss_mat.dtype, device=loss_mat.device)
    masked = torch.where(m, loss_mat, zero)
    if mode in ("token-mean", "token-sum"):
        total = masked.sum()
    else:
        tokens = m.sum(-1)
        seq_sum = masked.sum(-1)
        if mode == "seq-mean-token-mean":
            total = torch.where(tokens > 0, seq_sum / tokens.clamp(min=1), zero).sum()
        else:
            total = seq_sum.sum()
    out = total / aggregate_denominator(mask, mode)
    if mode != "seq-mean-token-sum-norm":
        return out
    if horizon is None or horizon <= 0:
        raise ValueError("aggregate mode 'seq-mean-token-sum-norm' needs a constant horizon > 0 (max response tokens)")
    return out / horizon


def aggregate_denominator(mask: Tensor, mode: str) -> Tensor:
    """What `aggregate` divides the summed loss by: the part of its normaliser that depends on which rows are
    there (the horizon is a constant). A subset of a batch's rows, aggregated alone and rescaled by
    aggregate_denominator(subset) / aggregate_denominator(batch), is normalised as the whole batch (the trainer's
    mini-batches: rows skipped for want of signal, rows on other ranks)."""
    m = mask > 0
    if mode == "token-sum":
        return torch.ones((), dtype=torch.long, device=mask.device)
    if mode == "token-mean":
        return m.sum().clamp(min=1)
    if mode in ("seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        return (m.sum(-1) > 0).sum().clamp(min=1)
    raise _unknown_mode(mode)  # a new mode must say here what it divides by


def _unknown_mode(mode: str) -> ValueError:
    return ValueError(f"aggregate mode '{mode}' is not one of: {', '.join(AGG_MODES)}")
