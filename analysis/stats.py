"""Seed statistics and arm grouping shared by the figures and the tables.

An *arm* is one setting compared in an experiment (an objective, a precision, a delta, ...); its runs differ only
by seed. Arms are read from the config columns (dotted keys such as `objective.name`), never from metric keys
(`section/name`), so they need no list of experiments.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import stats

# Config keys that change between runs of one arm without changing what is compared.
_NOT_ARMS = (
    "seed",
    "name",
    "mode",
    "device",
    "trainer.resume",
    "trainer.threads",
    "model.cache_dir",
    "rollout.kv_cache_gb",
    "rollout.gpu_memory_utilization",
    "rollout.enforce_eager",
    "rollout.tensor_parallel_size",
)
_NOT_ARM_PREFIXES = ("logger.", "hydra.")
# Arms are labelled by these first, in this order; other varying keys follow alphabetically.
ARM_PRIORITY = ("objective.name", "precision.name")
_PLAIN_LABEL = {"objective.name", "precision.name"}


def t_critical(dof: int) -> float:
    """t_{0.975, dof}: the half-width multiplier of a two-sided 95% t-interval (dof >= 1)."""
    if dof < 1:
        raise ValueError(f"t_critical: dof must be >= 1, got {dof}")
    return float(stats.t.ppf(0.975, dof))


def mean_ci(wide: pd.DataFrame) -> pd.DataFrame:
    """Per row of `wide` (index: x, columns: runs): mean, n and the 95% t-interval over the non-NaN runs.

    Rows with a single run get lo = hi = NaN (no band): one seed says nothing about the spread.
    """
    n = wide.count(axis=1)
    mean = wide.mean(axis=1)
    sd = wide.std(axis=1, ddof=1)
    tcrit = n.map(lambda k: t_critical(int(k) - 1) if k >= 2 else math.nan)
    half = tcrit * sd / np.sqrt(n.where(n > 0))
    return pd.DataFrame({"mean": mean, "lo": mean - half, "hi": mean + half, "n": n})


def is_config_column(col: str) -> bool:
    """Config keys are dotted (`objective.delta`) or `seed`; metric keys are `section/name` or `avg@k`."""
    return col == "seed" or ("." in col and "/" not in col and "@" not in col)


def _as_key(s: pd.Series) -> pd.Series:
    return s.map(lambda v: "<missing>" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))


def arm_columns(df: pd.DataFrame, exclude: Sequence[str] = ()) -> list[str]:
    """The config columns that tell the arms of `df` apart (one row per run or per run and step).

    A column counts only if it splits the runs further than the ones already chosen, so `objective.family`
    (fixed by `objective.name`) and a preset's default `objective.delta` drop out, and it is not a relabelled
    seed. With a single arm the answer is `objective.name` (when present) so the one line still has a name.
    """
    if df.empty:
        return []
    runs = df.drop_duplicates("run") if "run" in df.columns else df
    skip = set(exclude) | set(_NOT_ARMS)
    cands = [c for c in runs.columns if is_config_column(c) and c not in skip and not c.startswith(_NOT_ARM_PREFIXES)]
    ordered = [c for c in ARM_PRIORITY if c in cands] + sorted(c for c in cands if c not in ARM_PRIORITY)
    keys = {c: _as_key(runs[c]) for c in ordered}
    seed = _as_key(runs["seed"]) if "seed" in runs.columns else None
    chosen: list[str] = []
    groups = 1
    for c in ordered:
        if seed is not None and _same_partition(keys[c], seed) and seed.nunique() > 1:
            continue
        n = pd.DataFrame({**{k: keys[k] for k in chosen}, c: keys[c]}).drop_duplicates().shape[0]
        if n > groups:
            chosen.append(c)
            groups = n
    if not chosen and "objective.name" in ordered and "objective.name" not in skip:
        chosen = ["objective.name"]
    return chosen


def _same_partition(a: pd.Series, b: pd.Series) -> bool:
    return a.nunique() == b.nunique() == pd.DataFrame({"a": a, "b": b}).drop_duplicates().shape[0]


def arm_labels(df: pd.DataFrame, arms: Sequence[str]) -> pd.Series:
    """A readable label per row: `dppo, bf16, delta=0.05` (objective and precision names bare)."""
    if not arms:
        return pd.Series("all runs", index=df.index)
    parts = [_as_key(df[c]) if c in _PLAIN_LABEL else c.rsplit(".", 1)[-1] + "=" + _as_key(df[c]) for c in arms]
    out = parts[0]
    for p in parts[1:]:
        out = out + ", " + p
    return out


def final_eval_scores(evals: pd.DataFrame, score: str) -> pd.DataFrame:
    """One row per run and benchmark: the score at the run's last evaluation (`final`) and its maximum (`best`).

    `best` includes the step-0 evaluation, as summary.json's best_score does.
    """
    ev = evals.dropna(subset=[score]).sort_values("step")
    keys = ["run", "benchmark"] if "benchmark" in ev.columns else ["run"]
    g = ev.groupby(keys, sort=True, dropna=False)[score]
    out = pd.DataFrame({"final": g.last(), "best": g.max(), "last_step": ev.groupby(keys, dropna=False)["step"].max()})
    return out.reset_index()


def score_column(evals: pd.DataFrame) -> str | None:
    """The headline eval score: the `avg@k` column with the most values (the papers' Avg@32 / avg@16)."""
    for prefix in ("avg@", "pass@"):
        cols = [c for c in evals.columns if c.startswith(prefix) and c[len(prefix) :].isdigit()]
        if cols:
            return max(cols, key=lambda c: (int(evals[c].notna().sum()), -int(c[len(prefix) :])))
    return None
