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
        raise ValueError(f"aggregate mode '{mode}' is not one of: {', '.join(AGG_MODES)}")
    if loss_mat.shape != mask.shape:
        raise ValueError(f"loss_mat {tuple(loss_mat.shape)} and mask {tuple(mask.shape)} must have the same shape")
    m = mask > 0
    zero = torch.zeros((), dtype=loss_mat.dtype, device=loss_mat.device)
    masked = torch.where(m, loss_mat, zero)
    if mode == "token-sum":
        return masked.sum()
    if mode == "token-mean":
        return masked.sum() / m.sum().clamp(min=1)
    tokens = m.sum(-1)
    rows = tokens > 0
    n_rows = rows.sum().clamp(min=1)
    seq_sum = masked.sum(-1)
    if mode == "seq-mean-token-mean":
        return torch.where(rows, seq_sum / tokens.clamp(min=1), zero).sum() / n_rows
    seq_mean_sum = seq_sum.sum() / n_rows
    if mode == "seq-mean-token-sum":
        return seq_mean_sum
    if horizon is None or horizon <= 0:
        raise ValueError("aggregate mode 'seq-mean-token-sum-norm' needs a constant horizon > 0 (max response tokens)")
    return seq_mean_sum / horizon
