"""Run directories -> tidy DataFrames (STYLE rule 7: runs describe themselves, analysis stays offline).

A run directory is any folder holding `.hydra/config.yaml` plus `metrics.jsonl` or `summary.json` (a run that
failed while its config was validated has no metrics but must still be listed). See DESIGN.md "Run directory".

Each frame carries a `run` id (the directory path as found under its root) and the run's config flattened with
`pd.json_normalize` (`objective.name`, `precision.name`, `trainer.lr`, `seed`, `name` = experiment, ...):
- `metrics`: one row per run and optimizer step (metrics.jsonl),
- `evals`: one row per run and evaluation (eval.jsonl; step 0 is the evaluation before training),
- `summaries`: one row per run, failed ones included (summary.json plus `status`, `n_steps`, `load_error`).
`RunSet.tidy()` joins the first two into the one frame of DESIGN.md: one row per run and step, every metric,
eval scores as `eval/<benchmark>/<key>` (W&B's names), and the short columns `experiment`, `objective`,
`precision`, `model` next to the dotted config keys.

A root spelled `wandb:<entity>/<project>` is read through the W&B public API instead (runs mirrored by RunLog:
group = experiment, job_type = train | eval, the whole config under `cfg`; harness/loop/wandb_run.py) and gives
frames of the same shape; only that path needs a network.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import OmegaConf
from tqdm import tqdm

from harness.rundir.files import read_jsonl

logger = logging.getLogger(__name__)

DEFAULT_ROOTS = ("outputs", "multirun")
CONFIG = Path(".hydra") / "config.yaml"
# Folders inside a run that never hold another run: walking them (checkpoints, W&B files) only costs time.
_NO_RUNS_INSIDE = {"checkpoints", "wandb", ".hydra", "__pycache__"}
WANDB_PREFIX = "wandb:"
# Short names for the config keys every comparison is sliced by (the dotted keys stay too).
ALIASES = {"experiment": "name", "objective": "objective.name", "precision": "precision.name", "model": "model.name"}
# Keys every current config has; an older one without them still loads, with the gap named once.
EXPECTED_CONFIG = ("seed", "objective.name", "precision.name", "model.name")
# Groups that older configs wrote as a bare name (`objective: grpo`) instead of a mapping with `name`.
_GROUPS_ONCE_PLAIN = ("objective", "precision", "model", "rollout", "data", "benchmark")
# W&B run states -> RunLog statuses, for runs whose W&B summary never got RunLog's final status (killed hard).
_WANDB_STATES = {"finished": "completed", "running": "running", "crashed": "failed", "failed": "failed",
                 "killed": "failed", "preempted": "preempted"}  # fmt: skip


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
            if "name" not in df.columns:  # an empty frame (no run logged evaluations, say) has no columns to pick by
                return df
            return df[df["name"].astype(str) == name].reset_index(drop=True)

        return RunSet(pick(self.metrics), pick(self.evals), pick(self.summaries), self.config_columns)

    def tidy(self) -> pd.DataFrame:
        """One row per run and step: every training metric, every numeric eval value as `eval/<benchmark>/<key>`
        (the evaluation before training is the step-0 row), and the config columns."""
        ev = self.evals
        key_cols = {"run", "step", "benchmark", *self.config_columns, *ALIASES}
        values = [c for c in ev.columns if c not in key_cols and pd.api.types.is_numeric_dtype(ev[c])]
        wide = pd.DataFrame(columns=["run", "step"])
        if not ev.empty and values:
            prefix = pd.Series("eval/", index=ev.index)
            if "benchmark" in ev.columns:
                prefix = prefix.where(ev["benchmark"].isna(), "eval/" + ev["benchmark"].astype(str) + "/")
            long = ev[["run", "step", *values]].assign(prefix=prefix)
            long = long.melt(id_vars=["run", "step", "prefix"], value_vars=values, var_name="key").dropna()
            long["key"] = long["prefix"] + long["key"]
            wide = long.pivot_table(index=["run", "step"], columns="key", values="value", aggfunc="last")
            wide = wide.reset_index().rename_axis(columns=None)
        config = [c for c in self.summaries.columns if c in self.config_columns or c in ALIASES]
        train = self.metrics.drop(columns=[c for c in config if c in self.metrics.columns])
        if "step" not in train.columns:  # only evaluations (an eval-only run): the rows come from them alone
            train = pd.DataFrame(columns=["run", "step"])
        out = train.merge(wide, on=["run", "step"], how="outer") if not wide.empty else train
        out = out.merge(self.summaries[["run", *config]], on="run", how="left")
        out["step"] = out["step"].astype(int)
        return out.sort_values(["run", "step"], kind="stable").reset_index(drop=True)

    @staticmethod
    def concat(sets: Sequence[RunSet]) -> RunSet:
        """The runs of several RunSets (local folders and W&B projects) as one."""
        columns = list(dict.fromkeys(c for rs in sets for c in rs.config_columns))

        def cat(frames: list[pd.DataFrame]) -> pd.DataFrame:
            frames = [f for f in frames if not f.empty]
            return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["run"])

        return RunSet(
            cat([rs.metrics for rs in sets]),
            cat([rs.evals for rs in sets]),
            cat([rs.summaries for rs in sets]),
            columns,
        )


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


def flatten_config(tree: Mapping[str, Any]) -> dict[str, Any]:
    """A nested config as dotted keys; lists and mappings left at the leaves become JSON text (hashable cells)."""
    flat = pd.json_normalize(dict(tree), sep=".").iloc[0].to_dict() if tree else {}
    return {k: json.dumps(v) if isinstance(v, list | dict) else v for k, v in flat.items()}


def load_config(path: Path) -> dict[str, Any]:
    """The run's config flattened to dotted keys; lists become JSON text so that every cell is hashable."""
    cfg = OmegaConf.load(path)
    try:
        tree = OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # Hydra-only resolvers (${hydra:...}, ${now:...}) cannot resolve offline: keep the text
        tree = OmegaConf.to_container(cfg, resolve=False)
    if not isinstance(tree, dict):
        raise ValueError(f"{path}: expected a mapping at the top level, got {type(tree).__name__}")
    return flatten_config(tree)


def upgrade_config(cfg: dict[str, Any], where: str) -> dict[str, Any]:
    """Today's keys for a config written by an older version, with one warning naming what was guessed.

    A group written as a bare name (`objective: grpo`) becomes `objective.name`; an expected key that is absent
    is set to None, so the run still plots (its label shows `<missing>`) instead of vanishing.
    """
    cfg = dict(cfg)
    notes = []
    for group in _GROUPS_ONCE_PLAIN:
        if isinstance(cfg.get(group), str) and f"{group}.name" not in cfg:
            cfg[f"{group}.name"] = cfg.pop(group)
            notes.append(f"`{group}: <name>` read as {group}.name")
    missing = [k for k in EXPECTED_CONFIG if k not in cfg]
    if missing:
        cfg.update(dict.fromkeys(missing))
        notes.append(f"no {', '.join(missing)} (shown as <missing>)")
    if notes:
        logger.warning("%s: config from an older version: %s", where, "; ".join(notes))
    return cfg


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
    return _flat_summary(summary)


def _flat_summary(summary: Mapping[str, Any]) -> dict[str, Any]:
    # Nested values (the W&B block) stay JSON text: dotted names are reserved for config columns.
    flat = {k: json.dumps(v) if isinstance(v, list | dict) else v for k, v in summary.items()}
    flat.setdefault("status", "missing")
    return flat


def _experiment_from_path(run_dir: Path, root: Path) -> str:
    rel = run_dir.relative_to(root).parts
    return rel[0] if len(rel) > 1 else "default"


@dataclass
class RunRecord:
    """One run as read from its source, before the frames are built."""

    run: str
    config: dict[str, Any]
    summary: dict[str, Any]
    metrics: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    load_error: str | None = None


def load_runs(roots: Sequence[Path | str] = DEFAULT_ROOTS, include_failed: bool = False) -> RunSet:
    """Load every run under `roots` (default `outputs/` and `multirun/`); a `wandb:<entity>/<project>` root is
    read from W&B (see `load_wandb`), a `trl:<path>` or `verl:<path>` root is one run of those frameworks
    (analysis/external.py).

    A torn last JSONL line is skipped with a warning; a run whose files cannot be read at all is kept in
    `summaries` with `load_error` set and left out of the curves, so one bad run never hides the rest.
    """
    from analysis.external import is_external

    local = [r for r in roots if not str(r).startswith(WANDB_PREFIX) and not is_external(r)]
    remote = [str(r) for r in roots if str(r).startswith(WANDB_PREFIX)]
    external = [str(r) for r in roots if is_external(r)]
    sets = [assemble(_local_runs(local), include_failed)] if local or not (remote or external) else []
    sets += [load_wandb(src, include_failed=include_failed) for src in remote]
    sets += [assemble([_external_run(spec)], include_failed) for spec in external]
    return sets[0] if len(sets) == 1 else RunSet.concat(sets)


def _external_run(spec: str) -> RunRecord:
    from analysis.external import read_external

    config, metrics, evals = read_external(spec)
    return RunRecord(spec, config, {"status": "completed" if metrics else "missing"}, metrics, evals)


def load(source: Path | str | Sequence[Path | str] = DEFAULT_ROOTS, include_failed: bool = False) -> pd.DataFrame:
    """The tidy frame of every run in `source`: a folder, `wandb:<entity>/<project>`, or a list of them."""
    roots = [source] if isinstance(source, str | Path) else list(source)
    return load_runs(roots, include_failed=include_failed).tidy()


def _local_runs(roots: Sequence[Path | str]) -> list[RunRecord]:
    runs: list[RunRecord] = []
    seen: set[Path] = set()
    for root in roots:
        # Hundreds of runs take a while to read: a bar on stderr, on a terminal only (make figures).
        for run_dir in tqdm(find_run_dirs([root]), desc=f"reading {root}", unit="run", leave=False, disable=None):
            if run_dir.resolve() in seen:  # overlapping roots (outputs and outputs/exp) list a run once
                continue
            seen.add(run_dir.resolve())
            try:
                cfg = load_config(run_dir / CONFIG)
            except Exception as exc:
                logger.warning("%s: unreadable config, run skipped: %s", run_dir / CONFIG, exc)
                continue
            if cfg.get("name") is None:
                cfg["name"] = _experiment_from_path(run_dir, Path(root))
                logger.warning(
                    "%s: no `name` in the config (older version?); experiment %r from the path", run_dir, cfg["name"]
                )
            item = RunRecord(
                str(run_dir), upgrade_config(cfg, str(run_dir)), _read_summary(run_dir / "summary.json"), [], []
            )
            try:
                item.metrics = _read_records(run_dir / "metrics.jsonl")
                item.evals = _read_records(run_dir / "eval.jsonl")
            except ValueError as exc:  # a bad line before the last one: corruption, not a crash mid-write
                logger.warning("%s: %s; run left out of the curves", run_dir, exc)
                item.load_error = str(exc)
                item.metrics, item.evals = [], []
            runs.append(item)
    return runs


def assemble(runs: list[RunRecord], include_failed: bool) -> RunSet:
    metrics, evals, rows = [], [], []
    config_keys: dict[str, None] = {}
    for item in runs:
        config_keys.update(dict.fromkeys(item.config))
        row: dict[str, Any] = {"run": item.run, **item.summary, "load_error": item.load_error}
        row.update(n_steps=len(item.metrics), n_evals=len(item.evals))
        rows.append((row, item.config))
        if item.load_error is None and (include_failed or row["status"] != "failed"):
            if item.metrics:
                metrics.append(pd.DataFrame(item.metrics).assign(run=item.run))
            if item.evals:
                evals.append(pd.DataFrame(item.evals).assign(run=item.run))

    configs = pd.DataFrame([{"run": r["run"], **c} for r, c in rows], columns=["run", *config_keys])
    summaries = pd.DataFrame([r for r, _ in rows])
    return RunSet(
        metrics=_with_config(metrics, configs),
        evals=_with_config(evals, configs),
        summaries=_with_config([summaries] if rows else [], configs, per_step=False),
        config_columns=list(config_keys),
    )


def _with_config(frames: list[pd.DataFrame], configs: pd.DataFrame, per_step: bool = True) -> pd.DataFrame:
    """Concatenate per-run frames and join the config columns; a clashing record key keeps its name. `per_step`
    frames (metrics, evals) are sorted by an integer `step`; in the one-row-per-run summaries `step` is only a
    field some runs have (an eval-only run's checkpoint step) and stays as it is."""
    if not frames:
        return pd.DataFrame(columns=["run", *configs.columns.drop("run")])
    data = pd.concat(frames, ignore_index=True)
    clash = [c for c in configs.columns if c != "run" and c in data.columns]
    cfg = configs.rename(columns={c: f"config.{c}" for c in clash})
    out = data.merge(cfg, on="run", how="left", validate="many_to_one")
    for short, key in ALIASES.items():
        if short not in out.columns and key in out.columns:
            out[short] = out[key]
    if per_step and "step" in out.columns:
        out["step"] = out["step"].astype(int)
        out = out.sort_values(["run", "step"], kind="stable").reset_index(drop=True)
    first = ["run", *[c for c in ("step",) if per_step and c in out.columns]]
    return out[first + [c for c in out.columns if c not in first]]


# --- W&B as a second source ------------------------------------------------------------------------------------


def parse_wandb_source(source: str) -> tuple[str, str]:
    """`wandb:<entity>/<project>` -> (entity, project); anything else fails with the expected spelling."""
    path = source.removeprefix(WANDB_PREFIX)
    parts = path.split("/")
    if not source.startswith(WANDB_PREFIX) or len(parts) != 2 or not all(parts):
        raise ValueError(f"W&B source {source!r}: expected wandb:<entity>/<project>")
    return parts[0], parts[1]


def load_wandb(source: str, include_failed: bool = False, experiment: str | None = None) -> RunSet:
    """The runs of a W&B project (`wandb:<entity>/<project>`), optionally one experiment (W&B group), as the
    same frames `load_runs` gives for run directories. Needs the network and a W&B login."""
    entity, project = parse_wandb_source(source)
    import wandb  # only this path needs it, and importing it costs about a second

    api = wandb.Api(timeout=60)
    filters = {"group": experiment} if experiment else None
    records = []
    for run in api.runs(f"{entity}/{project}", filters=filters):
        records.append(
            {
                "id": run.id,
                "entity": entity,
                "project": project,
                "group": run.group,
                "job_type": run.job_type,
                "tags": list(run.tags or []),
                "state": run.state,
                "config": dict(run.config),
                "summary": dict(run.summary_metrics),
                # scan_history pages through every row (history() would downsample to 500 points).
                "history": list(run.scan_history()),
            }
        )
    return runset_from_wandb(records, include_failed=include_failed)


def runset_from_wandb(records: Iterable[Mapping[str, Any]], include_failed: bool = False) -> RunSet:
    """Runs as the W&B API returns them -> RunSet, the same frames as from their run directories.

    Each record: `id`, `entity`, `project`, `group`, `job_type`, `tags`, `state`, `config` (the logged config),
    `summary` (the run summary) and `history` (the rows of `scan_history()`: sparse dicts with `step`, `_step`,
    ..., training keys and `eval/<benchmark>/<key>`). RunLog mirrors each metrics line and each evaluation as
    its own row, so rows are told apart by their keys. A step logged twice (a resumed run that redid steps
    after its checkpoint) keeps its last row, as the run directory does.
    """
    runs = []
    for rec in records:
        run = f"{WANDB_PREFIX}{rec.get('entity')}/{rec.get('project')}/{rec['id']}"
        cfg = flatten_config(_unwrap_wandb_config(rec.get("config") or {}))
        if cfg.get("name") is None and rec.get("group"):
            cfg["name"] = rec["group"]  # RunLog's W&B group is the experiment name
        if cfg.get("name") is None:
            cfg["name"] = "default"
            logger.warning("%s: no experiment name in the config or the W&B group; using 'default'", run)
        legacy_job_type = rec.get("job_type") not in (None, "train", "eval")  # before train/eval: the objective
        if "objective.name" not in cfg and "objective" not in cfg and legacy_job_type:
            cfg["objective.name"] = rec["job_type"]
        summary = _flat_summary({k: v for k, v in (rec.get("summary") or {}).items() if not k.startswith("_")})
        if summary["status"] not in ("completed", "failed", "preempted"):
            summary["status"] = _WANDB_STATES.get(str(rec.get("state")), "missing")
        summary.setdefault("error", None)
        metrics, evals = split_wandb_history(rec.get("history") or [])
        runs.append(RunRecord(run, upgrade_config(cfg, run), summary, metrics, evals))
    return assemble(runs, include_failed)


def _unwrap_wandb_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The run's config as .hydra/config.yaml holds it. The API gives the logged values; a raw config-file dump
    wraps each as {"value": v, "desc": ...}. RunLog logs it under `cfg`, beside the top-level filter fields
    (`objective`, `seed`, ...: harness/loop/wandb_run.py); runs logged before that have it at the top."""
    items = {k: v for k, v in config.items() if not k.startswith("_")}  # _wandb: W&B's own bookkeeping
    wrapped = items and all(
        isinstance(v, dict) and "value" in v and set(v) <= {"value", "desc"} for v in items.values()
    )
    values = {k: v["value"] for k, v in items.items()} if wrapped else items
    return dict(values["cfg"]) if isinstance(values.get("cfg"), dict) else values


def _is_value(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and not (isinstance(v, float) and math.isnan(v))


def split_wandb_history(rows: Iterable[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """W&B history rows -> (metrics records, eval records) shaped like metrics.jsonl and eval.jsonl lines.

    Keys starting with `_` are W&B's own; non-numbers (the samples table) and NaN are dropped, since an absent
    key already reads as NaN. `eval/<benchmark>/<key>` goes back to {"benchmark": ..., "<key>": ...}.
    """
    metrics: dict[int, dict[str, Any]] = {}
    evals: dict[tuple[int, str | None], dict[str, Any]] = {}
    for row in rows:
        if not _is_value(row.get("step")):
            continue
        step = int(row["step"])
        values = {k: v for k, v in row.items() if k != "step" and not k.startswith("_") and _is_value(v)}
        train = {k: v for k, v in values.items() if not k.startswith("eval/")}
        if train:
            metrics[step] = {"step": step, **train}
        ev: dict[str | None, dict[str, Any]] = {}
        for k, v in values.items():
            if not k.startswith("eval/"):
                continue
            bench, _, key = k.removeprefix("eval/").partition("/")
            bench_or_none, key = (bench, key) if key else (None, bench)
            ev.setdefault(bench_or_none, {})[key] = v
        for bench_or_none, vals in ev.items():
            head = {"step": step} if bench_or_none is None else {"step": step, "benchmark": bench_or_none}
            evals[(step, bench_or_none)] = {**head, **vals}
    return [metrics[s] for s in sorted(metrics)], [evals[k] for k in sorted(evals, key=lambda k: (k[0], str(k[1])))]
