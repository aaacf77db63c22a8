"""One table per experiment: each arm's final and best eval score, final training reward and mismatch.

Per run: `final` = the score at the last evaluation, `best` = its maximum over evaluations (step 0 included,
as in summary.json), `final reward` = mean of reward/mean over the last 10% of steps (at least one step, since
a single step's reward is noisy), `mismatch k3` = mean of mismatch/k3 over all steps. Per arm: mean ± the
half-width of the 95% Student-t interval over its seeds (n given; one seed shows the mean alone). A value a run
never logged (no update happened, so no mismatch) is averaged over the runs that did log it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.stats import arm_columns, final_eval_scores, is_config_column, score_column, t_critical

REWARD = "reward/mean"
MISMATCH = "mismatch/k3"
TAIL_FRACTION = 0.1
# value column -> (heading, format); the score headings get the score key (avg@k) filled in.
_VALUES = {
    "final": ("final {score}", ".3f"),
    "best": ("best {score}", ".3f"),
    "final_reward": ("final reward", ".3f"),
    "mismatch_k3": ("mismatch k3", ".3g"),
}
_SHORT = {"objective.name": "objective", "precision.name": "precision"}


def per_run_values(metrics: pd.DataFrame, evals: pd.DataFrame, score: str | None = None) -> pd.DataFrame:
    """One row per run (and benchmark, when there are evaluations): final, best, final_reward, mismatch_k3."""
    runs = pd.concat([metrics.drop_duplicates("run"), evals.drop_duplicates("run")], ignore_index=True)
    config = [c for c in runs.columns if is_config_column(c) or c == "name"]
    out = runs.drop_duplicates("run")[["run", *config]].reset_index(drop=True)

    train = []
    for run, rows in metrics.sort_values("step").groupby("run", sort=False):
        rec: dict[str, object] = {"run": run, "final_reward": math.nan, "mismatch_k3": math.nan}
        if REWARD in rows.columns:
            reward = rows[REWARD].dropna()
            tail = max(1, math.ceil(TAIL_FRACTION * len(reward)))
            rec["final_reward"] = reward.iloc[-tail:].mean() if len(reward) else math.nan
        if MISMATCH in rows.columns:
            rec["mismatch_k3"] = rows[MISMATCH].mean()
        train.append(rec)
    out = out.merge(pd.DataFrame(train, columns=["run", "final_reward", "mismatch_k3"]), on="run", how="left")

    score = score or (score_column(evals) if not evals.empty else None)
    if score is not None:
        scores = final_eval_scores(evals, score)[
            ["run", *(["benchmark"] if "benchmark" in evals else []), "final", "best"]
        ]
        out = out.merge(scores, on="run", how="left")
    else:
        out["final"] = out["best"] = math.nan
    out.attrs["score"] = score
    return out


def experiment_table(
    metrics: pd.DataFrame, evals: pd.DataFrame, *, arms: Sequence[str] | None = None, score: str | None = None
) -> pd.DataFrame:
    """Arms (x benchmark) -> n seeds and <value>_mean / _std / _ci for final, best, final_reward, mismatch_k3.

    `_ci` is the half-width of the 95% t-interval over the seeds that have the value (NaN with one seed).

    `attrs["score"]` names the eval score used (avg@k), `attrs["arms"]` the arm columns.
    """
    per_run = per_run_values(metrics, evals, score)
    if per_run.empty:
        raise ValueError("experiment_table: no runs in metrics or evals")
    arms = list(arm_columns(per_run) if arms is None else arms)
    keys = arms + (["benchmark"] if "benchmark" in per_run.columns and per_run["benchmark"].notna().any() else [])
    grouped = per_run.groupby(keys, dropna=False, sort=True) if keys else per_run.groupby(lambda _: 0)
    table = grouped["run"].nunique().rename("n").to_frame()
    for col in _VALUES:
        n = grouped[col].count()
        table[f"{col}_mean"] = grouped[col].mean()
        table[f"{col}_std"] = grouped[col].std(ddof=1)
        tcrit = n.map(lambda k: t_critical(int(k) - 1) if k >= 2 else math.nan)
        table[f"{col}_ci"] = tcrit * table[f"{col}_std"] / np.sqrt(n.where(n > 0))
    table = table.reset_index(drop=not keys)
    table.attrs.update(score=per_run.attrs["score"], arms=arms)
    return table


def _cell(mean: float, half: float, fmt: str) -> str:
    if pd.isna(mean):
        return "–"
    return f"{mean:{fmt}}" if pd.isna(half) else f"{mean:{fmt}} ± {half:{fmt}}"


def _display(table: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Headings and text cells shared by the Markdown and LaTeX writers."""
    score = table.attrs.get("score") or "score"
    keys = [c for c in table.columns if not c.endswith(("_mean", "_std", "_ci")) and c != "n"]
    heads = [_SHORT.get(c, c) for c in keys] + ["n"] + [h.format(score=score) for h, _ in _VALUES.values()]
    rows = []
    for _, r in table.iterrows():
        cells = [str(r[c]) for c in keys] + [str(int(r["n"]))]
        cells += [_cell(r[f"{v}_mean"], r[f"{v}_ci"], fmt) for v, (_, fmt) in _VALUES.items()]
        rows.append(cells)
    return heads, rows


def to_markdown(table: pd.DataFrame) -> str:
    heads, rows = _display(table)
    lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("---" for _ in heads) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines) + "\n"


def to_latex(table: pd.DataFrame) -> str:
    def esc(s: str) -> str:
        return s.replace("\\", r"\textbackslash{}").replace("_", r"\_").replace("%", r"\%").replace("&", r"\&")

    heads, rows = _display(table)
    lines = [r"\begin{tabular}{" + "l" * len(heads) + "}", r"\toprule", " & ".join(map(esc, heads)) + r" \\"]
    lines.append(r"\midrule")
    lines += [" & ".join(esc(c).replace("±", r"$\pm$").replace("–", "--") for c in cells) + r" \\" for cells in rows]
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def write_table(table: pd.DataFrame, out_dir: Path | str, title: str, failed: pd.DataFrame | None = None) -> list[Path]:
    """table.md (with the definitions and the failed runs), table.csv (numbers) and table.tex in `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = [f"# {title}", "", __doc__.split("\n\n", 1)[1].strip().replace("\n", " "), "", to_markdown(table)]
    if failed is not None and not failed.empty:
        md += ["", failed_runs_markdown(failed)]
    paths = [out_dir / "table.md", out_dir / "table.csv", out_dir / "table.tex"]
    paths[0].write_text("\n".join(md))
    table.to_csv(paths[1], index=False)
    paths[2].write_text(to_latex(table))
    return paths


def failed_runs_markdown(failed: pd.DataFrame) -> str:
    """A list of the runs left out of the curves and the first line of why."""
    lines = [f"Runs left out of the curves and the table ({len(failed)}):", ""]
    for _, r in failed.iterrows():
        why = r.get("load_error") if isinstance(r.get("load_error"), str) else r.get("error")
        why = str(why).strip().splitlines()[0][:200] if isinstance(why, str) and why.strip() else "no error recorded"
        lines.append(f"- `{r['run']}` ({r['status']}): {why}")
    return "\n".join(lines) + "\n"
