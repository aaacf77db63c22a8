"""Sequence advantages from rewards, per group of samples of the same prompt (objectives.md §2.6).

    grpo    (R - mean_G R) / (std_G R + eps), std unbiased as torch.std (DeepSeekMath; verl's default)
    drgrpo  R - mean_G R, no std (Dr.GRPO; what DPPO and DRPO use)
    rloo    R - mean of the OTHER samples in the group = G/(G-1) * (R - mean_G R)

Groups are given by an id per sequence, in any order. A group whose rewards are all equal gives zeros (no
learning signal) and is counted in `reward/zero_std_group_frac`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

STD_EPS = 1e-6


def _group_stats(rewards: Tensor, group: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-sequence (group mean, group unbiased std, group size) and the dense group index, vectorised."""
    _, idx = torch.unique(group, return_inverse=True)
    n_groups = int(idx.max()) + 1 if idx.numel() else 0
    r = rewards.double()
    count = torch.zeros(n_groups, dtype=torch.float64, device=r.device).index_add_(0, idx, torch.ones_like(r))
    total = torch.zeros_like(count).index_add_(0, idx, r)
    mean = total / count
    sq = torch.zeros_like(count).index_add_(0, idx, (r - mean[idx]) ** 2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    return mean[idx], std[idx], count[idx], idx


def grpo(rewards: Tensor, group: Tensor) -> Tensor:
    mean, std, _, _ = _group_stats(rewards, group)
    return (rewards.double() - mean) / (std + STD_EPS)


def drgrpo(rewards: Tensor, group: Tensor) -> Tensor:
    mean, _, _, _ = _group_stats(rewards, group)
    return rewards.double() - mean


def rloo(rewards: Tensor, group: Tensor) -> Tensor:
    mean, _, count, _ = _group_stats(rewards, group)
    if bool((count < 2).any()):
        raise ValueError("advantage 'rloo' needs at least 2 samples per group (trainer.group_size >= 2)")
    return count / (count - 1) * (rewards.double() - mean)


ADVANTAGES: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"grpo": grpo, "drgrpo": drgrpo, "rloo": rloo}


def compute_advantages(rewards: Tensor, group: Tensor, estimator: str = "drgrpo") -> tuple[Tensor, dict[str, float]]:
    """rewards [B], group [B] int -> (advantages [B] float32, metrics). Equal-reward groups get exactly 0."""
    if estimator not in ADVANTAGES:
        raise ValueError(f"advantage estimator '{estimator}' is not one of: {', '.join(ADVANTAGES)}")
    if rewards.shape != group.shape or rewards.dim() != 1:
        raise ValueError(f"rewards {tuple(rewards.shape)} and group {tuple(group.shape)} must both be [B]")
    adv = ADVANTAGES[estimator](rewards, group)
    _, std, _, idx = _group_stats(rewards, group)
    flat = std == 0
    adv = torch.where(flat, torch.zeros_like(adv), adv)  # exact zeros: no float residue from the mean
    n_groups = int(idx.max()) + 1 if idx.numel() else 0
    flat_groups = torch.zeros(n_groups, dtype=torch.bool).index_fill_(0, idx[flat], True) if n_groups else flat
    metrics = {
        "reward/zero_std_group_frac": float(flat_groups.float().mean()) if n_groups else 0.0,
        "reward/adv_abs_mean": float(adv.abs().mean()) if adv.numel() else 0.0,
    }
    return adv.float(), metrics
