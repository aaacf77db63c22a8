"""`python -m analysis [--roots outputs multirun | wandb:<entity>/<project> | trl:<dir> | verl:<file>] [--out figures]`:
every figure and table.

Writes figures/<experiment>/<figure>.png, figures/<experiment>/table.{md,csv,tex}, the token figures of runs that
saved tokens.parquet, figures/<experiment>/clipped_tokens.{md,csv} (App. D) from runs that wrote
clipped_tokens.csv, the analytic trust-region geometry once under figures/geometry/, and figures/index.md,
and prints each path (after a line per experiment as it starts, `[2/5] <name>: <n> runs (elapsed ...)`; reading
the runs shows a bar on a terminal). A figure whose data the runs did not log is skipped with a one-line note.
Training curves are Gaussian-smoothed (sigma = 2 steps, the papers' Figs 13-17) over the faded raw curve unless told
otherwise.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import pandas as pd

from analysis.figures import EVAL_FIGURES, METRIC_FIGURES, PAPER_SIGMA, SkipFigure, draw, save_figure
from analysis.geometry import TOKEN_FIGURES, TOKENS_FILE, load_tokens, write_analytic_figures
from analysis.load import ALIASES, DEFAULT_ROOTS, RunSet, load_runs
from analysis.stats import arm_columns
from analysis.tables import (
    CLIPPED_TOKENS_FILE,
    clipped_token_table,
    experiment_table,
    failed_runs_markdown,
    to_markdown,
    write_clipped_tokens,
    write_table,
)
from harness.objectives import OBJECTIVE_NAMES

GEOMETRY_DIR = "geometry"


def build_experiment(
    rs: RunSet, name: str, out_dir: Path, pdf: bool = False, smooth: int = 1, sigma: float = 0.0
) -> tuple[list[Path], pd.DataFrame | None]:
    """All figures and tables of one experiment's runs into `out_dir`; returns the files and the main table."""
    written: list[Path] = []
    jobs = [(stem, partial(draw, stem), rs.metrics, {"smooth": smooth, "sigma": sigma}) for stem in METRIC_FIGURES]
    jobs += [(stem, fn, rs.evals, {}) for stem, fn in EVAL_FIGURES.items()]
    for stem, fn, df, kw in jobs:
        if df.empty:
            print(f"skip {name}/{stem}: no {'eval.jsonl' if stem in EVAL_FIGURES else 'metrics.jsonl'} rows")
            continue
        try:
            fig = fn(df, title=name, **kw)
        except SkipFigure as exc:
            print(f"skip {name}/{stem}: {exc}")
            continue
        written += save_figure(fig, out_dir, stem, pdf=pdf)
    written += build_token_figures(rs, name, out_dir, pdf=pdf)
    written += build_clipped_tokens(rs, name, out_dir)
    if rs.metrics.empty and rs.evals.empty:
        print(f"skip {name}/table: no completed runs")
        return written, None
    table = experiment_table(rs.metrics, rs.evals)
    written += write_table(table, out_dir, name, failed=rs.failed)
    return written, table


def _plotted_runs(rs: RunSet) -> pd.DataFrame:
    """One row per run that has curves: `run` and its config columns."""
    plotted = set(rs.metrics["run"]) | set(rs.evals["run"])
    cols = ["run", *[c for c in rs.summaries.columns if c in rs.config_columns or c in ALIASES]]
    return rs.summaries.loc[rs.summaries["run"].isin(plotted), cols]


def build_clipped_tokens(rs: RunSet, name: str, out_dir: Path) -> list[Path]:
    """clipped_tokens.{md,csv}: P-DPPO App. D over each arm's runs (arms as in the figures)."""
    runs = _plotted_runs(rs)
    if runs.empty:
        return []
    arms = arm_columns(rs.metrics if not rs.metrics.empty else rs.evals)
    table, without = clipped_token_table(runs, arms=arms)
    if table.empty:
        print(f"skip {name}/clipped_tokens: no {CLIPPED_TOKENS_FILE} in its {len(runs)} runs")
        return []
    if without:
        print(f"note {name}/clipped_tokens: {len(without)} of {len(runs)} runs have no {CLIPPED_TOKENS_FILE}")
    return write_clipped_tokens(table, out_dir, name)


def build_token_figures(rs: RunSet, name: str, out_dir: Path, pdf: bool = False) -> list[Path]:
    """The tokens.parquet figures of the runs that have curves; a run without the file costs one summary line."""
    runs = _plotted_runs(rs)
    if runs.empty:
        return []
    tokens, without = load_tokens(runs)
    if tokens.empty:
        print(f"skip {name}/tokens_*: no {TOKENS_FILE} in its {len(runs)} runs")
        return []
    if without:
        print(f"note {name}/tokens_*: {len(without)} of {len(runs)} runs have no {TOKENS_FILE}")
    written: list[Path] = []
    for stem, fn in TOKEN_FIGURES.items():
        try:
            fig = fn(tokens, title=name)
        except SkipFigure as exc:
            print(f"skip {name}/{stem}: {exc}")
            continue
        written += save_figure(fig, out_dir, stem, pdf=pdf)
    return written


def write_index(
    rs: RunSet, out: Path, built: dict[str, tuple[list[Path], pd.DataFrame | None]], geometry: Sequence[Path] = ()
) -> Path:
    """figures/index.md: per experiment the run counts, the table, links to the figures and the failed runs."""
    lines = ["# Figures and tables", "", "Made by `make figures` (`python -m analysis`) from the run directories.", ""]
    lines += ["Tables: mean ± half-width of the 95% Student-t interval over seeds (n seeds per row).", ""]
    for name, (paths, table) in built.items():
        sub = rs.experiment(name)
        lines += [f"## {name}", "", f"{len(sub.summaries)} runs, {len(sub.failed)} left out (failed).", ""]
        if table is not None:
            lines += [to_markdown(table), ""]
        lines += [f"- [{p.name}]({p.relative_to(out).as_posix()})" for p in paths if p.suffix in (".png", ".md")]
        if not sub.failed.empty:
            lines += ["", failed_runs_markdown(sub.failed)]
        lines.append("")
    pngs = [p for p in geometry if p.suffix == ".png"]
    if pngs:
        lines += ["## Trust-region geometry (analytic, every objective at its default hyper-parameters)", ""]
        lines += [f"- [{p.name}]({p.relative_to(out).as_posix()})" for p in pngs]
        lines.append("")
    path = out / "index.md"
    path.write_text("\n".join(lines))
    return path


def _safe(name: str) -> str:
    """A folder name for an experiment name (Hydra names are plain, but a `/` must not nest folders)."""
    return re.sub(r"[^A-Za-z0-9._=+-]", "_", name) or "default"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--roots",
        "--source",
        nargs="+",
        default=list(DEFAULT_ROOTS),
        help="folders holding run directories, wandb:<entity>/<project> to read a W&B project, or one TRL or verl "
        "run: trl:<folder>[#experiment], verl:<metrics.jsonl or W&B offline folder>[#experiment]",
    )
    parser.add_argument("--out", default="figures", help="output folder (default: figures)")
    parser.add_argument("--experiment", help="only this experiment (default: every one found)")
    parser.add_argument("--pdf", action="store_true", help="write a PDF next to each PNG")
    parser.add_argument(
        "--smooth", type=int, default=1, help="rolling mean over this many steps (training curves; instead of --sigma)"
    )
    parser.add_argument(
        "--sigma",
        type=float,
        help=f"Gaussian smoothing of training curves, in steps, over the faded raw curve (default {PAPER_SIGMA:g}, "
        "the papers'; 0 = raw curves; 0 when --smooth is given)",
    )
    parser.add_argument("--include-failed", action="store_true", help="plot failed runs too")
    parser.add_argument("--no-geometry", action="store_true", help="skip the analytic figures/geometry/")
    parser.add_argument(
        "--geometry-objectives", nargs="+", metavar="NAME", help="objectives for figures/geometry/ (default: all)"
    )
    args = parser.parse_args(argv)
    if args.smooth < 1:
        parser.error(f"--smooth={args.smooth} is not allowed; use 1 (none) or more steps")
    if args.sigma is not None and (args.sigma < 0 or (args.sigma > 0 and args.smooth > 1)):
        parser.error(f"--sigma={args.sigma:g}: use sigma >= 0, and not together with --smooth > 1")
    sigma = args.sigma if args.sigma is not None else (PAPER_SIGMA if args.smooth == 1 else 0.0)
    bad = [n for n in args.geometry_objectives or [] if n not in OBJECTIVE_NAMES]
    if bad:
        parser.error(f"--geometry-objectives: unknown {', '.join(bad)}; valid objectives: {', '.join(OBJECTIVE_NAMES)}")
    logging.basicConfig(level=logging.WARNING, format="warning: %(message)s")

    started = time.monotonic()
    rs = load_runs(args.roots, include_failed=args.include_failed)
    if rs.summaries.empty:
        print(f"no runs found under {', '.join(args.roots)}: nothing to plot")
        return 0
    print(f"read {len(rs.summaries)} runs of {len(rs.experiments)} experiments in {time.monotonic() - started:.0f} s")
    names = rs.experiments
    if args.experiment is not None:
        if args.experiment not in names:
            print(f"experiment {args.experiment!r} has no runs; experiments found: {', '.join(names)}", file=sys.stderr)
            return 2
        names = [args.experiment]
    out = Path(args.out)
    built: dict[str, tuple[list[Path], pd.DataFrame | None]] = {}
    for i, name in enumerate(names, 1):
        runs = len(rs.experiment(name).summaries)
        print(f"[{i}/{len(names)}] {name}: {runs} runs (elapsed {time.monotonic() - started:.0f} s)", flush=True)
        built[name] = build_experiment(
            rs.experiment(name), name, out / _safe(name), pdf=args.pdf, smooth=args.smooth, sigma=sigma
        )
        for p in built[name][0]:
            print(f"wrote {p}")
    geometry: list[Path] = []
    if not args.no_geometry:
        print(f"geometry: analytic figures (elapsed {time.monotonic() - started:.0f} s)", flush=True)
        geometry = write_analytic_figures(out / GEOMETRY_DIR, args.geometry_objectives)
        for p in geometry:
            print(f"wrote {p}")
    index = write_index(rs, out, built, geometry)
    print(f"wrote {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
