"""The step-1 mismatch health check. Before the first update the trainer's pi and the rollout engine's mu come from
the same weights, so what separates them is the setup: sampling settings that make the engine sample from a
distribution other than the one whose log-probs it reports (top-p/top-k/min-p under vLLM, huggingface/trl#6789),
a trust region anchored on a recompute where the rollout's mu was meant, or a precision gap between the rollout
copy and the trainer. After step 1 this reads three numbers off the step's metrics row and, when one passes its
limit, says so in one line naming those causes (or the dose the config asked for); every run's summary records
the numbers, the anchor, where mu came from and the sampling settings.

The importance ratio's mean is not logged on its own: over the same tokens, mean(pi/mu) = 1 + k3 - k1 exactly
(k3 = mean(r - 1 - log r), k1 = mean(-log r)), so it comes from the logged k1 and k3. Sampled from mu, its
expectation is 1 (the sum of pi over the vocabulary); a sampler that truncates the distribution moves it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from harness.config import RunConfig
from harness.rundir.files import read_jsonl

# Documented in docs/metrics.md ("step-1 health check"). Measured at step 1 on the tiny model (findings v7, seed
# 3100): fp32 HF with no dose k3 8e-14, W4A4 rollout copy k3 0.004 (under every limit), logit noise sigma 2 k3 0.39.
LIMITS = {"ratio_mean_gap": 0.05, "k3": 0.01, "abs_prob_diff_mean": 0.02}
CAUSES = (
    "sampling settings that change what the engine samples but not the log-probs it reports (top_p, top_k, min_p "
    "with vLLM)",
    "a trust region anchored on the trainer's recompute where the rollout's mu was meant",
    "a precision gap between the rollout copy and the trainer",
)


def mismatch_estimates(logp: torch.Tensor, mu_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """k1, k3 and mean |pi - mu| over the masked tokens, as 0-dim tensors (no host sync): what the adapters log and
    check, under the names the harness's own loop logs them (harness.loop.diagnostics)."""
    m = mask > 0
    n = m.sum().clamp(min=1)
    log_r = torch.where(m, logp.detach() - mu_logp, 0.0)
    diff = (logp.detach().exp() - mu_logp.exp()).abs()
    return {
        "mismatch/k1": (-log_r).sum() / n,
        "mismatch/k3": (torch.expm1(log_r) - log_r).sum() / n,
        "mismatch/abs_prob_diff_mean": torch.where(m, diff, 0.0).sum() / n,
    }


def step_one(row: Mapping[str, Any]) -> dict[str, float]:
    """|mean(pi/mu) - 1|, k3 and mean |pi - mu| from a step's metrics row (NaN where the row lacks them)."""

    def value(key: str) -> float:
        v = row.get(key)
        return float(v) if isinstance(v, int | float) else math.nan

    k1, k3 = value("mismatch/k1"), value("mismatch/k3")
    return {"ratio_mean_gap": abs(k3 - k1), "k3": k3, "abs_prob_diff_mean": value("mismatch/abs_prob_diff_mean")}


def check(
    row: Mapping[str, Any], expected: str | None = None, causes: tuple[str, ...] = CAUSES
) -> tuple[dict[str, Any], str | None]:
    """(record, warning line or None): the step-1 values, the limits, and which ones passed them. `expected` names
    a mismatch the run asked for (a logit-noise dose, a quantised rollout): the line then says so instead of
    guessing at causes."""
    values = step_one(row)
    over = [name for name, v in values.items() if math.isfinite(v) and v > LIMITS[name]]
    record = {"values": values, "limits": dict(LIMITS), "over": over, "expected": expected}
    if not over:
        return record, None
    shown = ", ".join(f"{name} {values[name]:.3g} > {LIMITS[name]:g}" for name in over)
    why = f"expected here: {expected}" if expected else "likely causes: " + "; ".join(causes)
    return record, f"health check after step 1: the training-inference mismatch is high ({shown}); {why}"


def run_context(cfg: RunConfig) -> dict[str, Any]:
    """What a reader needs to judge the mismatch numbers: the anchor, where mu came from, the sampling settings."""
    mu_from = "trainer (rollout.behavior=trainer)" if cfg.rollout.behavior == "trainer" else cfg.rollout.engine
    return {
        "anchor": cfg.objective.anchor,
        "mu_from": mu_from,
        "sampling": {"temperature": cfg.rollout.temperature, "top_p": 1.0, "top_k": None, "min_p": None},
        "precision": cfg.precision.name,
        "logit_noise": cfg.rollout.logit_noise,
    }


def expected_dose(cfg: RunConfig) -> str | None:
    """The mismatch a harness config injects on purpose, in its own keys; None when it injects none."""
    doses = []
    if cfg.rollout.logit_noise > 0:
        doses.append(f"rollout.logit_noise={cfg.rollout.logit_noise:g}")
    if cfg.precision.name != "fp32":  # a low-precision rollout copy (bf16 included) is the papers' mismatch
        doses.append(f"precision={cfg.precision.name}")
    return ", ".join(doses) or None


def summary_fields(cfg: RunConfig, run_dir: Path) -> dict[str, Any]:
    """summary.json's `behavior` (run_context) and `health`: the check of step 1's metrics row, read back from
    metrics.jsonl so that a resumed run has it too (None before step 1)."""
    path = run_dir / "metrics.jsonl"
    first = next((r for r in read_jsonl(path) if r["step"] == 1), None) if path.exists() else None
    return {"behavior": run_context(cfg), "health": check(first, expected_dose(cfg))[0] if first else None}
