"""Per-run numbers of a findings run: each metric a claim's rule can read (the last-quarter reward, the final
held-out accuracy, whether the run broke, ...) from its metrics.jsonl and eval.jsonl, and the run's error."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.rundir.files import read_jsonl

QUARTER = 0.25  # "early" / "late": the first / last quarter of the steps
COLLAPSE_FRACTION = 0.5  # collapsed: late reward below half the run's best 10-step mean reward
# A run "broke" when it collapsed by training reward or its held-out accuracy ended below this (the warm start scores
# ~0.25): the calibrations' "failed" (findings/CALIBRATION.md section 8), which also catches a collapse in the last
# steps that the late-quarter `collapsed` metric misses. Suite v5's rules do not read it; the `broke` metric (a rate,
# replication R3) does.
BROKEN_EVAL = 0.10


def _series(m: pd.DataFrame, key: str) -> pd.Series:
    return pd.to_numeric(m[key], errors="coerce").dropna() if key in m.columns else pd.Series(dtype=float)


def _window(m: pd.DataFrame, key: str, where: str) -> float:
    s = _series(m, key)
    if s.empty:
        return math.nan
    k = max(1, int(round(len(s) * QUARTER)))
    return float((s.iloc[:k] if where == "early" else s.iloc[-k:]).mean())


def _final_eval(m: pd.DataFrame, e: pd.DataFrame) -> float:
    col = next((c for c in e.columns if c.startswith("avg@")), None)
    return float(e[col].dropna().iloc[-1]) if col and e[col].notna().any() else math.nan


def _collapsed(m: pd.DataFrame, e: pd.DataFrame) -> float:
    r = _series(m, "reward/mean")
    if r.empty:
        return math.nan
    best = float(r.rolling(10, min_periods=1).mean().max())
    return float(_window(m, "reward/mean", "late") < COLLAPSE_FRACTION * best)


def _broke(m: pd.DataFrame, e: pd.DataFrame) -> float:
    collapsed, final = _collapsed(m, e), _final_eval(m, e)
    if math.isnan(collapsed) or math.isnan(final):
        return math.nan
    return float(collapsed == 1.0 or final < BROKEN_EVAL)


def _numeric(m: pd.DataFrame, cols: list[str]) -> np.ndarray:
    """The columns as floats: a key logged as null on some steps (JSON has no NaN) reads as an object column of
    None, which numpy cannot average."""
    return m[cols].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)


def _clipped_mu(m: pd.DataFrame, e: pd.DataFrame) -> float:
    cols = [c for c in ("objective/clipped_mu_mean_pos", "objective/clipped_mu_mean_neg") if c in m.columns]
    values = _numeric(m, cols)
    return float(np.nanmean(values)) if cols and np.isfinite(values).any() else math.nan


def _clipped_mu_side(sign: str) -> Callable[[pd.DataFrame, pd.DataFrame], float]:
    """Mean over steps of the mean mu of one sign's clipped tokens (upper clips, A > 0; lower, A < 0), apart."""

    def metric(m: pd.DataFrame, e: pd.DataFrame) -> float:
        col = f"objective/clipped_mu_mean_{sign}"
        values = _numeric(m, [col]) if col in m.columns else np.array([])
        return float(np.nanmean(values)) if np.isfinite(values).any() else math.nan

    return metric


def _clipped_entropy_excess(m: pd.DataFrame, e: pd.DataFrame) -> float:
    cols = [c for c in ("objective/clipped_entropy_mean_pos", "objective/clipped_entropy_mean_neg") if c in m.columns]
    values = _numeric(m, cols)
    if not cols or "rollout/entropy" not in m.columns or not np.isfinite(values).any():
        return math.nan
    return float(np.nanmean(values) - np.nanmean(_numeric(m, ["rollout/entropy"])))


def _lowmu_enrichment(sign: str) -> Callable[[pd.DataFrame, pd.DataFrame], float]:
    """Share of mu < 0.1 among the clipped tokens of one sign of A over their share among all its tokens, on the
    steps that clipped any (harness.loop.diagnostics.LOW_MU): > 1 where clipping falls on low-mu tokens more than
    their frequency (DPPO §6). By sign, since the upper (A > 0) and lower (A < 0) clips hit different tokens."""

    def metric(m: pd.DataFrame, e: pd.DataFrame) -> float:
        cols = [f"objective/clipped_lowmu_frac_{sign}", f"objective/lowmu_frac_{sign}"]
        if not set(cols) <= set(m.columns):
            return math.nan
        v = _numeric(m, cols)
        v = v[np.isfinite(v).all(axis=1)]
        return float(v[:, 0].mean() / v[:, 1].mean()) if len(v) and v[:, 1].mean() > 0 else math.nan

    return metric


def _mismatch_slope(given_entropy: bool) -> Callable[[pd.DataFrame, pd.DataFrame], float]:
    """The within-run least-squares slope of mean |pi - mu| per 100 steps; with `given_entropy` the step
    coefficient of |pi - mu| ~ 1 + step + entropy, so a mismatch that rises only because entropy rises (v7's
    late_mismatch tracked late entropy at r = 0.87) does not count as growth."""

    def metric(m: pd.DataFrame, e: pd.DataFrame) -> float:
        cols = ["step", "mismatch/abs_prob_diff_mean", "rollout/entropy"]
        if not set(cols) <= set(m.columns):
            return math.nan
        v = _numeric(m, cols)
        v = v[np.isfinite(v).all(axis=1)]
        if len(v) < 4:
            return math.nan
        x = np.column_stack([np.ones(len(v)), v[:, 0] / 100.0, *([v[:, 2]] if given_entropy else [])])
        return float(np.linalg.lstsq(x, v[:, 1], rcond=None)[0][1])

    return metric


def _step1(key: str) -> Callable[[pd.DataFrame, pd.DataFrame], float]:
    def metric(m: pd.DataFrame, e: pd.DataFrame) -> float:
        s = _series(m, key)
        return float(s.iloc[0]) if len(s) else math.nan

    return metric


# Per-run numbers a claim can compare: (metrics.jsonl frame, eval.jsonl frame) -> float.
METRICS: dict[str, tuple[Callable[[pd.DataFrame, pd.DataFrame], float], str]] = {
    "final_eval": (_final_eval, "held-out accuracy at the last evaluation"),
    "eval_gain": (
        lambda m, e: (
            _final_eval(m, e) - float(e[[c for c in e.columns if c.startswith("avg@")][0]].iloc[0])
            if len(e)
            else math.nan
        ),
        "held-out accuracy, last evaluation minus step 0",
    ),
    "reward_auc": (lambda m, e: float(_series(m, "reward/mean").mean()), "mean training reward over all steps"),
    "early_reward": (lambda m, e: _window(m, "reward/mean", "early"), "mean training reward, first quarter"),
    "late_reward": (lambda m, e: _window(m, "reward/mean", "late"), "mean training reward, last quarter"),
    "collapsed": (_collapsed, f"1 if the last quarter's reward < {COLLAPSE_FRACTION} x the best 10-step mean"),
    "broke": (_broke, f"1 if the run broke: `collapsed`, or final held-out below {BROKEN_EVAL:g}"),
    "late_mismatch": (
        lambda m, e: _window(m, "mismatch/abs_prob_diff_mean", "late"),
        "mean |pi - mu| before the update, last quarter",
    ),
    "late_entropy": (lambda m, e: _window(m, "rollout/entropy", "late"), "policy entropy, last quarter"),
    "clipped_mu": (_clipped_mu, "mean rollout probability mu of masked/clipped tokens"),
    "clipped_mu_pos": (_clipped_mu_side("pos"), "mean rollout probability mu of A > 0 clipped tokens"),
    "clipped_mu_neg": (_clipped_mu_side("neg"), "mean rollout probability mu of A < 0 clipped tokens"),
    "clipped_entropy_excess": (_clipped_entropy_excess, "entropy of clipped tokens minus mean token entropy"),
    "bad_update_frac": (
        lambda m, e: float(_series(m, "mismatch/bad_update_frac").mean()),
        "share of bad updates (Fig. 5)",
    ),
    "early_bad_update_frac": (
        lambda m, e: _window(m, "mismatch/bad_update_frac", "early"),
        "share of bad updates, first quarter",
    ),
    "late_bad_update_frac": (
        lambda m, e: _window(m, "mismatch/bad_update_frac", "late"),
        "share of bad updates, last quarter",
    ),
    "step1_mismatch": (_step1("mismatch/abs_prob_diff_mean"), "mean |pi - mu| at step 1"),
    "step1_masked_frac": (_step1("objective/masked_frac"), "share of tokens the trust region masked at step 1"),
    "step1_penalized_frac": (
        _step1("objective/penalized_frac"),
        "share of tokens beyond DRPO's boundary (its regulariser fires) at step 1",
    ),
    "early_masked_frac": (lambda m, e: _window(m, "objective/masked_frac", "early"), "masked share, first quarter"),
    "late_masked_frac": (lambda m, e: _window(m, "objective/masked_frac", "late"), "masked share, last quarter"),
    "mismatch_slope": (_mismatch_slope(False), "within-run slope of mean |pi - mu| per 100 steps"),
    "mismatch_slope_given_entropy": (
        _mismatch_slope(True),
        "within-run slope of mean |pi - mu| per 100 steps, entropy held fixed (|pi-mu| ~ 1 + step + entropy)",
    ),
    "lowmu_enrichment_pos": (_lowmu_enrichment("pos"), "share of mu < 0.1 among A > 0 clipped tokens / among all"),
    "lowmu_enrichment_neg": (_lowmu_enrichment("neg"), "share of mu < 0.1 among A < 0 clipped tokens / among all"),
}


def run_broke(m: pd.DataFrame, e: pd.DataFrame) -> bool:
    """Whether one run broke (`collapsed`, or final held-out below BROKEN_EVAL): the arms table's column, per run,
    for the calibration scripts that read run folders one at a time."""
    return _broke(m, e) == 1.0


def load_run(run_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(metrics, eval) frames of one run. A key logged as null on some steps (JSON has no NaN) would read as an
    object column of None, which neither numpy nor matplotlib takes: such columns become floats with NaN."""

    def frame(name: str) -> pd.DataFrame:
        path = run_dir / name
        df = pd.DataFrame(read_jsonl(path)) if path.exists() else pd.DataFrame()
        for col in df.select_dtypes(include="object").columns:
            values = df[col].dropna()
            if len(values) < len(df[col]) and all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in values
            ):
                df[col] = df[col].astype(float)
        return df

    return frame("metrics.jsonl"), frame("eval.jsonl")


def run_error(run_dir: Path) -> str:
    """The run's recorded error; a run refused before its directory existed (a bad override) has none, so the
    last line of its console log (runs/<arm>/seed<k>.log, written by the suite) says why."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
        return str(summary.get("error") or "no error recorded")
    except (OSError, ValueError):
        pass
    try:
        log = (run_dir.parent / f"{run_dir.name}.log").read_text(encoding="utf-8", errors="replace")
        last = [line for line in log.splitlines() if line.strip()][-1:]
    except OSError:
        last = []
    return f"no summary.json; its log ends: {last[0].strip()}" if last else "the run left no summary.json"


def runs_time_s(jobs: Sequence[Any], status: dict[Any, str]) -> float:
    """The completed runs' own wall times (summary.json), summed: the suite's cost whatever pass ran them."""
    total = 0.0
    for job in jobs:
        if status.get(job) != "completed":
            continue
        try:
            total += float(json.loads((job.run_dir / "summary.json").read_text(encoding="utf-8"))["wall_time_s"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a run without its summary's time counts nothing rather than failing the report
    return total
