"""The testbed map: where on this testbed the mechanism the papers study shows itself.

    python -m analysis.testbed_map                  # findings/map/map.yaml: every run, then the map
    python -m analysis.testbed_map --report-only    # the map from the runs already on disk

The map file holds a base setting, the objectives compared, and dose-response sweeps: each dose is a list of Hydra
overrides, each (dose, objective) cell runs the first n of the file's seeds. Runs are the findings suite's
(`analysis.suite.run_jobs`): `run.py` processes, `jobs` at a time with one thread each, in
<map folder>/runs/<objective>/<dose overrides>/seed<k>; a completed run is not run again, so an interrupted map
resumes, and two doses with the same overrides share their runs. Conclusion cells run first, seed by seed.

The report (MAP.md, map.json, cells.csv, figures/) gives per cell the break rate (Wilson interval), the mean final
held-out accuracy (t interval), held-out change from step 0, and the measured mismatch, then one line per mechanism
decided by the file's rules: the lowest dose at which PG-IS is significantly worse than at the reference dose, and
the lowest staleness at which a trust region is significantly better than none (Welch t tests, Holm over doses).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from analysis.run_metrics import METRICS, load_run, run_error, runs_time_s
from analysis.suite import Job, disk_status, read_mapping, run_jobs
from analysis.verdicts import holm, mean_difference_interval, rate_difference_interval

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MAP = ROOT / "findings" / "map" / "map.yaml"
RULE_METRICS = ("final_eval", "eval_gain", "reward_auc")


@dataclass(frozen=True)
class Cell:
    sweep: str
    dose: str
    objective: str
    overrides: tuple[str, ...]  # base + objective + dose
    seeds: tuple[int, ...]
    conclusive: bool  # a rule reads this cell (>= its min_seeds), not screening only

    @property
    def key(self) -> str:
        """The run folder of the cell's setting: the objective, then the dose's overrides (doses of two sweeps with
        the same overrides share their runs)."""
        return f"{self.objective}/{_slug(self.dose_overrides)}"

    @property
    def dose_overrides(self) -> tuple[str, ...]:
        return self.overrides[-self._n_dose :] if self._n_dose else ()

    _n_dose: int = 0


def _slug(overrides: tuple[str, ...]) -> str:
    # Hydra's override grammar reads `=` and `,` in hydra.run.dir's value: the folder name has neither.
    text = "__".join(o.replace("=", "-") for o in sorted(overrides))
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text) or "base"


@dataclass
class Map:
    path: Path
    base: list[str]
    objectives: dict[str, list[str]]
    seeds: list[int]
    sweeps: dict[str, dict[str, Any]]
    rules: dict[str, dict[str, Any]]
    jobs: int = 2

    @classmethod
    def load(cls, path: Path) -> Map:
        """Read and check the map file: every name a rule or sweep uses must exist, before any run."""
        raw = read_mapping(path, "base, objectives, seeds, sweeps and rules")
        missing = [k for k in ("base", "objectives", "seeds", "sweeps", "rules") if k not in raw]
        if missing:
            raise SystemExit(f"error: {path}: missing key(s) {', '.join(missing)}")
        m = cls(
            path, list(raw["base"]), {k: list(v) for k, v in raw["objectives"].items()}, [int(s) for s in raw["seeds"]],
            dict(raw["sweeps"]), dict(raw["rules"]), int(raw.get("jobs", 2)),
        )  # fmt: skip
        for name, sweep in m.sweeps.items():
            where = f"error: {path}: sweeps.{name}"
            for key in ("doses", "seeds", "reference"):
                if key not in sweep:
                    raise SystemExit(f"{where}: missing key {key!r}")
            if str(sweep["reference"]) not in sweep["doses"]:
                raise SystemExit(f"{where}.reference: {sweep['reference']!r} is not one of its doses")
            for obj, n in sweep["seeds"].items():
                if obj not in m.objectives:
                    raise SystemExit(f"{where}.seeds: {obj!r} is not an objective; allowed: {', '.join(m.objectives)}")
                if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= len(m.seeds):
                    raise SystemExit(f"{where}.seeds.{obj}: {n!r}; allowed: a whole number 1 to {len(m.seeds)}")
            for dose in sweep.get("screening_seeds", {}):
                if str(dose) not in sweep["doses"]:
                    raise SystemExit(f"{where}.screening_seeds: {dose!r} is not one of its doses")
        for name, rule in m.rules.items():
            where = f"error: {path}: rules.{name}"
            if name not in m.sweeps:
                raise SystemExit(f"{where}: no sweep of that name; sweeps: {', '.join(m.sweeps)}")
            for key in ("objective", "a", "b"):
                if key in rule and rule[key] not in m.objectives:
                    raise SystemExit(f"{where}.{key}: {rule[key]!r} is not an objective")
            if rule.get("metric") not in RULE_METRICS:
                raise SystemExit(f"{where}.metric: {rule.get('metric')!r}; allowed: {', '.join(RULE_METRICS)}")
            if ("objective" in rule) == ("a" in rule and "b" in rule):
                raise SystemExit(f"{where}: give either `objective` (a dose vs the reference) or `a` and `b`")
        return m

    def cells(self) -> list[Cell]:
        out = []
        for name, sweep in self.sweeps.items():
            rule = self.rules.get(name, {})
            need = int(rule.get("min_seeds", 8))
            for dose, dose_over in sweep["doses"].items():
                cap = sweep.get("screening_seeds", {}).get(dose)
                for obj, n in sweep["seeds"].items():
                    k = min(n, cap) if cap is not None else n
                    reads = obj in (rule.get("objective"), rule.get("a"), rule.get("b"))
                    cell = Cell(
                        name, str(dose), obj, (*self.base, *self.objectives[obj], *dose_over),
                        tuple(self.seeds[:k]), reads and k >= need, len(dose_over),
                    )  # fmt: skip
                    out.append(cell)
        return out

    def jobs_for(self, cells: list[Cell], runs: Path) -> list[Job]:
        """One job per (setting, seed), conclusion cells first, then seed by seed: a map cut short keeps whole
        seeds of the cells its lines rest on."""
        by_dir: dict[Path, tuple[tuple[int, int, int], Job]] = {}
        for order, cell in enumerate(cells):
            for i, seed in enumerate(cell.seeds):
                run_dir = runs / cell.key / f"seed{seed}"
                job = Job(
                    f"{cell.objective}@{cell.sweep}:{cell.dose}", seed, (*cell.overrides, f"seed={seed}"), run_dir
                )
                rank = (0 if cell.conclusive else 1, i, order)
                if run_dir not in by_dir or rank < by_dir[run_dir][0]:
                    by_dir[run_dir] = (rank, job)
        return [job for _, job in sorted(by_dir.values(), key=lambda t: t[0])]


def run_dir(runs: Path, cell: Cell, seed: int) -> Path:
    return runs / cell.key / f"seed{seed}"


# --- per run ---------------------------------------------------------------------------------------------------


def run_row(cell: Cell, seed: int, path: Path, status: str) -> dict[str, Any]:
    row: dict[str, Any] = {
        "sweep": cell.sweep, "dose": cell.dose, "objective": cell.objective, "seed": seed, "status": status,
        "run": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
    }  # fmt: skip
    if status != "completed":
        row["error"] = run_error(path) if status == "failed" else ""
        return row
    m, e = load_run(path)
    for name in ("final_eval", "eval_gain", "reward_auc", "collapsed", "broke", "late_mismatch"):
        row[name] = METRICS[name][0](m, e)
    row["initial_eval"] = row["final_eval"] - row["eval_gain"]
    for key, col in (("mismatch_mean", "mismatch/abs_prob_diff_mean"), ("mismatch_max", "mismatch/abs_prob_diff_max")):
        s = pd.to_numeric(m[col], errors="coerce") if col in m.columns else pd.Series(dtype=float)
        row[f"step1_{key}"] = float(s.iloc[0]) if len(s) else math.nan
        late = s.iloc[-max(1, len(s) // 4) :]
        row[f"late_{key}"] = float(late.mean() if key == "mismatch_mean" else late.max()) if len(s) else math.nan
    return row


# --- per cell ------------------------------------------------------------------------------------------------


def t_interval(x: np.ndarray) -> tuple[float, float]:
    if len(x) < 2 or np.ptp(x) == 0:
        v = float(x.mean()) if len(x) else math.nan
        return (v, v) if len(x) >= 2 else (math.nan, math.nan)
    ci = stats.ttest_1samp(x, 0.0).confidence_interval(0.95)
    return float(ci.low), float(ci.high)


def cell_row(cell: Cell, runs: pd.DataFrame) -> dict[str, Any]:
    mine = runs[(runs["sweep"] == cell.sweep) & (runs["dose"] == cell.dose) & (runs["objective"] == cell.objective)]
    done = mine[mine["status"] == "completed"] if len(mine) else mine
    n = len(done)
    row: dict[str, Any] = {
        "sweep": cell.sweep, "dose": cell.dose, "objective": cell.objective, "planned": len(cell.seeds), "seeds": n,
        "failed": int((mine["status"] == "failed").sum()) if len(mine) else 0,
        "kind": "conclusion" if cell.conclusive else "screening",
    }  # fmt: skip
    if n == 0:
        return row
    final = done["final_eval"].to_numpy(float)
    broke = done["broke"].to_numpy(float)
    lo, hi = t_interval(final)
    wilson = stats.binomtest(int(np.nansum(broke)), n).proportion_ci(method="wilson")
    row.update(
        final_eval=float(final.mean()), final_lo=lo, final_hi=hi, eval_gain=float(done["eval_gain"].mean()),
        broke=int(np.nansum(broke)), broke_lo=float(wilson.low), broke_hi=float(wilson.high),
        reward_auc=float(done["reward_auc"].mean()),
        step1_mismatch_mean=float(done["step1_mismatch_mean"].mean()),
        step1_mismatch_max=float(done["step1_mismatch_max"].max()),
        late_mismatch_mean=float(done["late_mismatch_mean"].mean()),
        late_mismatch_max=float(done["late_mismatch_max"].max()),
    )  # fmt: skip
    return row


# --- the lines -------------------------------------------------------------------------------------------------


def _values(runs: pd.DataFrame, sweep: str, dose: str, objective: str, metric: str) -> np.ndarray:
    sel = runs[(runs["sweep"] == sweep) & (runs["dose"] == dose) & (runs["objective"] == objective)]
    sel = sel[sel["status"] == "completed"] if len(sel) else sel
    return sel[metric].to_numpy(float) if len(sel) else np.array([])


def tests_for(m: Map, sweep_name: str, runs: pd.DataFrame) -> list[dict[str, Any]]:
    """The rule's comparisons over a sweep's doses, in order, with Welch intervals and Holm-adjusted p-values.
    A dose-vs-reference rule (`objective`) asks for a *lower* score at the dose; an `a` vs `b` rule for a
    *higher* score of a."""
    sweep, rule = m.sweeps[sweep_name], m.rules[sweep_name]
    need, metric = int(rule.get("min_seeds", 8)), rule["metric"]
    ref = str(sweep["reference"])
    rows = []
    for dose in sweep["doses"]:
        if "objective" in rule:
            if dose == ref:
                continue
            a = _values(runs, sweep_name, dose, rule["objective"], metric)
            b = _values(runs, sweep_name, ref, rule["objective"], metric)
            alternative = "less"
        else:
            a = _values(runs, sweep_name, dose, rule["a"], metric)
            b = _values(runs, sweep_name, dose, rule["b"], metric)
            alternative = "greater"
        row: dict[str, Any] = {"dose": dose, "seeds": [len(a), len(b)], "tested": min(len(a), len(b)) >= need}
        if min(len(a), len(b)) >= 2:
            effect, lo, hi = mean_difference_interval(a, b)
            p = float(stats.ttest_ind(a, b, equal_var=False, alternative=alternative).pvalue)
            row.update(effect=effect, ci_low=lo, ci_high=hi, p=p if np.isfinite(p) else 1.0)
        rows.append(row)
    tested = [r for r in rows if r["tested"] and "p" in r]
    for r, adj in zip(tested, holm([r["p"] for r in tested]), strict=True):
        r["p_holm"] = adj
        r["significant"] = bool(adj < 0.05)
    return rows


def conclusion(m: Map, sweep_name: str, runs: pd.DataFrame, cells: pd.DataFrame) -> dict[str, Any]:
    sweep, rule = m.sweeps[sweep_name], m.rules[sweep_name]
    tests = tests_for(m, sweep_name, runs)
    hit = next((t for t in tests if t.get("significant")), None)
    largest = list(sweep["doses"])[-1]
    untested = [t["dose"] for t in tests if not t["tested"]]
    if "objective" in rule:
        what = f"{rule['objective']} significantly worse ({rule['metric']}) than at {sweep['reference']}"
    else:
        what = f"{rule['a']} significantly better ({rule['metric']}) than {rule['b']}"
    if hit is None:
        line = f"{sweep_name}: none up to {largest}: no dose tested shows {what}"
    else:
        line = (
            f"{sweep_name}: {hit['dose']} is the lowest dose at which {what}: {hit['effect']:+.3f} "
            f"[{hit['ci_low']:+.3f}, {hit['ci_high']:+.3f}], Holm p {hit['p_holm']:.3g}, seeds {hit['seeds'][0]}/"
            f"{hit['seeds'][1]}"
        )
        line += _context(m, sweep_name, hit["dose"], runs, cells)
    if untested:
        line += f" (not tested for want of seeds: {', '.join(untested)})"
    return {"sweep": sweep_name, "line": line, "dose": hit["dose"] if hit else None, "largest": largest, "tests": tests}


def _context(m: Map, sweep_name: str, dose: str, runs: pd.DataFrame, cells: pd.DataFrame) -> str:
    """What else was seen at the positive-control dose: the measured mismatch, the break rates, the change from
    step 0 (a run that got worse than its start, or one that learned less)."""
    sweep, rule = m.sweeps[sweep_name], m.rules[sweep_name]
    obj = rule.get("objective") or rule["b"]
    other_dose, other_obj = (str(sweep["reference"]), obj) if "objective" in rule else (dose, rule["a"])
    here = cells[(cells["sweep"] == sweep_name) & (cells["dose"] == dose) & (cells["objective"] == obj)].iloc[0]
    a = _values(runs, sweep_name, dose, obj, "broke")
    b = _values(runs, sweep_name, other_dose, other_obj, "broke")
    rate, lo, hi = rate_difference_interval(a, b) if len(a) and len(b) else (math.nan,) * 3
    return (
        f"; step-1 mean |pi - mu| {here['step1_mismatch_mean']:.4f} (max {here['step1_mismatch_max']:.2f}); "
        f"{obj} broke {int(np.nansum(a))}/{len(a)} vs {other_obj} at {other_dose} {int(np.nansum(b))}/{len(b)} "
        f"(difference {rate:+.2f} [{lo:+.2f}, {hi:+.2f}]); {obj}'s held-out change from step 0 "
        f"{here['eval_gain']:+.3f}"
    )


# --- report ----------------------------------------------------------------------------------------------------


def write_map(m: Map, cells: list[Cell], runs_dir: Path, status: dict[Job, str], out: Path, wall_s: float) -> int:
    """MAP.md, map.json, cells.csv, runs.csv and figures/ in `out`; returns how many runs failed."""
    from analysis.map_figures import draw_map

    rows = []
    for cell in cells:
        for seed in cell.seeds:
            path = run_dir(runs_dir, cell, seed)
            st = next((s for j, s in status.items() if j.run_dir == path), None) or "not run"
            rows.append(run_row(cell, seed, path, st))
    runs = pd.DataFrame(rows)
    table = pd.DataFrame([cell_row(c, runs) for c in cells])
    lines = [conclusion(m, name, runs, table) for name in m.rules]
    out.mkdir(parents=True, exist_ok=True)
    figures = draw_map(m, table, out / "figures")
    runs.to_csv(out / "runs.csv", index=False)
    table.to_csv(out / "cells.csv", index=False)
    failed = runs[runs["status"] == "failed"]
    doc = {
        "map": str(m.path.relative_to(ROOT)) if m.path.is_relative_to(ROOT) else str(m.path),
        "lines": lines,
        "cells": table.to_dict(orient="records"),
        "failed": failed.reindex(columns=["sweep", "dose", "objective", "seed", "error"]).to_dict(orient="records"),
        "wall_time_s": wall_s,  # this pass: 0 for --report-only
        "runs_time_s": runs_time_s(list(status), status),  # every completed run's own wall time, summed
        "figures": figures,
    }
    (out / "map.json").write_text(json.dumps(doc, indent=1, default=_json_default) + "\n", encoding="utf-8")
    (out / "MAP.md").write_text(markdown(m, doc, table, runs), encoding="utf-8")
    return len(failed)


def _json_default(x: Any) -> Any:
    if isinstance(x, np.integer | np.floating | np.bool_):
        return x.item()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def _f(x: Any, nd: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and not np.isfinite(x)) else f"{x:.{nd}f}"


def markdown(m: Map, doc: dict[str, Any], table: pd.DataFrame, runs: pd.DataFrame) -> str:
    out = [
        "# The testbed map",
        "",
        f"Written by `python -m analysis.testbed_map` from `{doc['map']}` (its rules and seeds were committed before "
        "any of its runs). Held-out accuracy is the policy's own (`eval.engine=policy`), never sampled through the "
        "dose. A run *broke* when its `collapsed` metric is 1 or its final held-out accuracy is below 0.10.",
        "",
        "## What it shows, one line per mechanism",
        "",
        *[f"- {line['line']}" for line in doc["lines"]],
        "",
    ]
    for name, sweep in m.sweeps.items():
        out += [
            f"## {name}: {sweep.get('label', name)}",
            "",
            "| dose | objective | cell | seeds | final held-out, mean [95% t CI] | change from step 0 "
            "| broke [95% Wilson] "
            "| step-1 mean / max \\|pi-mu\\| | late mean / max \\|pi-mu\\| |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for _, r in table[table["sweep"] == name].iterrows():
            if not r.get("seeds"):
                out.append(f"| {r['dose']} | {r['objective']} | {r['kind']} | 0 of {r['planned']} | not run |||||")
                continue
            out.append(
                f"| {r['dose']} | {r['objective']} | {r['kind']} | {int(r['seeds'])} of {r['planned']} | "
                f"{_f(r['final_eval'])} [{_f(r['final_lo'])}, {_f(r['final_hi'])}] | {r['eval_gain']:+.3f} | "
                f"{int(r['broke'])}/{int(r['seeds'])} [{_f(r['broke_lo'], 2)}, {_f(r['broke_hi'], 2)}] | "
                f"{_f(r['step1_mismatch_mean'], 4)} / {_f(r['step1_mismatch_max'], 2)} | "
                f"{_f(r['late_mismatch_mean'], 4)} / {_f(r['late_mismatch_max'], 2)} |"
            )
        tests = next(line["tests"] for line in doc["lines"] if line["sweep"] == name) if name in m.rules else []
        if tests:
            rule = m.rules[name]
            what = (
                f"{rule['objective']} at the dose minus at {sweep['reference']}"
                if "objective" in rule
                else f"{rule['a']} minus {rule['b']} at the dose"
            )
            out += [
                "",
                f"The rule's tests ({rule['metric']}, {what}; Welch t, Holm over the tested doses):",
                "",
                "| dose | seeds | difference [95% Welch CI] | p | Holm p | significant |",
                "|---|---|---|---|---|---|",
            ]
            for t in tests:
                out.append(
                    f"| {t['dose']} | {t['seeds'][0]}/{t['seeds'][1]} | "
                    + (
                        f"{t['effect']:+.3f} [{t['ci_low']:+.3f}, {t['ci_high']:+.3f}] | {t['p']:.3g} | "
                        if "effect" in t
                        else "- | - | "
                    )
                    + (f"{t['p_holm']:.3g} | {'yes' if t['significant'] else 'no'} |" if "p_holm" in t else "- | "
                       "not tested (fewer seeds than the rule needs) |")
                )  # fmt: skip
        out.append("")
    if doc["figures"]:
        out += ["## Figures", "", *[f"![{Path(f).stem}](figures/{Path(f).name})" for f in doc["figures"]], ""]
    if doc["failed"]:
        out += ["## Failed runs", "", *[f"- {f['objective']} {f['sweep']}:{f['dose']} seed {f['seed']}: "
                                        f"{f['error']}" for f in doc["failed"]], ""]  # fmt: skip
    done = runs[runs["status"] == "completed"]
    out.append(
        f"{len(done)} of {len(runs)} cell-runs completed (a run shared by two sweeps counts in each); the completed "
        f"runs took {doc['runs_time_s'] / 60:.0f} min of one-thread run time in all, two at a time."
    )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.testbed_map", description=__doc__.splitlines()[0])
    p.add_argument("--map", type=Path, default=DEFAULT_MAP)
    p.add_argument("--out", type=Path, default=None, help="output folder (default: the map file's folder)")
    p.add_argument("--jobs", type=int, default=None, help="parallel one-thread runs (default: the map file's)")
    p.add_argument("--report-only", action="store_true", help="no runs: the map from what is on disk")
    args = p.parse_args(argv)
    m = Map.load(args.map)
    out = args.out or m.path.parent
    runs = out / "runs"
    cells = m.cells()
    jobs = m.jobs_for(cells, runs)
    if args.report_only and not any(j.run_dir.exists() for j in jobs):
        raise SystemExit(f"error: --report-only: no run of {m.path.name} is on disk under {runs}; run it first")
    t0 = time.time()
    ran = {} if args.report_only else run_jobs(jobs, args.jobs or m.jobs)
    status = {j: ran.get(j) or disk_status(j) for j in jobs}
    failed = write_map(m, cells, runs, status, out, time.time() - t0)
    print(f"testbed map: {out / 'MAP.md'}" + (f" ({failed} runs failed)" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
