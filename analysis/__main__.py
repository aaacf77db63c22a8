"""`python -m analysis [--roots outputs multirun] [--out figures]`: every figure and table for every experiment.

Writes figures/<experiment>/<figure>.png, figures/<experiment>/table.{md,csv,tex} and figures/index.md, and
prints each path. A figure whose metrics the runs did not log is skipped with a one-line note.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

import pandas as pd

from analysis.figures import EVAL_FIGURES, METRIC_FIGURES, SkipFigure, save_figure
from analysis.load import DEFAULT_ROOTS, RunSet, load_runs
from analysis.tables import experiment_table, failed_runs_markdown, to_markdown, write_table


def build_experiment(
    rs: RunSet, name: str, out_dir: Path, pdf: bool = False, smooth: int = 1
) -> tuple[list[Path], pd.DataFrame | None]:
    """All figures and the table of one experiment's runs into `out_dir`; returns the files and the table."""
    written: list[Path] = []
    jobs = [(stem, fn, rs.metrics, {"smooth": smooth}) for stem, fn in METRIC_FIGURES.items()]
    jobs += [(stem, fn, rs.evals, {}) for stem, fn in EVAL_FIGURES.items()]
    for stem, fn, df, kw in jobs:
        if df.empty:
            print(f"skip {name}/{stem}: no {'eval.jsonl' if fn in EVAL_FIGURES.values() else 'metrics.jsonl'} rows")
            continue
        try:
            fig = fn(df, title=name, **kw)
        except SkipFigure as exc:
            print(f"skip {name}/{stem}: {exc}")
            continue
        written += save_figure(fig, out_dir, stem, pdf=pdf)
    if rs.metrics.empty and rs.evals.empty:
        print(f"skip {name}/table: no completed runs")
        return written, None
    table = experiment_table(rs.metrics, rs.evals)
    written += write_table(table, out_dir, name, failed=rs.failed)
    return written, table


def write_index(rs: RunSet, out: Path, built: dict[str, tuple[list[Path], pd.DataFrame | None]]) -> Path:
    """figures/index.md: per experiment the run counts, the table, links to the figures and the failed runs."""
    lines = ["# Figures and tables", "", "Made by `make figures` (`python -m analysis`) from the run directories.", ""]
    for name, (paths, table) in built.items():
        sub = rs.experiment(name)
        lines += [f"## {name}", "", f"{len(sub.summaries)} runs, {len(sub.failed)} left out (failed).", ""]
        if table is not None:
            lines += [to_markdown(table), ""]
        lines += [f"- [{p.name}]({p.relative_to(out).as_posix()})" for p in paths if p.suffix in (".png", ".md")]
        if not sub.failed.empty:
            lines += ["", failed_runs_markdown(sub.failed)]
        lines.append("")
    path = out / "index.md"
    path.write_text("\n".join(lines))
    return path


def _safe(name: str) -> str:
    """A folder name for an experiment name (Hydra names are plain, but a `/` must not nest folders)."""
    return re.sub(r"[^A-Za-z0-9._=+-]", "_", name) or "default"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis", description=__doc__.splitlines()[0])
    parser.add_argument("--roots", nargs="+", default=list(DEFAULT_ROOTS), help="folders holding run directories")
    parser.add_argument("--out", default="figures", help="output folder (default: figures)")
    parser.add_argument("--pdf", action="store_true", help="write a PDF next to each PNG")
    parser.add_argument("--smooth", type=int, default=1, help="rolling mean over this many steps (training curves)")
    parser.add_argument("--include-failed", action="store_true", help="plot failed runs too")
    args = parser.parse_args(argv)
    if args.smooth < 1:
        parser.error(f"--smooth={args.smooth} is not allowed; use 1 (none) or more steps")
    logging.basicConfig(level=logging.WARNING, format="warning: %(message)s")

    rs = load_runs(args.roots, include_failed=args.include_failed)
    if rs.summaries.empty:
        print(f"no runs found under {', '.join(args.roots)}: nothing to plot")
        return 0
    out = Path(args.out)
    built: dict[str, tuple[list[Path], pd.DataFrame | None]] = {}
    for name in rs.experiments:
        built[name] = build_experiment(rs.experiment(name), name, out / _safe(name), pdf=args.pdf, smooth=args.smooth)
        for p in built[name][0]:
            print(f"wrote {p}")
    index = write_index(rs, out, built)
    print(f"wrote {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
