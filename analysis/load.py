"""Run directories -> tidy DataFrames (STYLE rule 7: runs describe themselves, analysis stays offline).

A run directory is any folder holding `.hydra/config.yaml` plus `metrics.jsonl` or `summary.json` (a run that
failed while its config was validated has no metrics but must still be listed). See DESIGN.md "Run directory".

Each frame carries a `run` id (the directory path as found under its root) and the run's config flattened with
`pd.json_normalize` (`objective.name`, `precision.name`, `trainer.lr`, `seed`, `name` = experiment, ...):
- `metrics`: one row per run and optimizer step (metrics.jsonl),
- `evals`: one row per run and evaluation (eval.jsonl; step 0 is the evaluation before training),
- `summaries`: one row per run, failed ones included (summary.json plus `status`, `n_steps`, `load_error`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import OmegaConf

from harness.runlog import read_jsonl

logger = logging.getLogger(__name__)

DEFAULT_ROOTS = ("outputs", "multirun")
CONFIG = Path(".hydra") / "config.yaml"
# Folders inside a run that never hold another run: walking them (checkpoints, W&B files) only costs time.
_NO_RUNS_INSIDE = {"checkpoints", "wandb", ".hydra", "__pycache__"}


@dataclass
class RunSet:
    """The runs found under some roots. `metrics` and `evals` leave out failed runs unless asked not to."""

    metrics: pd.DataFrame
    evals: pd.DataFrame
    summaries: pd.DataFrame
    config_columns: list[str] = field(default_factory=list)

    @property
    def experiments(self) -> list[str]:
        """Experiment names (the config's `name`), sorted."""
        if self.summaries.empty:
            return []
        return sorted(self.summaries["name"].dropna().astype(str).unique())

    @property
    def failed(self) -> pd.DataFrame:
        """Runs that did not give curves: status "failed" or a file that could not be read."""
        s = self.summaries
        if s.empty:
            return s
        return s[(s["status"] == "failed") | s["load_error"].notna()]

    def experiment(self, name: str) -> RunSet:
        """The runs of one experiment; an unknown name lists the valid ones."""
        if name not in self.experiments:
            raise ValueError(f"experiment {name!r} has no runs; experiments found: {', '.join(self.experiments)}")

        def pick(df: pd.DataFrame) -> pd.DataFrame:
            return df[df["name"].astype(str) == name].reset_index(drop=True)

        return RunSet(pick(self.metrics), pick(self.evals), pick(self.summaries), self.config_columns)


def find_run_dirs(roots: Iterable[Path | str]) -> list[Path]:
    """Every run directory under `roots` (missing roots are skipped), sorted."""
    found: list[Path] = []
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            here = Path(dirpath)
            if (here / CONFIG).is_file() and ("metrics.jsonl" in filenames or "summary.json" in filenames):
                found.append(here)
                dirnames.clear()  # a run never contains another run
                continue
            dirnames[:] = sorted(d for d in dirnames if d not in _NO_RUNS_INSIDE)
    return sorted(found)


def load_config(path: Path) -> dict[str, Any]:
    """The run's config flattened to dotted keys; lists become JSON text so that every cell is hashable."""
    cfg = OmegaConf.load(path)
    try:
        tree = OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # Hydra-only resolvers (${hydra:...}, ${now:...}) cannot resolve offline: keep the text
        tree = OmegaConf.to_container(cfg, resolve=False)
    if not isinstance(tree, dict):
        raise ValueError(f"{path}: expected a mapping at the top level, got {type(tree).__name__}")
    flat = pd.json_normalize(tree, sep=".").iloc[0].to_dict()
    return {k: json.dumps(v) if isinstance(v, list | dict) else v for k, v in flat.items()}


def _read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    records = read_jsonl(path)
    lines = sum(1 for line in path.read_bytes().split(b"\n") if line.strip())
    if lines > len(records):
        logger.warning("%s: skipped a torn last line (run still writing, or it crashed)", path)
    return records


def _read_summary(path: Path) -> dict[str, Any]:
    if not path.exists():
        logger.warning("%s missing: the run is still going or was killed; its curves are kept", path)
        return {"status": "missing"}
    try:
        summary = json.loads(path.read_text())
    except ValueError:
        logger.warning("%s is not valid JSON; the run's curves are kept", path)
        return {"status": "missing"}
    if not isinstance(summary, dict):
        logger.warning("%s is not a JSON object; the run's curves are kept", path)
        return {"status": "missing"}
    # Nested values (the W&B block) stay JSON text: dotted names are reserved for config columns.
    flat = {k: json.dumps(v) if isinstance(v, list | dict) else v for k, v in summary.items()}
    flat.setdefault("status", "missing")
    return flat


def _experiment_from_path(run_dir: Path, root: Path) -> str:
    rel = run_dir.relative_to(root).parts
    return rel[0] if len(rel) > 1 else "default"


def load_runs(roots: Sequence[Path | str] = DEFAULT_ROOTS, include_failed: bool = False) -> RunSet:
    """Load every run under `roots` (default `outputs/` and `multirun/`).

    A torn last JSONL line is skipped with a warning; a run whose files cannot be read at all is kept in
    `summaries` with `load_error` set and left out of the curves, so one bad run never hides the rest.
    """
    metrics, evals, rows = [], [], []
    config_keys: dict[str, None] = {}
    seen: set[Path] = set()
    for root in roots:
        for run_dir in find_run_dirs([root]):
            if run_dir.resolve() in seen:  # overlapping roots (outputs and outputs/exp) list a run once
                continue
            seen.add(run_dir.resolve())
            run = str(run_dir)
            try:
                cfg = load_config(run_dir / CONFIG)
            except Exception as exc:
                logger.warning("%s: unreadable config, run skipped: %s", run_dir / CONFIG, exc)
                continue
            if "name" not in cfg or cfg["name"] is None:
                cfg["name"] = _experiment_from_path(run_dir, Path(root))
                logger.warning(
                    "%s: no `name` in the config (older version?); experiment %r from the path", run, cfg["name"]
                )
            config_keys.update(dict.fromkeys(cfg))
            summary = _read_summary(run_dir / "summary.json")
            row: dict[str, Any] = {"run": run, **summary, "load_error": None}
            try:
                m = _read_records(run_dir / "metrics.jsonl")
                e = _read_records(run_dir / "eval.jsonl")
            except ValueError as exc:  # a bad line before the last one: corruption, not a crash mid-write
                logger.warning("%s: %s; run left out of the curves", run, exc)
                row["load_error"] = str(exc)
                m, e = [], []
            row.update(n_steps=len(m), n_evals=len(e))
            rows.append((row, cfg))
            if row["load_error"] is None and (include_failed or row["status"] != "failed"):
                if m:
                    metrics.append(pd.DataFrame(m).assign(run=run))
                if e:
                    evals.append(pd.DataFrame(e).assign(run=run))

    configs = pd.DataFrame([{"run": r["run"], **c} for r, c in rows], columns=["run", *config_keys])
    summaries = pd.DataFrame([r for r, _ in rows])
    return RunSet(
        metrics=_with_config(metrics, configs),
        evals=_with_config(evals, configs),
        summaries=_with_config([summaries] if rows else [], configs),
        config_columns=list(config_keys),
    )


def _with_config(frames: list[pd.DataFrame], configs: pd.DataFrame) -> pd.DataFrame:
    """Concatenate per-run frames and join the config columns; a clashing record key keeps its name."""
    if not frames:
        return pd.DataFrame(columns=["run", *configs.columns.drop("run")])
    data = pd.concat(frames, ignore_index=True)
    clash = [c for c in configs.columns if c != "run" and c in data.columns]
    cfg = configs.rename(columns={c: f"config.{c}" for c in clash})
    out = data.merge(cfg, on="run", how="left", validate="many_to_one")
    if "step" in out.columns:
        out["step"] = out["step"].astype(int)
        out = out.sort_values(["run", "step"], kind="stable").reset_index(drop=True)
    first = ["run", *[c for c in ("step",) if c in out.columns]]
    return out[first + [c for c in out.columns if c not in first]]
