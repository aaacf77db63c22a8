"""The rollout correction inside a step (docs/objectives.md §2.10): once per step in decoupled mode, per mini-batch in
bypass mode, and what the loss mask and denominators keep. The correction itself is a pure function
(harness.objectives.correction); this is where the loop applies it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from harness.batch import TrainBatch
from harness.logprobs import LogProbOutput
from harness.loop.state import Run
from harness.objectives import aggregate_denominator
from harness.objectives.correction import Correction, rollout_correction


def decoupled_correction(
    run: Run, batch: TrainBatch, old_logp: torch.Tensor | None
) -> tuple[TrainBatch, Correction | None]:
    """The decoupled-mode rollout correction, once per step on lambda = log pi_old - log mu (pi_old does not move
    within a step). As verl writes the rejection back into the response mask before the advantages, A is 0 on a
    rejected token here; the mini-batches take the rejection out of their loss masks and denominators."""
    cfg = run.cfg.correction
    if not cfg.active or cfg.bypass_mode:
        return batch, None
    assert old_logp is not None  # validate(): a correction needs an objective anchored on pi_old
    corr = rollout_correction(cfg, old_logp, batch.behavior_logp, batch.mask)
    return dataclasses.replace(batch, advantages=batch.advantages * corr.keep), corr


def minibatch_denominator(batch: TrainBatch, corr: Correction | None, rows: torch.Tensor, agg: str) -> float:
    """What a whole mini-batch's loss is normalised by: `aggregate_denominator` of its rows' loss mask, from which a
    decoupled-mode correction has taken the rejected tokens (and so a row with none left)."""
    mask = batch.mask[rows] if corr is None else batch.mask[rows] * corr.keep[rows]
    return float(aggregate_denominator(mask, agg))


@dataclass(frozen=True)
class Corrected:
    """A mini-batch as the objective and the aggregation see it under the rollout correction."""

    batch: TrainBatch  # A is 0 on rejected tokens (verl writes the rejection into the mask before the advantages)
    mask: torch.Tensor  # the loss mask: response tokens the correction kept
    weight: torch.Tensor | None  # the IS weight the loss is multiplied by; None when none is applied
    is_logp: torch.Tensor | None  # what the objective's importance ratio is taken against instead of mu
    full_denominator: float
    metrics: dict[str, torch.Tensor]


def corrected(run: Run, mb: Any, lp: LogProbOutput) -> Corrected:
    """`mb` is a harness.loop.step.MiniBatch (step imports this module, so it is typed Any here).

    The rollout correction of this mini-batch (docs/objectives.md §2.10).

    Decoupled: the step's correction (`decoupled_correction`); the weight stands in for pi_old/mu (1 without
    rollout_is, as in verl's rejection-only presets), so the objective's importance ratio is taken against pi_old.
    Bypass: lambda = log pi - log mu from this forward, no gradient; the objective already runs on pi/mu (mu is its
    pi_old), so PPO-clip does not apply the weight (verl) and REINFORCE replaces the ratio by it (-A w log pi). The
    token-mean denominator keeps the rejected tokens (verl's engine counted them before the loss rejected them); a
    row with no token left leaves the seq-mean ones."""
    cfg, b = run.cfg.correction, mb.batch
    if mb.correction is not None:
        c = mb.correction
        return Corrected(b, b.mask * c.keep, c.weight, mb.old_logp, mb.full_denominator, {})
    if not cfg.bypass_mode:
        return Corrected(b, b.mask, None, None, mb.full_denominator, {})
    c = rollout_correction(cfg, lp.logp.detach(), b.behavior_logp, b.mask)
    weight = c.weight if cfg.applies_weight else None
    full = mb.full_denominator
    if run.cfg.objective.agg.startswith("seq-mean"):
        # Rows without signal are not forwarded: as in one process, they count as kept.
        gone = int((b.mask.any(-1) & ~c.keep.any(-1)).sum()) if mb.has_signal else 0
        full = max(full - run.ranks.all_sum(float(gone)), 1.0)
    batch = dataclasses.replace(b, advantages=b.advantages * c.keep)
    is_logp = lp.logp.detach() if weight is not None else None
    return Corrected(batch, b.mask * c.keep, weight, is_logp, full, c.metrics)


def rows_of(c: Correction, rows: torch.Tensor, t: int) -> Correction:
    """The correction of a mini-batch's rows, cut to its columns (TrainBatch.select)."""
    weight = None if c.weight is None else c.weight[rows][:, :t]
    return Correction(weight=weight, keep=c.keep[rows][:, :t], metrics={})
