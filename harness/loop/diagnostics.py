"""What the papers' figures plot beyond an objective's own metrics, gathered over all of a step's mini-batches.

- The training-inference mismatch (mu against pi before an update: |pi - mu|, k1, k3), the policy entropy, and
  P-DPPO Fig. 5's "bad updates" (A < 0 while mu - pi exceeds `trainer.bad_update_gap`).

- Fig. 6 (DPPO v3): the rollout probability mu and the entropy of the tokens the trust region masked or clipped,
  split by the sign of A. "Masked or clipped" is read off autograd, as in tokens.parquet: a response token with
  A != 0 whose gradient weight -dL/dlogp is exactly 0. One rule therefore covers every objective (a ratio clip, a
  divergence mask, a negative-sample mask), and an objective that never zeroes a token (PG-IS, DRPO) reports 0.
- App. D: the token strings clipped most often, by sign of A, over the whole run (`clipped_tokens.csv`).
- Fig. 12: the top-K probability mass of mu; and the share of sampled tokens with mu <= 0.01 (the low-probability
  tokens §4 says ratio clipping over-constrains).
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from harness.batch import TrainBatch
from harness.distributed import ProcessGroup
from harness.rundir.files import atomic_write_text, writing

LOW_PROB = 0.01  # "low-probability token": mu at or below this
# DPPO §6's threshold: ratio clipping over-constrains tokens with mu below 0.1 (the Relax objectives' own cut). The
# share of such tokens among the clipped ones against their share among all tokens of the same sign of A is the
# enrichment suite v8's claim 3 reads (the paper's "below 0.15" is about its model, whose mu runs lower).
LOW_MU = 0.1
TABLE_ROWS = 50  # App. D lists the 50 most clipped tokens per sign
SIGNS = ("pos", "neg")


def mismatch(logp: torch.Tensor, mb: TrainBatch) -> dict[str, float]:
    """Rollout engine (mu) vs trainer (pi, same weights before any update): the training-inference mismatch."""
    m = mb.mask > 0
    if not bool(m.any()):
        return {}
    log_r = (logp - mb.behavior_logp)[m]
    p, q = logp.exp()[m], mb.behavior_logp.exp()[m]
    return {
        "mismatch/abs_prob_diff_mean": float((p - q).abs().mean()),
        "mismatch/abs_prob_diff_max": float((p - q).abs().max()),
        "mismatch/mu_minus_pi_max": float((q - p).max()),
        "mismatch/mu_minus_pi_min": float((q - p).min()),
        "mismatch/k1": float((-log_r).mean()),
        "mismatch/k3": float((torch.expm1(log_r) - log_r).mean()),
    }


def bad_update_frac(logp: torch.Tensor, mb: TrainBatch, threshold: float) -> float:
    """Tokens pushed down (A < 0) although pi already sits far below mu (mu - pi > `trainer.bad_update_gap`):
    P-DPPO's "bad updates" (Fig. 5)."""
    m = mb.mask > 0
    gap = mb.behavior_logp.exp() - logp.exp()
    return float(((mb.advantages < 0) & (gap > threshold) & m).sum() / m.sum().clamp(min=1))


def zero_weight(loss_mat: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """Bool [B, T]: tokens whose gradient weight is exactly 0. `loss_mat` must still be attached to `logp`
    (call before backward); only the elementwise graph from logp to the loss is walked, not the model's."""
    (grad,) = torch.autograd.grad(loss_mat.sum(), logp, retain_graph=True)
    return grad == 0


def rollout_metrics(mask: torch.Tensor, behavior_logp: torch.Tensor, topk_behavior_logp: torch.Tensor | None) -> dict:
    """The step's sampled tokens: share with mu <= LOW_PROB, and the top-K mass of mu when the rollout has one."""
    m = mask > 0
    n = m.sum().clamp(min=1)
    out = {"rollout/low_prob_frac": float(((behavior_logp.exp() <= LOW_PROB) & m).sum() / n)}
    if topk_behavior_logp is not None and topk_behavior_logp.shape[-1] > 1:
        mass = topk_behavior_logp.exp().sum(-1)
        out["rollout/topk_mass"] = float((mass * m).sum() / n)
    return out


class ClippedTokens:
    """Masked/clipped tokens by sign of A: sums for the step's metrics, and per-token-id counts for the run's
    App. D table (kept in the checkpoint, so a resumed run's table covers every step)."""

    def __init__(self, counts: dict[str, Any] | None = None) -> None:
        self.step: dict[str, float] = {}
        self.clipped: dict[str, Counter[int]] = {s: Counter() for s in SIGNS}
        self.seen: dict[str, Counter[int]] = {s: Counter() for s in SIGNS}
        for s in SIGNS if counts else ():
            self.clipped[s].update({int(k): int(v) for k, v in counts["clipped"][s].items()})
            self.seen[s].update({int(k): int(v) for k, v in counts["seen"][s].items()})

    def start_step(self) -> None:
        self.step = {}

    def add(self, clipped: torch.Tensor, mb: TrainBatch, entropy: torch.Tensor | None) -> None:
        valid, mu = mb.mask > 0, mb.behavior_logp.exp()
        low, ent = mu < LOW_MU, entropy if entropy is not None else torch.full_like(mu, float("nan"))
        sides = [valid & (mb.advantages > 0), valid & (mb.advantages < 0)]
        # Both signs' sums in one tensor and one transfer: a host sync per number would stall a GPU step.
        sums = torch.stack([
            torch.stack([tokens.sum(), (tokens & clipped).sum(), (tokens & low).sum(), (tokens & clipped & low).sum(),
                         mu[tokens & clipped].sum(), ent[tokens & clipped].sum()]).float()
            for tokens in sides
        ]).tolist()  # fmt: skip
        ids, masks = mb.response_ids.cpu(), [(t.cpu(), (t & clipped).cpu()) for t in sides]
        for sign, row, (tokens, hit) in zip(SIGNS, sums, masks, strict=True):
            for key, value in zip(("tokens", "clipped", "low", "clipped_low", "mu", "entropy"), row, strict=True):
                self.step[f"{sign}/{key}"] = self.step.get(f"{sign}/{key}", 0.0) + value
            self.seen[sign].update(ids[tokens].tolist())
            self.clipped[sign].update(ids[hit].tolist())

    def metrics(self, ranks: ProcessGroup) -> dict[str, float]:
        """objective/clipped_{frac,mu_mean,entropy_mean,lowmu_frac}_{pos,neg} and objective/lowmu_frac_{pos,neg}:
        summed over ranks, then divided."""
        out: dict[str, float] = {}
        if not self.step:
            return out
        total = {key: ranks.all_sum(value) for key, value in sorted(self.step.items())}
        for sign in SIGNS:
            n, hit = total[f"{sign}/tokens"], total[f"{sign}/clipped"]
            out[f"objective/clipped_frac_{sign}"] = hit / n if n else float("nan")
            out[f"objective/clipped_mu_mean_{sign}"] = total[f"{sign}/mu"] / hit if hit else float("nan")
            out[f"objective/clipped_entropy_mean_{sign}"] = total[f"{sign}/entropy"] / hit if hit else float("nan")
            out[f"objective/clipped_lowmu_frac_{sign}"] = total[f"{sign}/clipped_low"] / hit if hit else float("nan")
            out[f"objective/lowmu_frac_{sign}"] = total[f"{sign}/low"] / n if n else float("nan")
        return out

    def state(self) -> dict[str, Any]:
        """Plain values for the checkpoint."""
        return {
            "clipped": {s: dict(self.clipped[s]) for s in SIGNS},
            "seen": {s: dict(self.seen[s]) for s in SIGNS},
        }

    def write_table(self, path: Path, decode: Any) -> None:
        """clipped_tokens.csv: per sign of A, the TABLE_ROWS token ids clipped most often, with their text, how
        often they were clipped and seen, and the clipped share."""
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["sign", "rank", "token_id", "token", "clipped", "seen", "clipped_share"])
        for sign in SIGNS:
            for rank, (tid, n) in enumerate(self.clipped[sign].most_common(TABLE_ROWS), start=1):
                seen = self.seen[sign][tid]
                w.writerow([sign, rank, tid, decode([tid]), n, seen, f"{n / seen:.4f}" if seen else ""])
        with writing(path):
            atomic_write_text(path, buf.getvalue())
