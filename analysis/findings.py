"""Findings: the suite's runs -> per-run numbers -> one verdict per claim -> FINDINGS.md, findings.json, figures.

Each claim of findings/suite.yaml lists `parts`: a comparison of arm `a` against arm `b` (or against a number),
on a per-run `metric` (below), decided by a `rule` (analysis/verdicts.py): one of five words per part, Holm-adjusted
over the claim's parts; the claim gets a one-word summary only where its parts agree. A claim states the
`condition` it runs at and whether the testbed map found a `positive_control` for its mechanism there: without one
every part is "not testable here", never a negative verdict. A claim the CPU suite cannot test at all has
`cpu: false` and a `why`; it gets a row, no verdict.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from analysis.run_metrics import BROKEN_EVAL, METRICS, load_run, run_error, runs_time_s
from analysis.verdicts import (
    INCONCLUSIVE,
    NOT_TESTABLE,
    OPPOSITE,
    REPRODUCED,
    SMALLER,
    Comparison,
    Rule,
    common_word,
    compare,
    mean_interval,
    replication_seeds,
    summarize,
)

# The repository: the report names run folders relative to it, the same from any checkout.
ROOT = Path(__file__).resolve().parents[1]


def repo_path(path: Path) -> Path:
    """`path` relative to the repository when inside it: runs.csv and the report name run folders the same way
    from any checkout (a fresh clone's default suite path is absolute)."""
    full = Path(path).resolve()
    return full.relative_to(ROOT) if full.is_relative_to(ROOT) else Path(path)


def evaluate_claims(
    claims: Sequence[dict[str, Any]], jobs: Sequence[Any], status: dict[Any, str], stale: dict[Any, str] | None = None
) -> tuple[list[dict[str, Any]], pd.DataFrame, pd.DataFrame]:
    """(one entry per claim, per-run numbers, the runs' metrics for figures). `stale`: why a run whose status is
    "stale" no longer matches its arm's settings."""
    rows, frames = [], []
    for job in jobs:
        ok = status.get(job) == "completed"
        m, e = load_run(job.run_dir) if ok else (pd.DataFrame(), pd.DataFrame())
        row = {
            "arm": job.arm,
            "seed": job.seed,
            "status": status.get(job, "missing"),
            "run_dir": str(repo_path(job.run_dir)),
        }
        for name, (fn, _) in METRICS.items():
            row[name] = fn(m, e) if ok and not m.empty else math.nan
        first = m.iloc[0] if ok and not m.empty else {}
        row["mismatch_abs_mean_step1"] = float(first.get("mismatch/abs_prob_diff_mean", math.nan))
        row["mismatch_abs_max_step1"] = float(first.get("mismatch/abs_prob_diff_max", math.nan))
        if status.get(job) == "stale":
            why = (stale or {}).get(job, "its settings differ from its arm's")
            row["error"] = f"stale: {why}; a pass of the suite (not --report-only) runs it again"
        else:
            row["error"] = "" if ok else run_error(job.run_dir)
        rows.append(row)
        if ok and not m.empty:
            frames.append(m.assign(run=str(job.run_dir), arm=job.arm, seed=job.seed))
    # No job at all (every claim of the selection not testable here) still gives the frame its columns.
    steps1 = ["mismatch_abs_mean_step1", "mismatch_abs_max_step1"]
    per_run = pd.DataFrame(rows, columns=["arm", "seed", "status", "run_dir", *METRICS, *steps1, "error"])
    curves = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return [claim_entry(c, per_run) for c in claims], per_run, curves


def _against(rule: Rule) -> str:
    """The verdict on the far side of a rule from `reproduced`: what a replication would plan toward otherwise."""
    return SMALLER if rule.kind.endswith("_by") else OPPOSITE


def claim_entry(claim: dict[str, Any], per_run: pd.DataFrame) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "id": claim["id"], "claim": claim["claim"], "paper": claim["paper"], "cpu": claim.get("cpu", True),
        "condition": claim.get("condition"), "positive_control": claim.get("positive_control"),
    }  # fmt: skip
    if not claim.get("cpu", True):
        return {**entry, "verdict": "not tested", "why": claim.get("why", "")}
    testable = claim.get("positive_control", True) is not False
    parts, comparisons = [], []
    for part in claim["parts"]:
        rule = Rule(**part["rule"])
        a = _values(per_run, part["a"], part["metric"])
        b = part["b"]
        b_vals = _values(per_run, b, part["metric"]) if isinstance(b, str) else float(b)
        c = compare(a, b_vals, rule)
        comparisons.append(c)
        b_list = b_vals if isinstance(b, str) else [float(b)] * max(len(a), 2)
        inconclusive = c.verdict == INCONCLUSIVE
        parts.append({
            "a": part["a"], "b": b, "metric": part["metric"], "rule": part["rule"], "effect": c.effect,
            "ci_low": c.ci_low, "ci_high": c.ci_high, "method": c.method, "p": c.p,
            "prob_a_better": c.prob_a_better, "seeds": list(c.seeds), "verdict_alone": c.verdict, "why": c.why,
            "replication_seeds": replication_seeds(a, b_list, rule) if inconclusive else None,
            "contradiction_seeds": replication_seeds(a, b_list, rule, toward=_against(rule)) if inconclusive else None,
        })  # fmt: skip
    # A part that says `needs_control: false` (what a clip selects, say) is decided without the claim's control;
    # Holm runs over the parts decided.
    decided = [testable or spec.get("needs_control") is False for spec in claim["parts"]]
    summary, adjusted, p_holm = summarize([c for c, ok in zip(comparisons, decided, strict=True) if ok])
    verdicts, holm_p = iter(adjusted), iter(p_holm)
    for part, ok in zip(parts, decided, strict=True):
        part["verdict"], part["p_holm"] = (next(verdicts), next(holm_p)) if ok else (NOT_TESTABLE, math.nan)
    if not all(decided):
        summary = NOT_TESTABLE if not any(decided) else common_word([p["verdict"] for p in parts])
    for part, spec in zip(parts, claim["parts"], strict=True):  # v8: what the paper says, and what was planned
        for key in ("quote", "power"):
            if key in spec:
                part[key] = spec[key]
    if any("endpoints" in spec for spec in claim["parts"]):
        endpoint_entries(claim["parts"], parts, per_run, decided)
    head = parts[0]
    arms = {}
    for arm in dict.fromkeys([p["a"] for p in parts] + [p["b"] for p in parts if isinstance(p["b"], str)]):
        sub = per_run[per_run["arm"] == arm]
        done = sub[sub["status"] == "completed"]
        arms[arm] = {
            "seeds": int(len(done)),
            "failed": [
                {"seed": int(r.seed), "error": r.error}
                for r in sub.itertuples()
                if r.status not in ("completed", "not run")
            ],
            "not_run": int((sub["status"] == "not run").sum()),
            "mismatch_abs_mean": _mean(done["mismatch_abs_mean_step1"]),
            "mismatch_abs_max": _mean(done["mismatch_abs_max_step1"]),
        }
    return {
        **entry,
        "metric": head["metric"],
        "metric_meaning": METRICS[head["metric"]][1],
        "effect": head["effect"],
        "ci_low": head["ci_low"],
        "ci_high": head["ci_high"],
        "seeds": min(head["seeds"]),
        "verdict": summary,
        "parts": parts,
        "arms": arms,
    }


def endpoint_entries(
    specs: Sequence[dict[str, Any]], parts: list[dict[str, Any]], per_run: pd.DataFrame, decided: Sequence[bool]
) -> None:
    """Each part's secondary endpoints (break rate, the mechanism's measures), on the part's own arms, each decided
    by its own rule and Holm-adjusted over the claim's endpoints: reported beside the primary verdict, never
    turning it (analysis/verdicts.py, multiplicity)."""
    flat: list[tuple[dict[str, Any], Comparison]] = []
    for spec, part, ok in zip(specs, parts, decided, strict=True):
        part["endpoints"] = []
        for endpoint in spec.get("endpoints") or []:
            rule = Rule(**endpoint["rule"])
            b = part["b"]
            b_vals = _values(per_run, b, endpoint["metric"]) if isinstance(b, str) else float(b)
            c = compare(_values(per_run, part["a"], endpoint["metric"]), b_vals, rule)
            entry = {
                "metric": endpoint["metric"], "rule": endpoint["rule"], "effect": c.effect, "ci_low": c.ci_low,
                "ci_high": c.ci_high, "method": c.method, "seeds": list(c.seeds), "verdict_alone": c.verdict,
                "p": c.p, "why": c.why,
            }  # fmt: skip
            part["endpoints"].append(entry)
            if ok:
                flat.append((entry, c))
            else:
                entry["verdict"], entry["p_holm"] = NOT_TESTABLE, math.nan
    if not flat:
        return
    _, adjusted, p_holm = summarize([c for _, c in flat])
    for (entry, _), verdict, p in zip(flat, adjusted, p_holm, strict=True):
        entry["verdict"], entry["p_holm"] = verdict, p


def _values(per_run: pd.DataFrame, arm: str, metric: str) -> list[float]:
    if metric not in METRICS:
        raise ValueError(f"metric {metric!r} is not one of {', '.join(METRICS)}")
    return per_run.loc[per_run["arm"] == arm, metric].astype(float).tolist()


def _mean(s: pd.Series) -> float:
    s = s.dropna()
    return float(s.mean()) if len(s) else math.nan


def _fmt(x: Any, nd: int = 3) -> str:
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{nd}g}"


def figure_name(kind: str) -> str:
    """A suite.yaml figure kind (a short name, or any stem of figures.METRIC_FIGURES) -> the stem `figures.draw`
    takes. An unknown kind is an error, not a claim left without its figure."""
    from analysis import figures

    short = {"reward": "reward_curves", "masked": "masked_frac", "weights": "drpo_weights"}
    name = short.get(kind, kind)
    if name not in figures.METRIC_FIGURES:
        raise ValueError(f"unknown figure kind {kind!r}; allowed: {', '.join([*short, *figures.METRIC_FIGURES])}")
    return name


def claim_figures(claim: dict[str, Any], curves: pd.DataFrame, per_run: pd.DataFrame, out_dir: Path) -> list[str]:
    """The claim's figure(s), of the paper's kind: curves for the keys it names, final-value intervals otherwise."""
    from analysis import figures

    if curves.empty or not claim.get("cpu", True):
        return []
    arms = [a for a in claim.get("arms", []) or [p["a"] for p in claim["parts"]]]
    sub = curves[curves["arm"].isin(arms)].copy()
    sub["objective.name"] = sub["arm"]  # figures label arms by this column, bare
    written = []
    for kind in claim.get("figures", ["reward"]):
        try:
            fig = figures.draw(figure_name(kind), sub, arms=["objective.name"], title=f"claim {claim['id']}")
        except figures.SkipFigure:
            continue
        paths = figures.save_figure(fig, out_dir / "figures", f"claim{claim['id']}_{kind}")
        written += [str(p.relative_to(out_dir)) for p in paths]
    return written


def write_report(
    suite: Any, claims: Sequence[dict[str, Any]], jobs: Sequence[Any], status: dict[Any, str], out: Path,
    wall_s: float, quick: bool, command: str, stale: dict[Any, str] | None = None,
) -> int:  # fmt: skip
    """Write findings.json and FINDINGS.md (and figures); returns the number of failed runs."""
    entries, per_run, curves = evaluate_claims(claims, jobs, status, stale)
    for entry in entries:  # a named condition reads as what it is
        cond = getattr(suite, "conditions", {}).get(str(entry.get("condition")))
        if cond is not None:
            entry["condition"] = f"{entry['condition']}: {cond.get('what', '')}".rstrip(": ")
            if "control" in cond:  # v8: the mechanism map's model whose computed positive control the claim reads
                entry["control"] = {"model": cond["control"], "evidence": cond.get("evidence")}
    by_id = {c["id"]: c for c in claims}
    for entry in entries:
        figs = claim_figures(by_id[entry["id"]], curves, per_run, out)
        entry["figure"] = figs[0] if figs else None
        entry["figures"] = figs
    failed = per_run[~per_run["status"].isin(["completed", "not run"])] if len(per_run) else per_run
    arms = arm_summary(per_run)
    doc = {
        "suite": str(suite.path.name),
        "version": getattr(suite, "version", None),
        **suite_provenance(suite.path),
        "quick": quick,
        "command": command,
        "seeds": list(suite.seeds),
        "arm_seeds": dict(suite.arm_seeds),
        "wall_time_s": wall_s,
        # The pass above may have skipped runs finished earlier; this is what every run on disk cost (summed).
        "runs_time_s": runs_time_s(jobs, status),
        "runs": len(per_run),
        "failed_runs": int(len(failed)),
        "claims": entries,
        "arms": arms,
        "arms_figure": arms_figure(arms, out),
        "runs_not_run": int((per_run["status"] == "not run").sum()) if len(per_run) else 0,
        "optin": [Path(os.path.relpath(o.path, suite.path.parent)).as_posix() for o in suite.optin],
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "findings.json").write_text(json.dumps(doc, indent=2, default=_json_default) + "\n", encoding="utf-8")
    per_run.to_csv(out / "runs.csv", index=False)
    (out / "FINDINGS.md").write_text(markdown(doc, suite, failed, out), encoding="utf-8")
    return int(len(failed))


def suite_provenance(path: Path) -> dict[str, Any]:
    """The suite file's sha256, the commit that last changed it, and whether the file read differs from that
    commit's: a report names the preregistration it was decided by."""
    import hashlib
    import subprocess

    text = Path(path).read_bytes()
    info: dict[str, Any] = {"suite_sha": hashlib.sha256(text).hexdigest(), "suite_commit": None, "suite_edited": None}
    try:
        git = ["git", "-C", str(ROOT)]
        rel = str(repo_path(path))
        commit = subprocess.run(
            [*git, "log", "-1", "--format=%H", "--", rel], capture_output=True, text=True, check=True
        )
        info["suite_commit"] = commit.stdout.strip() or None
        if info["suite_commit"]:
            committed = subprocess.run([*git, "show", f"{info['suite_commit']}:{rel}"], capture_output=True, check=True)
            info["suite_edited"] = committed.stdout != text
    except (OSError, subprocess.CalledProcessError):
        pass  # not a git checkout: the sha alone names the file
    return info


def arm_summary(per_run: pd.DataFrame) -> list[dict[str, Any]]:
    """Per arm, over its completed seeds: final held-out mean with a 95% t interval, the per-seed values, the
    median held-out change from step 0, how many runs broke (with an exact binomial interval) and the step-1
    mismatch. A description beside the verdicts; no rule was written for it."""
    rows = []
    for arm in dict.fromkeys(per_run["arm"]) if len(per_run) else []:
        done = per_run[(per_run["arm"] == arm) & (per_run["status"] == "completed")].sort_values("seed")
        finals = done["final_eval"].astype(float)
        value, lo, hi = mean_interval(finals.tolist())
        broken = done["broke"] == 1
        broke = int(broken.sum())
        n = int(len(done))
        ci = stats.binomtest(broke, n).proportion_ci(method="exact") if n else None
        rows.append({
            "arm": arm, "seeds": n, "final_eval_mean": value, "final_eval_ci": [lo, hi],
            "final_eval_per_seed": {int(s): float(v) for s, v in zip(done["seed"], finals, strict=True)},
            "eval_gain_median": float(done["eval_gain"].median()) if n else math.nan,
            "broke": broke, "broke_seeds": [int(x) for x in done.loc[broken, "seed"]],
            "broke_ci": [ci.low, ci.high] if ci else [math.nan, math.nan],
            "mismatch_abs_mean_step1": _mean(done["mismatch_abs_mean_step1"]),
            "mechanism": {k: _mean(done[k].astype(float)) for k in MECHANISM if k in done},
        })  # fmt: skip
    return rows


# The mechanism beside the score (issue 60): per arm, means over its completed seeds; descriptions, no rule.
MECHANISM = (
    "step1_mismatch", "mismatch_slope_given_entropy", "late_entropy", "step1_masked_frac", "late_masked_frac",
    "step1_penalized_frac", "early_bad_update_frac", "late_bad_update_frac",
)  # fmt: skip


def arms_figure(arms: list[dict[str, Any]], out_dir: Path) -> str | None:
    """figures/arms.png: every arm's final held-out interval and its broken runs (None when no run completed)."""
    from analysis import figures

    try:
        fig = figures.fig_arm_intervals(arms, broken_below=BROKEN_EVAL)
    except figures.SkipFigure:
        return None
    return str(figures.save_figure(fig, out_dir / "figures", "arms")[0].relative_to(out_dir))


def _json_default(x: Any) -> Any:
    if isinstance(x, float | np.floating):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    raise TypeError(type(x))


def _fewer_seeds(doc: dict[str, Any]) -> str:
    fewer: dict[int, list[str]] = {}
    for arm, n in doc["arm_seeds"].items():
        fewer.setdefault(n, []).append(arm)
    return "".join(f"; {', '.join(arms)} on the first {n}" for n, arms in sorted(fewer.items()))


def markdown(doc: dict[str, Any], suite: Any, failed: pd.DataFrame, out: Path) -> str:
    lines = [
        "# Findings on 2 CPU cores",
        "",
        f"Written by `{doc['command']}` from `{doc['suite']}` "
        + _provenance(doc)
        + f"(seeds {', '.join(map(str, doc['seeds']))}{_fewer_seeds(doc)}; "
        f"{doc['runs']} runs: {doc['failed_runs']} failed, "
        f"{doc['runs_not_run']} not run yet; "
        f"{doc['wall_time_s'] / 60:.1f} min of runs in this pass; the completed runs took "
        f"{doc['runs_time_s'] / 60:.1f} min of one-thread run time in all, two at a time). "
        "Each part compares arm A with arm B on a per-run metric: the effect is mean(A) − mean(B) with Welch's 95% "
        "interval (a one-sample t interval against a constant; a difference of rates with Newcombe's interval "
        "where the rule says `statistic: rate`). Verdicts, decided by the rule written in the suite file before the "
        "runs, are Holm-adjusted over a claim's parts: *reproduced*, *opposite* (a significant effect the other "
        "way), *smaller than claimed* (an effect as large as the margin excluded, said only with 8 or more seeds "
        "per arm), *inconclusive*, *not testable here* (no positive control for the mechanism at this condition: "
        f"see findings/map/{'MECHANISM' if (doc.get('version') or 7) >= 8 else 'MAP'}.md). A claim's one-word "
        "summary is given only where its parts agree; *parts differ* otherwise." + _superiority_note(doc),
        "",
    ]
    quoted = any("quote" in p for e in doc["claims"] for p in e.get("parts", []))
    lines += (
        [
            "| claim | part | quote | condition | effect [95% CI] | seeds | verdict | claim |",
            "|---|---|---|---|---|---|---|---|",
        ]
        if quoted
        else [
            "| claim | part | condition | effect [95% CI] | seeds | verdict | claim |",
            "|---|---|---|---|---|---|---|",
        ]
    )
    for e in doc["claims"]:
        if not e["cpu"]:
            lines.append(f"| {e['id']}. {e['paper']} | – | – | – | – | not tested: {e['why']} | – |")
            continue
        for i, p in enumerate(e["parts"]):
            b = p["b"] if isinstance(p["b"], str) else f"{p['b']}"
            rule = p["rule"]
            margin = f" {rule.get('margin', 0)}" if rule.get("margin") else ""
            quote = f' "{p.get("quote", "")}" |' if quoted else ""
            lines.append(
                f"| {e['id'] if i == 0 else ''}{'. ' + e['paper'] if i == 0 else ''} | {p['a']} vs {b}, "
                f"`{p['metric']}` ({rule['kind']}{margin}) |{quote} {e.get('condition') or 'base' if i == 0 else ''} | "
                f"{_fmt(p['effect'])} [{_fmt(p['ci_low'])}, {_fmt(p['ci_high'])}] | {p['seeds'][0]}/{p['seeds'][1]} | "
                f"{p['verdict']} | {'**' + e['verdict'] + '**' if i == 0 else ''} |"
            )
    lines += _optin_section(suite, out)
    lines += _arms_section(doc)
    lines += ["", "## Parts of each claim", ""]
    for e in doc["claims"]:
        if not e["cpu"]:
            continue
        control = {True: "yes", False: "no: every part is not testable here", None: "not stated"}[
            e.get("positive_control")
        ]
        lines.append(f"**Claim {e['id']}** ({e['verdict']}): {e['claim']}")
        if "control" in e:
            control += f", computed by the mechanism map for `{e['control']['model']}` ({e['control']['evidence']})"
        lines.append(f"- condition: {e.get('condition') or 'the base setting'}; positive control there: {control}")
        for p in e["parts"]:
            b = p["b"] if isinstance(p["b"], str) else f"the constant {p['b']}"
            lines.append(
                f"- {p['a']} vs {b} on `{p['metric']}`{_STATISTIC_LABEL.get(p['rule'].get('statistic'), '')} "
                f"({p['rule']['kind']}, margin {p['rule'].get('margin', 0)}): "
                f"effect {_fmt(p['effect'])}, {p['why']} ({p['method']}), P(A>B) {_fmt(p['prob_a_better'], 2)}, "
                f"seeds {p['seeds'][0]}/{p['seeds'][1]} -> {p['verdict_alone']} alone, Holm p {_fmt(p['p_holm'], 2)}"
                f" -> {p['verdict']}{_replication_note(p)}"
            )
            lines += _endpoint_lines(p)
        mism = ", ".join(f"{a} {_fmt(v['mismatch_abs_mean'], 2)}" for a, v in e["arms"].items())
        lines.append(f"- step-1 mean |π−μ| per arm: {mism}")
        for f in e.get("figures", []):
            lines.append(f"- figure: [{f}]({f})")
        lines.append("")
    lines += _inconclusive_section(doc)
    if len(failed):
        lines += ["## Failed runs", "", "| arm | seed | error |", "|---|---|---|"]
        lines += [f"| {r.arm} | {r.seed} | {str(r.error)[:200]} |" for r in failed.itertuples()]
        lines.append("")
    return "\n".join(lines)


def _endpoint_lines(part: dict[str, Any]) -> list[str]:
    """A v8 part's planned power and its secondary endpoints, one line each, under the part's line."""
    lines = [f"  - power as preregistered: {part['power']}"] if "power" in part else []
    for ep in part.get("endpoints", []):
        rule = ep["rule"]
        lines.append(
            f"  - endpoint `{ep['metric']}`{_STATISTIC_LABEL.get(rule.get('statistic'), '')} ({rule['kind']}, "
            f"margin {rule.get('margin', 0)}): effect {_fmt(ep['effect'])} [{_fmt(ep['ci_low'])}, "
            f"{_fmt(ep['ci_high'])}] ({ep['method']}), seeds {ep['seeds'][0]}/{ep['seeds'][1]}, Holm p over the "
            f"claim's endpoints {_fmt(ep['p_holm'], 2)} -> {ep['verdict']}"
        )
    return lines


_STATISTIC_LABEL = {"rate": " rate", "superiority": " P(A>B) - 1/2"}


def _superiority_note(doc: dict[str, Any]) -> str:
    """A sentence for a report with `statistic: superiority` parts (none in v7's, whose report stays as it was)."""
    parts = [p for e in doc["claims"] for p in e.get("parts", [])]
    if not any(p["rule"].get("statistic") == "superiority" for p in parts):
        return ""
    return (
        " Where the rule says `statistic: superiority`, the effect is P(A > B) + P(A = B)/2 - 1/2 over pairs of seeds "
        "(0: neither arm tends to score higher) with the Clopper-Pearson interval of P(A > B) as a proportion of "
        "min(n_A, n_B) trials, and the margin is on that scale (0.1: A beats B in more than 60% of seed pairs)."
    )


def _provenance(doc: dict[str, Any]) -> str:
    if not doc.get("suite_sha"):
        return ""
    commit = (doc.get("suite_commit") or "not committed")[:12]
    edited = ", edited since" if doc.get("suite_edited") else ""
    return f"(sha256 {doc['suite_sha'][:12]}, last committed in {commit}{edited}) "


def _optin_section(suite: Any, out: Path) -> list[str]:
    """The opt-in suites the suite file names (`optin:`): what runs there and how, so what does not fit the budget
    is named beside the verdicts; the link is relative to the report's own folder (`out`: a replication writes
    into `seeds_<seeds>/`)."""
    lines = []
    for opt in suite.optin:
        path = opt.path
        added = ", ".join(a for a in opt.arms if a not in suite.arms)
        ids = ", ".join(str(c["id"]) for c in opt.claims)
        shown = repo_path(path)
        report = (path.parent / "FINDINGS.md").resolve()
        link = Path(os.path.relpath(report, Path(out).resolve())).as_posix()
        done = f"its report: [{link}]({link})" if report.exists() else f"its report, once run: {link}"
        lines.append(
            f"- `python -m analysis.suite --suite {shown}`: more parts of claims {ids}, on arms {added} "
            f"(rules written in that file before its runs; {done})"
        )
    if not lines:
        return []
    return ["", "**Opt-in**, outside the 90-minute budget:", "", *lines]


def _arms_section(doc: dict[str, Any]) -> list[str]:
    if not doc.get("arms"):
        return []
    lines = [
        "",
        "## The arms (a description beside the verdicts, not a verdict)",
        "",
        f"Final held-out accuracy: mean over seeds with a 95% t interval. A run *broke* when the "
        f"`collapsed` metric is 1 or its held-out accuracy ended below {BROKEN_EVAL:g}; the interval is exact "
        "(Clopper-Pearson).",
        "",
        "| arm | seeds | final held-out, mean | 95% CI | per seed | held-out change, median | broke | 95% CI "
        "| step-1 mean \\|π−μ\\| |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for a in doc["arms"]:
        per_seed = " / ".join(f"{v:.3f}" for v in a["final_eval_per_seed"].values()) or "–"
        lines.append(
            f"| {a['arm']} | {a['seeds']} | {_fmt(a['final_eval_mean'])} | [{_fmt(a['final_eval_ci'][0])}, "
            f"{_fmt(a['final_eval_ci'][1])}] | {per_seed} | {_fmt(a['eval_gain_median'])} | "
            f"{a['broke']} of {a['seeds']} | [{_fmt(a['broke_ci'][0], 2)}, {_fmt(a['broke_ci'][1], 2)}] | "
            f"{_fmt(a['mismatch_abs_mean_step1'], 2)} |"
        )
    if doc.get("arms_figure"):
        lines += ["", f"Figure: [{doc['arms_figure']}]({doc['arms_figure']})"]
    lines += [
        "",
        "The mechanism beside the score, per arm (means over its seeds): "
        + "; ".join(f"`{k}` {METRICS[k][1]}" for k in MECHANISM),
        "",
        "| arm | " + " | ".join(MECHANISM) + " |",
        "|---|" + "---|" * len(MECHANISM),
    ]
    for a in doc["arms"]:
        mech = a.get("mechanism", {})
        lines.append(f"| {a['arm']} | " + " | ".join(_fmt(mech.get(k), 2) for k in MECHANISM) + " |")
    return lines


# Where a measured effect sits when no seed count decides the rule either way, by rule kind (`decide`'s boundaries).
_UNDECIDABLE = {
    "greater": "within ±margin",
    "less": "within ±margin",
    "greater_by": "at +margin",
    "less_by": "at -margin",
    "noninferior": "at -margin",
    "equivalent": "at the band's edge",
}


def _planned(part: dict[str, Any]) -> bool:
    """Inconclusive with every seed it needs: a comparison short of runs is a failed-run matter, not a plan."""
    return part["verdict"] == INCONCLUSIVE and min(part["seeds"]) >= part["rule"].get("min_seeds", 3)


def _plan(part: dict[str, Any]) -> tuple[str, int] | None:
    """The verdict the measured effect points to and the seeds per arm a replication would need to reach it; None
    when the effect lies where no seed count decides."""
    for toward, key in ((REPRODUCED, "replication_seeds"), (_against(Rule(**part["rule"])), "contradiction_seeds")):
        if part.get(key) is not None:
            return toward, part[key]
    return None


def _replication_note(part: dict[str, Any]) -> str:
    if not _planned(part):
        return ""
    plan = _plan(part)
    if plan is None:
        where = _UNDECIDABLE[part["rule"]["kind"]]
        return f" (the measured effect lies {where}: no seed count would decide it)"
    verb = "reproduce it" if plan[0] == REPRODUCED else f"call it {plan[0]}"
    return f" (a replication at this effect and spread would {verb} with ~{plan[1]} seeds per arm)"


def _inconclusive_section(doc: dict[str, Any]) -> list[str]:
    """Why each inconclusive comparison is inconclusive: too few seeds for the measured effect, or an effect the
    rule does not count, with the seeds and one-thread hours a replication would take (a planning number)."""
    run_h = doc["runs_time_s"] / max(1, doc["runs"] - doc["failed_runs"] - doc["runs_not_run"]) / 3600
    rows = []
    for e in doc["claims"]:
        for p in e.get("parts", []):
            if not _planned(p):
                continue
            plan = _plan(p)
            arms = 2 if isinstance(p["b"], str) else 1
            b = p["b"] if isinstance(p["b"], str) else f"the constant {p['b']}"
            if plan is None:
                why, cost = f"effect {_UNDECIDABLE[p['rule']['kind']]}: not a seed-count problem", "–"
            else:
                verb = "reproduce" if plan[0] == REPRODUCED else f"call it {plan[0]}"
                why, cost = f"too few seeds to {verb}: ~{plan[1]} per arm", f"{plan[1] * arms * run_h:.1f}"
            rows.append(
                f"| {e['id']} | {p['a']} vs {b} | `{p['metric']}` | {_fmt(p['effect'])} | "
                f"{p['rule']['kind']} {p['rule'].get('margin', 0)} | {why} | {cost} |"
            )
    if not rows:
        return []
    return [
        "## Why the inconclusive comparisons are inconclusive",
        "",
        "Seeds per arm a fresh replication would need for its 95% interval to clear the rule's boundary on the "
        "side the measured effect lies (to reproduce the claim, or to call it smaller than claimed or opposite) with "
        "80% probability, were "
        "the true effect and the per-seed spread what these seeds measured (normal "
        "approximation; `analysis.verdicts.replication_seeds`). A planning number, not a verdict: a replication is "
        "a new experiment on new seeds (`python -m analysis.suite --seeds 3-12`), decided by the same rules on its "
        "own seeds, never pooled with these. Hours are one-thread run time at this suite's mean run time.",
        "",
        "| claim | comparison | metric | effect | rule | why inconclusive | one-thread hours |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
