"""Rollout replay: every objective on exactly the same tokens (DPPO Fig. 6's analysis, paired, free of seed noise).

    python -m analysis.replay RUN_DIR [--out findings/replay]

A training run with `trainer.save_batches=[...]` keeps, for each mini-batch update of those steps, the objective's
inputs (pi after the updates so far, the rollout's mu, the advantages, the mask, the policy's entropy). The replay
feeds each saved mini-batch to every objective in OBJECTIVES and reads, per token, the gradient weight
c = d loss / d log pi (every objective's gradient is c * grad log pi), so the objectives are compared on the same
tokens rather than on runs with other seeds:
- claim 3 (DPPO Fig. 6): the tokens GRPO's ratio clip zeroes: their mu and entropy against all tokens', and the share
  Relax (no clip for mu < alpha) gives back;
- claim 11 (DRPO Fig. 11): Mask-DRPO keeps DRPO's penalty only beyond the TV boundary (|pi - mu| > delta in the
  direction the advantage pushes) and is plain r * A inside it, so the two differ only inside: how much of DRPO's
  weight that inside correction is;
- for every objective: the share of tokens it zeroes, their mean mu and entropy, and its mean |c|.
Writes REPLAY.md, replay.json and figures/ (mu histograms of the zeroed sets; DRPO vs Mask-DRPO weights).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.objectives import get_objective
from harness.objectives.correction import Correction, CorrectionConfig, rollout_correction

ROOT = Path(__file__).resolve().parents[1]
# (label, preset, overrides): the base setting's arms, DRPO at the delta where its corrective region is reached.
OBJECTIVES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("pg_is", "pg_is", {}),
    ("pg_tis", "pg_tis", {}),
    ("grpo", "grpo", {}),
    ("relax_both", "grpo_relax", {}),
    ("relax_low", "grpo_relax", {"sides": "low"}),
    ("dppo_tv", "dppo", {}),
    ("dppo_kl", "dppo_kl", {}),
    ("mask_neg", "mask_neg", {}),
    ("drpo_0.15", "drpo", {"delta": 0.15}),
    ("drpo_mask_0.15", "drpo_mask", {"delta": 0.15}),
    ("drpo_no_absadv_0.15", "drpo_no_absadv", {"delta": 0.15}),
    ("gspo", "gspo", {}),
    ("cppo", "cppo", {}),
    ("icepop", "icepop", {}),  # anchored on pi_old: only where the batches carry it (below)
    ("grpo_seq_tis", "minirl", {}),  # with SEQ_TIS, verl's decoupled_seq_is
)
# GRPO-ClipHigher on pi/pi_old with verl's sequence TIS (w = min(prod pi_old/mu, 2), detached, multiplying the
# per-token loss): the rollout-correction axis's representative in the replay.
CORRECTED = {"grpo_seq_tis": CorrectionConfig(name="decoupled_seq_is", rollout_is="sequence", rollout_is_threshold=2.0)}
LOW_MU = 0.1  # Relax's alpha and DPPO Fig. 6's "low-probability" line


@dataclass
class Tokens:
    """Every saved update's response tokens with a non-zero advantage, flattened: the set all objectives see."""

    mu: np.ndarray
    pi: np.ndarray
    advantage: np.ndarray
    entropy: np.ndarray
    weights: dict[str, np.ndarray]  # objective label -> c per token
    # objective label -> (sequences with a token of non-zero advantage, those with one of them zeroed)
    sequences: dict[str, tuple[int, int]] = field(default_factory=dict)
    # corrected objective label -> its correction's IS-weight metrics, averaged over the saved updates
    correction: dict[str, dict[str, float]] = field(default_factory=dict)


def load_batches(run_dir: Path) -> list[dict[str, Any]]:
    files = sorted((run_dir / "batches").glob("step_*.pt"), key=lambda p: int(p.stem.split("_")[1]))
    if not files:
        raise SystemExit(f"error: {run_dir}: no batches/step_<k>.pt; train with trainer.save_batches=[...] first")
    return [b for f in files for b in torch.load(f)]


def token_weights(objective: Any, batch: dict[str, Any], corr: Correction | None = None) -> torch.Tensor:
    """c per token: the gradient of the objective's summed per-token loss with respect to log pi; NaN on every
    token when the objective needs pi_old and the source run did not recompute it (old_logp None). A rollout
    correction (`rollout_correction` of this batch) multiplies the loss by its detached weight and drops rejected
    tokens, as the training step does."""
    if batch["old_logp"] is None and objective.needs_old:
        return torch.full_like(batch["logp"], math.nan)
    advantages, mask, weight, extra = batch["advantages"], batch["mask"], None, {}
    if corr is not None:  # decoupled, as harness.loop.correction: the ratio is taken against pi_old
        advantages, mask, weight = advantages * corr.keep, mask * corr.keep, corr.weight
        extra = {"is_logp": batch["old_logp"]}
    logp = batch["logp"].clone().requires_grad_(True)
    out = objective(
        logp=logp, behavior_logp=batch["behavior_logp"], advantages=advantages, mask=mask,
        old_logp=batch["old_logp"], **extra,
    )  # fmt: skip
    loss = out.loss_mat if weight is None else out.loss_mat * weight
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    return -grad  # the loss is minimised: c is the weight on grad log pi in the ascent direction


def replay(batches: list[dict[str, Any]]) -> Tokens:
    objectives = {label: get_objective(preset, **kw) for label, preset, kw in OBJECTIVES}
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("mu", "pi", "advantage", "entropy")}
    weights: dict[str, list[np.ndarray]] = {label: [] for label in objectives}
    sequences = dict.fromkeys(objectives, (0, 0))
    corrections: dict[str, list[dict[str, float]]] = {label: [] for label in CORRECTED}
    for batch in batches:
        keep = (batch["mask"] > 0) & (batch["advantages"] != 0)
        rows = keep.any(-1)
        parts["mu"].append(batch["behavior_logp"].exp()[keep].numpy())
        parts["pi"].append(batch["logp"].exp()[keep].numpy())
        parts["advantage"].append(batch["advantages"][keep].numpy())
        parts["entropy"].append(batch["entropy"][keep].numpy())
        for label, obj in objectives.items():
            corr = None
            if label in CORRECTED and batch["old_logp"] is not None:  # once: its weights and its own metrics
                corr = rollout_correction(CORRECTED[label], batch["old_logp"], batch["behavior_logp"], batch["mask"])
                corrections[label].append({k.removeprefix("correction/"): float(v) for k, v in corr.metrics.items()})
            c = token_weights(obj, batch, corr)
            weights[label].append(c[keep].numpy())
            hit = ((c == 0) & keep).any(-1)
            n, z = sequences[label]
            sequences[label] = (n + int(rows.sum()), z + int((hit & rows).sum()))
    cat = {k: np.concatenate(v) for k, v in parts.items()}
    mean_metrics = {
        label: {k: float(np.mean([m[k] for m in ms])) for k in ms[0]} for label, ms in corrections.items() if ms
    }
    return Tokens(
        **cat, weights={k: np.concatenate(v) for k, v in weights.items()}, sequences=sequences,
        correction=mean_metrics,
    )  # fmt: skip


def zeroed(tokens: Tokens, label: str) -> np.ndarray:
    return tokens.weights[label] == 0


def summary(tokens: Tokens) -> dict[str, Any]:
    n = len(tokens.mu)
    rows = []
    for label in tokens.weights:
        if n and np.isnan(tokens.weights[label]).all():  # anchored on pi_old; the source run is mu-anchored
            rows.append({"objective": label, "needs_pi_old": True})
            continue
        z = zeroed(tokens, label)
        rows.append({
            "objective": label, "zeroed": int(z.sum()), "zeroed_frac": float(z.mean()) if n else math.nan,
            "zeroed_mu_mean": float(tokens.mu[z].mean()) if z.any() else math.nan,
            "zeroed_low_mu_frac": float((tokens.mu[z] < LOW_MU).mean()) if z.any() else math.nan,
            "zeroed_entropy_excess": float(tokens.entropy[z].mean() - tokens.entropy.mean()) if z.any() else math.nan,
            "mean_abs_weight": float(np.abs(tokens.weights[label]).mean()) if n else math.nan,
            "zeroed_seq_frac": _ratio(*tokens.sequences.get(label, (0, 0))),
            "correction": tokens.correction.get(label),
        })  # fmt: skip
    grpo, relax = zeroed(tokens, "grpo"), zeroed(tokens, "relax_both")
    freed = grpo & ~relax
    claim3 = {
        "grpo_clipped": int(grpo.sum()),
        "clipped_mu_mean": float(tokens.mu[grpo].mean()) if grpo.any() else math.nan,
        "all_mu_mean": float(tokens.mu.mean()) if n else math.nan,
        "clipped_low_mu_frac": float((tokens.mu[grpo] < LOW_MU).mean()) if grpo.any() else math.nan,
        "all_low_mu_frac": float((tokens.mu < LOW_MU).mean()) if n else math.nan,
        "clipped_entropy_mean": float(tokens.entropy[grpo].mean()) if grpo.any() else math.nan,
        "all_entropy_mean": float(tokens.entropy.mean()) if n else math.nan,
        "relax_frees": int(freed.sum()),
        "relax_frees_all_low_mu": bool((tokens.mu[freed] < LOW_MU).all()) if freed.any() else True,
    }
    drpo, masked = tokens.weights["drpo_0.15"], tokens.weights["drpo_mask_0.15"]
    differ = ~np.isclose(drpo, masked, rtol=1e-6, atol=1e-9)
    beyond = _beyond_tv(tokens, 0.15)
    claim11 = {
        "differ": int(differ.sum()),
        "beyond_boundary": int(beyond.sum()),
        "differ_beyond_boundary": int((differ & beyond).sum()),
        "weight_gap_inside": float(np.abs(drpo - masked)[~beyond].sum()),
        "weight_total": float(np.abs(drpo).sum()),
    }
    return {"tokens": n, "objectives": rows, "claim3": claim3, "claim11": claim11}


def _beyond_tv(tokens: Tokens, delta: float) -> np.ndarray:
    """Tokens past DPPO-TV's boundary in the direction the advantage pushes: pi - mu > delta with A > 0, or
    mu - pi > delta with A < 0 (DPPO's Binary-TV mask)."""
    gap = tokens.pi - tokens.mu
    return ((tokens.advantage > 0) & (gap > delta)) | ((tokens.advantage < 0) & (-gap > delta))


def draw(tokens: Tokens, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    bins = np.linspace(0, 1, 21)
    ax.hist(tokens.mu, bins=bins, density=True, histtype="step", label=f"all tokens ({len(tokens.mu)})", color="k")
    for label in ("grpo", "dppo_tv", "mask_neg"):
        z = zeroed(tokens, label)
        if z.any():
            ax.hist(tokens.mu[z], bins=bins, density=True, histtype="step", label=f"{label} zeroed ({z.sum()})")
    ax.axvline(LOW_MU, ls=":", color="grey")
    ax.set_xlabel("rollout probability mu of the token")
    ax.set_ylabel("density")
    ax.set_title("tokens each objective zeroes (same tokens)")
    ax.legend(fontsize=8)
    beyond = _beyond_tv(tokens, 0.15)
    drpo, masked = tokens.weights["drpo_0.15"], tokens.weights["drpo_mask_0.15"]
    ax2.scatter(drpo[~beyond], masked[~beyond], s=4, alpha=0.4, label="inside the TV boundary")
    ax2.scatter(drpo[beyond], masked[beyond], s=8, color="tab:red", label="beyond it")
    ax2.set_xlabel("DRPO weight c (delta 0.15)")
    ax2.set_ylabel("Mask-DRPO weight c")
    ax2.set_title("the same tokens under DRPO and Mask-DRPO")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    path = out / "replay.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [str(path)]


def markdown(doc: dict[str, Any], source: str) -> str:
    c3, c11 = doc["claim3"], doc["claim11"]
    lines = [
        "# Rollout replay: every objective on the same tokens",
        "",
        f"Source: `{source}` ({doc['updates']} saved mini-batch updates, {doc['tokens']} response tokens with A != 0). "
        "Each objective's per-token gradient weight c is computed on exactly these tokens (no seed noise between "
        "objectives); a token is *zeroed* when c = 0.",
        "",
        "## Claim 3 (DPPO Fig. 6): what ratio clipping zeroes",
        "",
        f"- GRPO's clip zeroes {c3['grpo_clipped']} tokens; their mean mu {c3['clipped_mu_mean']:.3f} against "
        f"{c3['all_mu_mean']:.3f} over all tokens; share with mu < {LOW_MU}: {c3['clipped_low_mu_frac']:.3f} against "
        f"{c3['all_low_mu_frac']:.3f}; mean entropy {c3['clipped_entropy_mean']:.3f} against "
        f"{c3['all_entropy_mean']:.3f}.",
        f"- Relax-both gives back {c3['relax_frees']} of them"
        + (f", all with mu < {LOW_MU}." if c3["relax_frees_all_low_mu"] else "; not all with low mu (a bug?)."),
        "",
        "## Claim 11 (DRPO Fig. 11): where Mask-DRPO differs from DRPO",
        "",
        f"- {c11['differ']} tokens get another weight under Mask-DRPO, {c11['differ_beyond_boundary']} of them beyond "
        f"the TV boundary (delta 0.15; {c11['beyond_boundary']} tokens lie beyond it, where both apply DRPO's "
        "penalty).",
        f"- DRPO's correction inside the boundary, which Mask-DRPO drops: {c11['weight_gap_inside']:.3g} of a total "
        f"|c| of {c11['weight_total']:.3g} ({c11['weight_gap_inside'] / max(c11['weight_total'], 1e-12):.1%}).",
        "",
        "## Every objective",
        "",
        "| objective | zeroed tokens | share | sequences with a zeroed token | mean mu zeroed | mu < 0.1 among zeroed "
        "| entropy excess | mean \\|c\\| | rollout correction: IS weight mean / max, rejected share |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["objectives"]:
        if r.get("needs_pi_old"):
            lines.append(f"| {r['objective']} | needs pi_old: the source run did not recompute it | | | | | | | |")
            continue
        corr = r.get("correction")
        corr_cell = (
            f"{corr['is_weight_mean']:.3f} / {corr['is_weight_max']:.3f}, {corr.get('rejected_frac', 0.0):.3f}"
            if corr and "is_weight_mean" in corr
            else "-"
        )
        lines.append(
            f"| {r['objective']} | {r['zeroed']} | {r['zeroed_frac']:.3f} | {_f(r['zeroed_seq_frac'])} | "
            f"{_f(r['zeroed_mu_mean'])} | {_f(r['zeroed_low_mu_frac'])} | {_f(r['zeroed_entropy_excess'])} | "
            f"{r['mean_abs_weight']:.3g} | {corr_cell} |"
        )
    lines += ["", *[f"![replay](figures/{Path(f).name})" for f in doc["figures"]], ""]
    return "\n".join(lines)


def _ratio(n: int, k: int) -> float:
    return k / n if n else math.nan


def _f(x: float) -> str:
    return "-" if not np.isfinite(x) else f"{x:.3f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.replay", description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path, help="a run made with trainer.save_batches=[...]")
    p.add_argument("--out", type=Path, default=ROOT / "findings" / "replay")
    args = p.parse_args(argv)
    batches = load_batches(args.run_dir)
    tokens = replay(batches)
    doc = {"source": str(args.run_dir), "updates": len(batches), **summary(tokens)}
    doc["figures"] = draw(tokens, args.out / "figures")
    args.out.mkdir(parents=True, exist_ok=True)
    source = args.run_dir.resolve()
    shown = str(source.relative_to(ROOT)) if source.is_relative_to(ROOT) else str(source)
    (args.out / "replay.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    (args.out / "REPLAY.md").write_text(markdown(doc, shown), encoding="utf-8")
    print(f"replay: {args.out / 'REPLAY.md'} ({doc['tokens']} tokens, {len(OBJECTIVES)} objectives)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
