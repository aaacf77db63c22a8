"""One table per experiment: each arm's final and best eval score, final training reward and mismatch.

Per run: `final` = the score at the last evaluation, `best` = its maximum over evaluations (step 0 included,
as in summary.json), `final reward` = mean of reward/mean over the last 10% of steps (at least one step, since
a single step's reward is noisy), `mismatch k3` = mean of mismatch/k3 over all steps. Per arm: mean ± the
half-width of the 95% Student-t interval over its seeds (n given; one seed shows the mean alone). A value a run
never logged (no update happened, so no mismatch) is averaged over the runs that did log it.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.stats import (
    arm_columns,
    arm_labels,
    final_eval_scores,
    is_config_column,
    score_column,
    t_critical,
)

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


# --- App. D: the most clipped tokens ---------------------------------------------------------------------------

CLIPPED_TOKENS_FILE = "clipped_tokens.csv"
CLIPPED_TOKEN_COLUMNS = ("sign", "rank", "token_id", "token", "clipped", "seen", "clipped_share")
CLIPPED_TOP = 50  # P-DPPO App. D lists 50 tokens per sign of A
_SIGN_HEADS = {"pos": "A > 0", "neg": "A < 0"}


def read_clipped_tokens(run_dir: Path | str) -> pd.DataFrame | None:
    """A run's clipped_tokens.csv (None when it has none); the token text is read verbatim ("nan", "" stay text).

    A file without the expected columns raises ValueError naming the file and what it lacks.
    """
    path = Path(run_dir) / CLIPPED_TOKENS_FILE
    if not path.is_file():
        return None
    df = pd.read_csv(path, dtype={"token": str, "sign": str}, keep_default_na=False, na_values={"clipped_share": [""]})
    missing = [c for c in CLIPPED_TOKEN_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: no column {', '.join(missing)}")
    return df


def clipped_token_table(
    runs: pd.DataFrame, *, arms: Sequence[str] | None = None, top: int = CLIPPED_TOP
) -> tuple[pd.DataFrame, list[str]]:
    """P-DPPO App. D over the runs of each arm: per arm and sign of A, the `top` token ids clipped most often.

    `runs`: one row per run (`run` = its directory, plus config columns). Per token id, `clipped` and `seen` are
    summed over the arm's runs whose clipped_tokens.csv lists it, `clipped_share` = clipped / seen of those sums,
    and `runs` counts them. Each run's file holds only its own top 50, so a token that missed a run's list adds
    nothing from that run: the sums are lower bounds for tokens near the cut. Rank 1 = most clipped (ties: higher
    share, then lower token id). Returns (table, runs without a usable file); W&B runs count as without.
    """
    arms = list(arm_columns(runs) if arms is None else arms)
    frames, without = [], []
    for _, row in runs.iterrows():
        run = str(row["run"])
        try:
            df = None if run.startswith("wandb:") else read_clipped_tokens(run)
        except (ValueError, pd.errors.ParserError) as exc:
            logging.getLogger(__name__).warning("%s; its clipped tokens are left out", exc)
            df = None
        if df is None or df.empty:
            without.append(run)
            continue
        frames.append(df.assign(run=run, arm=_arm_label(row, arms)))
    cols = ["arm", "sign", "rank", "token_id", "token", "clipped", "seen", "clipped_share", "runs"]
    if not frames:
        return pd.DataFrame(columns=cols), without
    rows = pd.concat(frames, ignore_index=True)
    g = rows.groupby(["arm", "sign", "token_id"], sort=False)
    agg = g.agg(token=("token", "first"), clipped=("clipped", "sum"), seen=("seen", "sum"), runs=("run", "nunique"))
    agg = agg.reset_index()
    agg["clipped_share"] = agg["clipped"] / agg["seen"].where(agg["seen"] > 0)
    agg["sign_order"] = agg["sign"].map({"pos": 0, "neg": 1}).fillna(2)
    agg = agg.sort_values(
        ["arm", "sign_order", "clipped", "clipped_share", "token_id"], ascending=[True, True, False, False, True]
    )
    agg["rank"] = agg.groupby(["arm", "sign"]).cumcount() + 1
    agg = agg[agg["rank"] <= top]
    return agg[cols].reset_index(drop=True), without


def _arm_label(row: pd.Series, arms: Sequence[str]) -> str:
    return str(arm_labels(row.to_frame().T, arms).iloc[0])


def _token_cell(token: str) -> str:
    """A token's text with its spaces and newlines visible, safe inside a Markdown table cell."""
    return json.dumps(token, ensure_ascii=False).replace("|", "\\|")


def clipped_tokens_markdown(table: pd.DataFrame, title: str = "") -> str:
    """One section per arm, one table per sign of A: rank, token, id, clipped, seen, share, runs listing it."""
    lines = [f"# {title}: most clipped tokens (P-DPPO App. D)" if title else "# Most clipped tokens (App. D)", ""]
    lines += [
        "Tokens of A != 0 whose gradient weight was exactly 0 (masked or clipped by the trust region), summed over",
        "the arm's runs from each run's `clipped_tokens.csv` (its 50 most clipped per sign). share = clipped / seen;",
        "runs = how many of the arm's runs list the token (a run that did not list it adds nothing).",
        "",
    ]
    for arm, sub in table.groupby("arm", sort=True):
        lines += [f"## {arm}", ""]
        for sign in [s for s in ("pos", "neg") if s in set(sub["sign"])] + sorted(set(sub["sign"]) - {"pos", "neg"}):
            part = sub[sub["sign"] == sign]
            lines += [f"### {_SIGN_HEADS.get(sign, sign)}", ""]
            lines += ["| rank | token | id | clipped | seen | share | runs |", "|---|---|---|---|---|---|---|"]
            for _, r in part.iterrows():
                share = "–" if pd.isna(r["clipped_share"]) else f"{r['clipped_share']:.3f}"
                lines.append(
                    f"| {r['rank']} | {_token_cell(r['token'])} | {r['token_id']} | {r['clipped']} | {r['seen']} "
                    f"| {share} | {r['runs']} |"
                )
            lines.append("")
    return "\n".join(lines)


def write_clipped_tokens(table: pd.DataFrame, out_dir: Path | str, title: str) -> list[Path]:
    """clipped_tokens.md (the App. D tables) and clipped_tokens.csv (the same numbers) in `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "clipped_tokens.md", out_dir / "clipped_tokens.csv"]
    paths[0].write_text(clipped_tokens_markdown(table, title))
    table.to_csv(paths[1], index=False)
    return paths
