"""The mechanism map: for each mismatch model that moves with the policy, does a trust region rescue it?

    python -m analysis.mechanism_map                    # findings/map/mechanism.yaml: screen, then conclude
    python -m analysis.mechanism_map --phase screen     # the screening runs only (doses chosen from them)
    python -m analysis.mechanism_map --report-only      # MECHANISM.md and mechanism.json from the recorded rows

The map file (its header states every rule) names a base setting, two arms (no trust region, a trust region), the
dose-off setting and the models, each with doses (Hydra overrides). Screening runs every dose on a few seeds and
picks each model's dose by the file's calibration rule; the conclusion runs the chosen 2 x 2s (dose off / on x arm)
on the conclusion seeds, split into halves decided separately. A finished run's numbers are appended to
<folder>/mechanism/runs.csv at once: that file is the map's record (committed), so a map run in parts, on other
machines, resumes from it; run folders under <folder>/mechanism/runs/ are a cache the report never needs.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from analysis.run_metrics import QUARTER, load_run, run_error
from analysis.suite import Job, read_mapping, run_one
from analysis.testbed_map import _slug

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MAP = ROOT / "findings" / "map" / "mechanism.yaml"
KINDS = ("candidate", "staleness", "negative")
ARMS = ("none", "tr")
OFF = "off"  # the dose-off cell's name
BEYOND = (
    "run beyond the budget: the map's first code ran the staleness-only cell last, against the file's order, so "
    "this model's cells ran and that cell's were cut; it was run afterwards on the same seeds and rules"
)
CUT = "cut by the budget"  # a model's status when the preregistered budget left its conclusion cells out
ROW_KEYS = ("phase", "model", "dose", "arm", "seed")


@dataclass(frozen=True)
class Dose:
    model: str
    name: str
    overrides: tuple[str, ...]
    measure: str | None = None  # the dose whose runs measure this one's |pi - mu| (truncation with mu=full)
    screen_only: bool = False


@dataclass(frozen=True)
class Planned:
    phase: str  # "screen" | "conclude"
    model: str  # a model's name, or OFF
    dose: str
    arm: str
    seed: int
    overrides: tuple[str, ...]

    @property
    def key(self) -> tuple[str, str, str, str, int]:
        return (self.phase, self.model, self.dose, self.arm, self.seed)


class MapFile:
    """The map file, checked whole before any run: an unknown model kind, arm, dose or rule key is refused in one
    line naming it."""

    def __init__(self, path: Path) -> None:
        raw = read_mapping(path, "base, arms, dose_off, seeds, screening_seeds, calibration and models")
        where = f"error: {path}"
        for key in ("base", "arms", "dose_off", "seeds", "screening_seeds", "calibration", "models"):
            if key not in raw:
                raise SystemExit(f"{where}: missing key {key!r}")
        self.path = path
        self.base = [str(o) for o in raw["base"]]
        if sorted(raw["arms"]) != sorted(ARMS):
            raise SystemExit(f"{where}: arms: {sorted(raw['arms'])}; allowed: exactly {', '.join(ARMS)}")
        self.arms = {a: [str(o) for o in raw["arms"][a]] for a in ARMS}
        self.off = [str(o) for o in raw["dose_off"]]
        self.seeds = [int(s) for s in raw["seeds"]]
        self.screening_seeds = [int(s) for s in raw["screening_seeds"]]
        self.halves = int(raw.get("halves", 2))
        if self.halves < 1 or len(self.seeds) % self.halves or len(self.seeds) // self.halves < 8:
            raise SystemExit(f"{where}: seeds: {len(self.seeds)} do not split into {self.halves} halves of >= 8")
        if set(self.seeds) & set(self.screening_seeds):
            raise SystemExit(f"{where}: screening_seeds and seeds overlap: a screened run may not conclude")
        self.jobs = int(raw.get("jobs", 2))
        self.budget_min = float(raw.get("budget_min", 180))
        self.run_min = float(raw.get("run_min", 0.9))
        cal = dict(raw["calibration"])
        unknown = set(cal) - {"early_mismatch", "masked_below", "bad_update_at_most"}
        if unknown:
            raise SystemExit(f"{where}: calibration: unknown rule {sorted(unknown)[0]!r}")
        self.band = tuple(float(x) for x in cal["early_mismatch"])
        self.masked_below = float(cal["masked_below"])
        self.bad_at_most = float(cal["bad_update_at_most"])
        self.models: dict[str, dict[str, Any]] = {}
        self.doses: dict[str, dict[str, Dose]] = {}
        self.own_off: dict[str, tuple[str, ...] | None] = {}
        for name, spec in raw["models"].items():
            if spec.get("kind") not in KINDS:
                raise SystemExit(f"{where}: models.{name}.kind: {spec.get('kind')!r}; allowed: {', '.join(KINDS)}")
            if name == OFF:
                raise SystemExit(f"{where}: models.{OFF}: the name is the dose-off cell's")
            unknown = set(spec) - {"kind", "label", "emulates", "doses", "dose_off"}
            if unknown:
                raise SystemExit(f"{where}: models.{name}: unknown key {sorted(unknown)[0]!r}")
            if OFF in spec.get("doses", {}):
                raise SystemExit(f"{where}: models.{name}.doses.{OFF}: the name is the dose-off cell's")
            # A model on another setting (e.g. the MoE model) brings its own dose-off cell.
            self.own_off[name] = tuple(str(o) for o in spec["dose_off"]) if "dose_off" in spec else None
            self.models[name] = spec
            self.doses[name] = {}
            for dose, value in spec.get("doses", {}).items():
                value = {"overrides": value} if isinstance(value, list) else dict(value)
                bad = set(value) - {"overrides", "measure", "screen_only"}
                if bad:
                    raise SystemExit(f"{where}: models.{name}.doses.{dose}: unknown key {sorted(bad)[0]!r}")
                self.doses[name][str(dose)] = Dose(
                    name, str(dose), tuple(str(o) for o in value["overrides"]), value.get("measure"),
                    bool(value.get("screen_only", False)),
                )  # fmt: skip
            if not self.doses[name]:
                raise SystemExit(f"{where}: models.{name}: no doses")
            for d in self.doses[name].values():
                if d.measure is not None and d.measure not in self.doses[name]:
                    raise SystemExit(f"{where}: models.{name}.doses.{d.name}.measure: no dose {d.measure!r}")
        if sum(s["kind"] == "negative" for s in self.models.values()) != 1:
            raise SystemExit(f"{where}: models: exactly one model of kind negative (the negative control)")

    def check_settings(self) -> None:
        """Every setting the map can run composes and validates (a bad dose, e.g. rollout.top_p=2, is refused in
        one line naming the key), before any run."""
        from harness.config import compose, validate

        settings = {(n, d.name, d.overrides) for n in self.models for d in self.doses[n].values()}
        settings |= {(n, OFF, off) for n, off in self.own_off.items() if off is not None}
        for model, dose, overrides in sorted(settings | {(OFF, OFF, tuple(self.off))}):
            for arm in ARMS:
                try:
                    validate(compose(*self.overrides(overrides, arm, 0)))
                except Exception as e:  # Hydra's errors share no base class
                    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                    raise SystemExit(f"error: {self.path}: models.{model}.doses.{dose} ({arm}): {msg}") from None

    def half_of(self, seed: int) -> str:
        size = len(self.seeds) // self.halves
        return "ABCDEFGH"[self.seeds.index(seed) // size]

    def overrides(self, dose_overrides: list[str] | tuple[str, ...], arm: str, seed: int) -> tuple[str, ...]:
        return (*self.base, *self.arms[arm], *dose_overrides, f"seed={seed}")

    # --- the plan ---
    def screening(self) -> list[Planned]:
        # PG-IS (|pi - mu|, bad updates) on every screening seed, DPPO-TV (its masked share) on the first.
        def seeds(arm: str) -> list[int]:
            return self.screening_seeds if arm == "none" else self.screening_seeds[:1]

        out = [
            Planned("screen", OFF, OFF, arm, s, self.overrides(self.off, arm, s)) for arm in ARMS for s in seeds(arm)
        ]
        for name, spec in self.models.items():
            if spec["kind"] == "staleness":  # one dose, not calibrated: nothing to screen
                continue
            if (off := self.own_off[name]) is not None:
                out += [Planned("screen", name, OFF, a, s, self.overrides(off, a, s)) for a in ARMS for s in seeds(a)]
            for d in self.doses[name].values():
                for arm in ("none",) if d.screen_only else ARMS:
                    for s in seeds(arm):
                        out.append(Planned("screen", name, d.name, arm, s, self.overrides(d.overrides, arm, s)))
        return out

    def conclusions(self, chosen: dict[str, str | None]) -> list[Planned]:
        """The conclusion cells in the map file's budget order (dose off, staleness-only, negative control, then the
        candidates as listed), seed by seed within each cell so a map cut short keeps whole halves of the cells it
        reached."""
        order = [OFF] + [
            n for k in ("staleness", "negative", "candidate") for n, s in self.models.items() if s["kind"] == k
        ]
        out = []
        for name in order:
            if name == OFF:
                dose, overrides = OFF, self.off
            elif chosen.get(name) is None:
                continue
            else:
                dose = str(chosen[name])
                overrides = list(self.doses[name][dose].overrides)
                if (off := self.own_off[name]) is not None:
                    out += [
                        Planned("conclude", name, OFF, a, s, self.overrides(off, a, s))
                        for s in self.seeds
                        for a in ARMS
                    ]
            for s in self.seeds:
                for arm in ARMS:
                    out.append(Planned("conclude", name, dose, arm, s, self.overrides(overrides, arm, s)))
        return out


# --- one run's record ---------------------------------------------------------------------------------------


def _series(m: pd.DataFrame, key: str) -> np.ndarray:
    return pd.to_numeric(m[key], errors="coerce").to_numpy(float) if key in m.columns else np.array([])


def _quarter(x: np.ndarray, where: str) -> float:
    x = x[np.isfinite(x)]
    if not len(x):
        return math.nan
    k = max(1, int(round(len(x) * QUARTER)))
    return float((x[:k] if where == "early" else x[-k:]).mean())


def run_record(path: Path) -> dict[str, Any]:
    """The numbers the map reads from one finished run folder (everything the report needs: the folder is a cache)."""
    m, e = load_run(path)
    col = next((c for c in e.columns if c.startswith("avg@")), None)
    evals = pd.to_numeric(e[col], errors="coerce").dropna().to_numpy(float) if col else np.array([])
    reward = _series(m, "reward/mean")
    best = pd.Series(reward).rolling(10, min_periods=1).mean().max() if len(reward) else math.nan
    final = float(evals[-1]) if len(evals) else math.nan
    collapsed = bool(len(reward) and _quarter(reward, "late") < 0.5 * best)
    mm = _series(m, "mismatch/abs_prob_diff_mean")
    masked = _series(m, "objective/masked_frac")
    bad = _series(m, "mismatch/bad_update_frac")
    steps = np.arange(1, len(mm) + 1, dtype=float)
    ok = np.isfinite(mm)
    slope = float(np.polyfit(steps[ok], mm[ok], 1)[0]) if ok.sum() >= 3 else math.nan
    summary = json.loads((path / "summary.json").read_text(encoding="utf-8"))
    return {
        "final_eval": final, "initial_eval": float(evals[0]) if len(evals) else math.nan,
        "broke": float(collapsed or final < 0.10), "reward_auc": float(np.nanmean(reward)) if len(reward) else math.nan,
        "step1_mismatch": float(mm[0]) if len(mm) else math.nan, "early_mismatch": _quarter(mm, "early"),
        "late_mismatch": _quarter(mm, "late"), "mismatch_slope": slope,
        "max_mismatch": float(np.nanmax(_series(m, "mismatch/abs_prob_diff_max"))) if len(mm) else math.nan,
        "step1_masked": float(masked[0]) if len(masked) else 0.0, "early_masked": _quarter(masked, "early")
        if len(masked) else 0.0, "late_masked": _quarter(masked, "late") if len(masked) else 0.0,
        "bad_update": float(np.nanmean(bad)) if np.isfinite(bad).any() else math.nan,
        "early_bad_update": _quarter(bad, "early"), "late_bad_update": _quarter(bad, "late"),
        "late_entropy": _quarter(_series(m, "rollout/entropy"), "late"),
        "wall_s": float(summary.get("wall_time_s", math.nan)),
    }  # fmt: skip


# --- the record file ---------------------------------------------------------------------------------------------


def read_rows(path: Path) -> pd.DataFrame:
    return pd.read_csv(path) if path.exists() else pd.DataFrame(columns=[*ROW_KEYS, "status", "overrides"])


def recorded(rows: pd.DataFrame, p: Planned) -> bool:
    """Completed with exactly these overrides: an edited map file's cells run again."""
    if rows.empty:
        return False
    sel = rows[
        (rows["phase"] == p.phase) & (rows["model"] == p.model) & (rows["dose"].astype(str) == p.dose)
        & (rows["arm"] == p.arm) & (rows["seed"] == p.seed) & (rows["status"] == "completed")
    ]  # fmt: skip
    return bool(len(sel)) and (sel["overrides"] == " ".join(p.overrides)).any()


def write_row(path: Path, p: Planned, status: str, run_dir: Path) -> None:
    row: dict[str, Any] = {k: getattr(p, k) for k in ROW_KEYS}
    row.update(status=status, overrides=" ".join(p.overrides))
    if status == "completed":
        row.update(run_record(run_dir))
    else:
        row["error"] = run_error(run_dir)
    rows = read_rows(path)
    if len(rows):
        same = np.ones(len(rows), dtype=bool)
        for k in ROW_KEYS:
            same &= rows[k].astype(str).to_numpy() == str(row[k])
        rows = rows[~same]
    rows = pd.concat([rows, pd.DataFrame([row])], ignore_index=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows.sort_values(list(ROW_KEYS)).to_csv(path, index=False, float_format="%.6g")


def run_plan(plan: list[Planned], folder: Path, workers: int, label: str) -> None:
    record = folder / "runs.csv"
    rows = read_rows(record)
    todo = [p for p in plan if not recorded(rows, p)]
    print(f"mechanism map, {label}: {len(plan)} runs, {len(plan) - len(todo)} recorded, {len(todo)} to run", flush=True)
    jobs = {
        p: Job(f"{p.model}:{p.dose}:{p.arm}", p.seed, p.overrides,
               folder / "runs" / p.phase / p.model / _slug((p.dose, p.arm)) / f"seed{p.seed}")
        for p in todo
    }  # fmt: skip
    t0 = time.time()
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = {pool.submit(run_one, job): p for p, job in jobs.items()}
        for i, fut in enumerate(as_completed(futures), 1):
            p = futures[fut]
            job, status, secs = fut.result()
            write_row(record, p, status, job.run_dir)
            print(f"[{i}/{len(todo)}] {p.model} {p.dose} {p.arm} seed={p.seed} {status} in {secs / 60:.1f} min "
                  f"(elapsed {(time.time() - t0) / 60:.0f} min)", flush=True)  # fmt: skip


# --- calibration ------------------------------------------------------------------------------------------------


def screened(m: MapFile, rows: pd.DataFrame, model: str) -> bool:
    """Every screening run of the model (and of the dose-off cell) is recorded as completed."""
    return all(recorded(rows, p) for p in m.screening() if p.model in (model, OFF))


def calibration(m: MapFile, rows: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, str | None]]:
    """Per screened dose: its calibration numbers and whether it is calibrated; per model: the chosen dose."""
    done = rows[(rows["phase"] == "screen") & (rows["status"] == "completed")] if len(rows) else rows
    table, chosen = [], {}

    def arm_mean(model: str, dose: str, arm: str, col: str) -> float:
        sel = done[(done["model"] == model) & (done["dose"].astype(str) == dose) & (done["arm"] == arm)]
        return float(sel[col].mean()) if len(sel) else math.nan

    for name, spec in m.models.items():
        if spec["kind"] == "staleness":
            chosen[name] = next(iter(m.doses[name]))
            continue
        own_off = [Dose(name, OFF, m.own_off[name] or ())] if m.own_off[name] is not None else []
        for d in [*own_off, *m.doses[name].values()]:  # a model's own dose-off cell is shown, never chosen
            if d.screen_only:
                continue
            src = d.measure or d.name
            row = {
                "model": name, "dose": d.name, "measured_on": src,
                "step1_mismatch": arm_mean(name, src, "none", "step1_mismatch"),
                "early_mismatch": arm_mean(name, src, "none", "early_mismatch"),
                "late_mismatch": arm_mean(name, src, "none", "late_mismatch"),
                "masked_step1": arm_mean(name, d.name, "tr", "step1_masked"),
                "masked_early": arm_mean(name, d.name, "tr", "early_masked"),
                "bad_update": arm_mean(name, d.name, "none", "bad_update"),
                "final_none": arm_mean(name, d.name, "none", "final_eval"),
                "final_tr": arm_mean(name, d.name, "tr", "final_eval"),
            }  # fmt: skip
            lo, hi = m.band
            row["calibrated"] = d.name != OFF and bool(
                lo <= row["early_mismatch"] <= hi and row["masked_early"] < m.masked_below
                and row["bad_update"] <= m.bad_at_most
            )  # fmt: skip
            table.append(row)
    cal = pd.DataFrame(table)
    for name, spec in m.models.items():
        if spec["kind"] != "candidate":
            continue
        ok = cal[(cal["model"] == name) & cal["calibrated"]] if len(cal) else cal
        done_screening = screened(m, rows, name)
        chosen[name] = str(ok.sort_values("early_mismatch").iloc[-1]["dose"]) if len(ok) and done_screening else None
    targets = [float(cal[(cal["model"] == n) & (cal["dose"] == d)]["early_mismatch"].iloc[0])
               for n, d in chosen.items() if d is not None and m.models[n]["kind"] == "candidate"]  # fmt: skip
    neg = next(n for n, s in m.models.items() if s["kind"] == "negative")
    noise = cal[cal["model"] == neg] if len(cal) else cal
    every = all(screened(m, rows, n) for n, spec in m.models.items() if spec["kind"] != "staleness")
    if len(noise) and noise["early_mismatch"].notna().any() and every:
        if targets:
            goal = float(np.median(targets))
            chosen[neg] = str(noise.loc[(noise["early_mismatch"] - goal).abs().idxmin(), "dose"])
        else:
            chosen[neg] = str(noise.iloc[-1]["dose"])
    else:
        chosen[neg] = None
    return cal, chosen


# --- the rules ---------------------------------------------------------------------------------------------------


def contrast_interval(groups: list[np.ndarray], weights: list[float]) -> tuple[Any, Any, Any]:
    """sum w_i mean_i with a 95% Welch-Satterthwaite t interval (unequal variances and sizes), over the last axis:
    2-D groups give one interval per row (the coverage test's simulated experiments)."""
    groups = [np.asarray(g, dtype=float) for g in groups]
    if any(g.shape[-1] < 2 for g in groups):
        return math.nan, math.nan, math.nan
    est = sum(w * g.mean(axis=-1) for g, w in zip(groups, weights, strict=True))
    parts = [w * w * g.var(axis=-1, ddof=1) / g.shape[-1] for g, w in zip(groups, weights, strict=True)]
    se2 = sum(parts)
    with np.errstate(divide="ignore", invalid="ignore"):
        df = se2**2 / sum(p * p / (g.shape[-1] - 1) for p, g in zip(parts, groups, strict=True))
        half = stats.t.ppf(0.975, df) * np.sqrt(se2)
    half = np.where(se2 == 0, 0.0, half)  # no spread anywhere: the contrast is exact
    out = (est, est - half, est + half)
    return tuple(float(x) for x in out) if np.ndim(est) == 0 else out


def growth_coefficient(on: pd.DataFrame) -> tuple[float, float, float]:
    """Least squares growth ~ 1 + [PG-IS] + late entropy over the dose-on runs: the [PG-IS] coefficient and its
    95% t interval (classical standard errors)."""
    d = on.dropna(subset=["late_mismatch", "early_mismatch", "late_entropy"])
    if len(d) < 5 or d["arm"].nunique() < 2:
        return math.nan, math.nan, math.nan
    y = (d["late_mismatch"] - d["early_mismatch"]).to_numpy(float)
    x = np.column_stack([np.ones(len(d)), (d["arm"] == "none").to_numpy(float), d["late_entropy"].to_numpy(float)])
    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ beta
    dof = len(y) - x.shape[1]
    sigma2 = float(resid @ resid) / dof
    cov = sigma2 * np.linalg.pinv(x.T @ x)
    se = math.sqrt(max(cov[1, 1], 0.0))
    q = float(stats.t.ppf(0.975, dof))
    return float(beta[1]), float(beta[1] - q * se), float(beta[1] + q * se)


def decide_half(off: pd.DataFrame, on: pd.DataFrame) -> dict[str, Any]:
    """The three criteria for one half's 2 x 2 (final held-out accuracy), each with its numbers."""
    y = {
        (cell, arm): frame[frame["arm"] == arm]["final_eval"].dropna().to_numpy(float)
        for cell, frame in (("off", off), ("on", on)) for arm in ARMS
    }  # fmt: skip
    seeds = {f"{c}_{a}": len(v) for (c, a), v in y.items()}
    inter = contrast_interval([y["on", "tr"], y["on", "none"], y["off", "tr"], y["off", "none"]], [1, -1, -1, 1])
    harm = contrast_interval([y["off", "none"], y["on", "none"]], [1, -1])
    share = inter[0] / harm[0] if np.isfinite(harm[0]) and harm[0] > 0 else math.nan
    growth = growth_coefficient(on)
    checks = {
        "interaction": bool(np.isfinite(inter[1]) and inter[1] > 0),
        "recovered": bool(np.isfinite(share) and share >= 0.5),
        "mismatch_growth": bool(np.isfinite(growth[1]) and growth[1] > 0),
    }
    return {
        "seeds": seeds, "interaction": list(inter), "harm": list(harm), "recovered_share": share,
        "mismatch_growth": list(growth), "checks": checks, "positive_control": all(checks.values()),
        "means": {f"{c}_{a}": float(v.mean()) if len(v) else math.nan for (c, a), v in y.items()},
        "broke": {
            f"{c}_{a}": int(f[f["arm"] == a]["broke"].sum()) for c, f in (("off", off), ("on", on)) for a in ARMS
        },
        "cells": {f"{c}_{a}": cell_summary(f[f["arm"] == a]) for c, f in (("off", off), ("on", on)) for a in ARMS},
    }  # fmt: skip


CELL_COLUMNS = (
    "step1_mismatch", "late_mismatch", "mismatch_slope", "late_entropy", "early_masked", "late_masked",
    "early_bad_update", "late_bad_update",
)  # fmt: skip


def cell_summary(f: pd.DataFrame) -> dict[str, float]:
    """One cell of a half's 2 x 2: its seeds, final held-out mean and s.d., breaks, and the mechanism's measures
    (means over its runs)."""
    final = f["final_eval"].dropna().to_numpy(float)
    out = {
        "n": len(final), "final_mean": float(final.mean()) if len(final) else math.nan,
        "final_sd": float(final.std(ddof=1)) if len(final) > 1 else math.nan, "broke": int(f["broke"].sum()),
    }  # fmt: skip
    return out | {c: float(pd.to_numeric(f[c], errors="coerce").mean()) if c in f else math.nan for c in CELL_COLUMNS}


def conclude(m: MapFile, rows: pd.DataFrame, chosen: dict[str, str | None]) -> dict[str, Any]:
    """Per model: each half's criteria, the model's positive_control (both halves), and its one-line verdict."""
    done = rows[(rows["phase"] == "conclude") & (rows["status"] == "completed")] if len(rows) else rows
    size = len(m.seeds) // m.halves
    need = {f"{c}_{a}": size for c in ("off", "on") for a in ARMS}
    out: dict[str, Any] = {}
    for name, spec in m.models.items():
        entry: dict[str, Any] = {"kind": spec["kind"], "label": spec.get("label", name), "dose": chosen.get(name)}
        if chosen.get(name) is None:
            # The negative control's dose waits for every model's screening (it is matched to their doses).
            done_screening = all(screened(m, rows, n) for n in (m.models if spec["kind"] == "negative" else [name]))
            status = "not calibrated here" if done_screening else "screening incomplete"
            entry.update(positive_control=False, status=status, halves={}, shows_any=False)
            out[name] = entry
            continue
        halves = {}
        for h in range(m.halves):
            seeds = m.seeds[h * size : (h + 1) * size]
            own = m.own_off[name] is not None
            off = done[
                (done["model"] == (name if own else OFF)) & (done["dose"].astype(str) == OFF) & done["seed"].isin(seeds)
            ]
            on = done[(done["model"] == name) & (done["dose"].astype(str) == chosen[name]) & done["seed"].isin(seeds)]
            halves["ABCDEFGH"[h]] = decide_half(off, on)
        complete = all(v["seeds"] == need for v in halves.values())
        entry["halves"] = halves
        entry["status"] = "decided" if complete else "incomplete"
        entry["positive_control"] = complete and all(v["positive_control"] for v in halves.values())
        if spec["kind"] == "staleness":
            # (iii) reads 0 by construction here (mu = pi before every rollout), so the cell is a control for
            # staleness, not for mismatch: (i) and (ii) in both halves. Suite v8's claims on the form of a trust
            # region read this (written before the cell's runs finished, 2026-12-07 22:35).
            entry["staleness_control"] = complete and all(
                v["checks"]["interaction"] and v["checks"]["recovered"] for v in halves.values()
            )
        entry["shows_any"] = any(any(v["checks"].values()) for v in halves.values())
        out[name] = entry
    neg = next(n for n, s in m.models.items() if s["kind"] == "negative")
    clean = out[neg].get("status") == "decided" and not out[neg]["shows_any"]
    out[neg]["clean"] = clean
    if not clean:
        for name, entry in out.items():
            if m.models[name]["kind"] == "candidate" and entry["positive_control"]:
                entry["positive_control"] = False
                entry["withheld"] = f"the negative control ({neg}) is not clean"
    return out


def verdict_line(name: str, e: dict[str, Any]) -> str:
    if e["status"] == "not calibrated here":
        return f"- **{name}** ({e['label']}): not calibrated here: no dose met the calibration rule; no conclusion runs"
    if e["status"] == "screening incomplete":
        return f"- **{name}** ({e['label']}): screening incomplete: its dose is not chosen yet"
    if e["status"] == CUT:
        return (
            f"- **{name}** at {e['dose']} ({e['label']}): not concluded: cut by the budget the map file fixed before "
            "its runs (models cut from the end of its order); its dose-on cells were never run"
        )
    parts = []
    for h, v in e["halves"].items():
        i, g, share = v["interaction"], v["mismatch_growth"], v["recovered_share"]
        recovered = f"recovered {share:.2f} of" if np.isfinite(share) else "nothing to recover: the dose's"
        parts.append(
            f"half {h}: interaction {i[0]:+.3f} [{i[1]:+.3f}, {i[2]:+.3f}], {recovered} "
            f"harm {v['harm'][0]:+.3f}, PG-IS extra mismatch growth {g[0]:+.4f} [{g[1]:+.4f}, {g[2]:+.4f}] "
            f"({'/'.join(k for k, ok in v['checks'].items() if ok) or 'none of the three'})"
        )
    if e["status"] != "decided":
        got = "; ".join(
            f"half {h}: " + ", ".join(f"{k} {n}" for k, n in v["seeds"].items()) for h, v in e["halves"].items()
        )
        return f"- **{name}** at {e['dose']} ({e['label']}): incomplete, runs recorded per cell: {got}"
    elif e["kind"] == "negative":
        head = "clean: shows none of the three" if e.get("clean") else "NOT clean: shows a criterion"
    elif e["kind"] == "staleness":
        head = (
            "a control for staleness: interaction and recovered share in both halves"
            if e.get("staleness_control")
            else "not a control for staleness (interaction and recovered share do not both hold in both halves)"
        )
    else:
        head = "a positive control for the mechanism" if e["positive_control"] else "not a positive control"
        if e.get("withheld"):
            head += f" (withheld: {e['withheld']})"
    if e.get("beyond_budget"):
        head += f" ({e['beyond_budget']})"
    return f"- **{name}** at {e['dose']} ({e['label']}): {head}; " + "; ".join(parts)


def summary_line(m: MapFile, verdicts: dict[str, Any]) -> str:
    """Which candidates are positive controls; if none, that is the result, with what was tried."""
    candidates = [n for n in verdicts if m.models[n]["kind"] == "candidate"]
    if any(verdicts[n]["status"] not in ("decided", CUT, "not calibrated here") for n in candidates):
        return "The map is not complete: the lines above say which cells are missing."
    positive = [n for n in candidates if verdicts[n]["status"] == "decided" and verdicts[n]["positive_control"]]
    if positive:
        return f"Positive controls for the mechanism here: {', '.join(positive)} (both halves, all three criteria)."
    tried = "; ".join(
        f"{n} ({verdicts[n]['dose'] or 'no calibrated dose'}: {verdicts[n]['status']})"
        for n in candidates
    )  # fmt: skip
    return (
        "**No model is a positive control for the trust-region mechanism on this testbed** at the doses the "
        f"calibration rule chose. Tried: {tried}. A claim that needs one is *not testable here*."
    )


def cell_table(verdicts: dict[str, Any]) -> list[str]:
    """Every concluded model's 2 x 2, half by half: the cells' numbers the criteria rest on, and the mechanism's."""
    lines = [
        "## Every cell of the conclusions (both halves)",
        "",
        "Final held-out accuracy mean (s.d.), breaks, and the mechanism's measures as means over the cell's runs: "
        "step-1 and last-quarter mean |pi - mu|, its within-run slope per step, last-quarter entropy, DPPO-TV's "
        "masked share and the bad-update share (first / last quarter).",
        "",
        "| model | half | cell | seeds | final held-out | broke | step-1 / late \\|pi-mu\\| | slope | late entropy "
        "| masked first / last | bad updates first / last |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, e in verdicts.items():
        for h, v in e.get("halves", {}).items() if e["status"] == "decided" else ():
            for cell, c in v["cells"].items():
                lines.append(
                    f"| {name} | {h} | {cell.replace('_', ' / ')} | {c['n']} | {c['final_mean']:.3f} "
                    f"({c['final_sd']:.3f}) | {c['broke']} | {c['step1_mismatch']:.4f} / {c['late_mismatch']:.4f} | "
                    f"{c['mismatch_slope']:+.1e} | {c['late_entropy']:.3f} | {c['early_masked']:.4f} / "
                    f"{c['late_masked']:.4f} | {c['early_bad_update']:.4f} / {c['late_bad_update']:.4f} |"
                )
    return [*lines, ""]


# --- the report --------------------------------------------------------------------------------------------------

PAPERS = (
    "The papers' and the field's numbers: DPPO Fig. 3, mean |pi - mu| up to ~0.02 and rising for PG-IS before it "
    "collapses; the DPPO paper's bad updates <= 0.5%; Qwen2.5-0.5B under vLLM vs a BF16 trainer, per-token log-ratio "
    "s.d. 0.050 and 7.5% of tokens outside [0.9, 1.1] (TRL #6789); ~10% of MoE router decisions differing between "
    "engines (Megatron-LM #4168)."
)


def report(m: MapFile, folder: Path) -> dict[str, Any]:
    rows = read_rows(folder / "runs.csv")
    cal, chosen = calibration(m, rows)
    verdicts = conclude(m, rows, chosen)
    for name in budget_cut(m, m.conclusions(chosen))[1] if all(screened(m, rows, n) for n in m.models) else []:
        if verdicts[name]["status"] == "decided":
            # Map version 1's code ran its cells in another order than its file states, so a model the file's order
            # cuts may have all its runs: its verdict stands (the rules never read the order) and says so.
            verdicts[name]["beyond_budget"] = BEYOND
        else:
            verdicts[name].update(status=CUT, positive_control=False)
    wall = rows.loc[rows.get("status", pd.Series(dtype=str)) == "completed", "wall_s"] if len(rows) else []
    doc = {
        "map": str(m.path.relative_to(ROOT)) if m.path.is_relative_to(ROOT) else str(m.path),
        "chosen": chosen, "models": verdicts,
        "calibration": cal.to_dict(orient="records") if len(cal) else [],
        "runs": {"recorded": int((rows["status"] == "completed").sum()) if len(rows) else 0,
                 "mean_wall_s": float(np.mean(wall)) if len(wall) else None},
    }  # fmt: skip
    (folder.parent / "mechanism.json").write_text(json.dumps(doc, indent=1, default=_jsonable) + "\n", encoding="utf-8")
    lines = [
        "# The mechanism map",
        "",
        f"Written by `python -m analysis.mechanism_map` from `{doc['map']}` (its rules, doses and seeds were committed "
        "before any of its runs). Held-out accuracy is the policy's own, never sampled through the dose.",
        "",
        "## One line per model",
        "",
        *[verdict_line(n, e) for n, e in verdicts.items()],
        "",
        summary_line(m, verdicts),
        "",
        *cell_table(verdicts),
        "## Screening: each dose's calibration (screening seeds; no conclusion reads these)",
        "",
        PAPERS,
        "",
        "| model | dose | step-1 \\|pi-mu\\| | first-quarter \\|pi-mu\\| | last-quarter \\|pi-mu\\| | "
        "DPPO-TV masked, step 1 / first quarter | PG-IS bad updates | final held-out PG-IS / DPPO-TV | calibrated |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["calibration"]:
        measured = "" if r["measured_on"] == r["dose"] else f" (measured on {r['measured_on']})"
        lines.append(
            f"| {r['model']} | {r['dose']}{measured}"
            f" | {r['step1_mismatch']:.4f} | {r['early_mismatch']:.4f} | {r['late_mismatch']:.4f} | "
            f"{r['masked_step1']:.4f} / {r['masked_early']:.4f} | {r['bad_update']:.4f} | "
            f"{r['final_none']:.3f} / {r['final_tr']:.3f} | {_calibrated(m, r)} |"
        )
    lines += ["", f"Chosen doses: {', '.join(f'{k} {v}' for k, v in chosen.items())}.", ""]
    lines.append(
        f"{doc['runs']['recorded']} runs recorded in mechanism/runs.csv"
        + (f"; mean run time {doc['runs']['mean_wall_s'] / 60:.1f} min on one thread." if doc["runs"]["mean_wall_s"]
           else ".")
    )  # fmt: skip
    (folder.parent / "MECHANISM.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return doc


def _calibrated(m: MapFile, r: dict[str, Any]) -> str:
    # The negative control is matched on early |pi - mu| to the chosen doses, not calibrated by the band.
    if r["dose"] == OFF:
        return "(its dose off)"
    if m.models[r["model"]]["kind"] == "negative":
        return "(matched, not calibrated)"
    return "yes" if r["calibrated"] else "no"


def _jsonable(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(type(x))


def budget_cut(m: MapFile, plan: list[Planned]) -> tuple[list[Planned], list[str]]:
    """The conclusion plan that fits the budget after the screening, at the map file's preregistered minutes per
    run (two at a time), whatever else shared the cores: models cut from the end of the order, never seeds; and
    the models cut. A fixed cost, so the plan is the same on every machine and in every part of a resumed map."""
    left = m.budget_min - len(m.screening()) * m.run_min
    kept, cut = [], []
    for name in dict.fromkeys(p.model for p in plan):
        cells = [p for p in plan if p.model == name]
        cost = len(cells) * m.run_min
        if cost <= left or name == OFF:
            kept += cells
            left -= cost
        else:
            cut.append(name)
    return kept, cut


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.mechanism_map", description=__doc__.splitlines()[0])
    p.add_argument("--map", type=Path, default=DEFAULT_MAP)
    p.add_argument("--phase", choices=("screen", "conclude", "all"), default="all")
    p.add_argument("--jobs", type=int, default=None, help="parallel one-thread runs (default: the map file's)")
    p.add_argument("--report-only", action="store_true", help="no runs: the report from the recorded rows")
    args = p.parse_args(argv)
    m = MapFile(args.map)
    if not args.report_only:
        m.check_settings()
    folder = m.path.parent / "mechanism"
    workers = args.jobs or m.jobs
    if not args.report_only and args.phase in ("screen", "all"):
        run_plan(m.screening(), folder, workers, "screening")
    if not args.report_only and args.phase in ("conclude", "all"):
        rows = read_rows(folder / "runs.csv")
        _, chosen = calibration(m, rows)
        screened = rows[rows["phase"] == "screen"] if len(rows) else rows
        if len(screened) < len(m.screening()) or (screened["status"] != "completed").any():
            raise SystemExit("error: --phase conclude: the screening is not complete; run --phase screen first")
        plan, cut = budget_cut(m, m.conclusions(chosen))
        if cut:
            print(f"mechanism map: cut for the {m.budget_min:.0f} min budget: {', '.join(cut)}", flush=True)
        run_plan(plan, folder, workers, "conclusions")
    doc = report(m, folder)
    print(f"mechanism map: {folder.parent / 'MECHANISM.md'}; chosen doses {doc['chosen']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
