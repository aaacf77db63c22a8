"""Runs made with TRL or verl in the same frames as ours, so `make figures` draws them beside harness runs.

A root spelled `trl:<path>` or `verl:<path>` names one run, `#<experiment>` after it the experiment to draw it in
(default: `trl` or `verl`):
- trl: a TRL output folder, or one of its `checkpoint-<k>` folders, holding `trainer_state.json` (the Trainer's
  `log_history`, one entry per logging step); or the run's W&B offline folder (`report_to="wandb"`).
- verl: the JSONL that verl's file logger writes (`trainer.logger=[console,file]`, `VERL_FILE_LOGGER_PATH`), one
  `{"step": k, "data": {...}}` line per training step; or the run's W&B offline folder.

Their metric names are mapped to ours where the quantity is the same (TRL_NAMES, VERL_NAMES, with the source that
computes each: docs/metrics.md lists them); names already ours (a TRL run trained with harness.integrations.trl
logs `objective/*`) are kept; every other name keeps its own under `trl/` or `verl/`. Steps are the framework's
own: verl's training step is one rollout, as ours; TRL's is an optimizer step.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from analysis import wandb_offline
from harness.rundir.files import read_jsonl

PREFIXES = ("trl:", "verl:")
OURS = ("reward/", "rollout/", "mismatch/", "objective/", "optim/")

# TRL's GRPOTrainer (trl/trainer/grpo_trainer.py, `_generate_and_score_completions` and `_compute_loss`, which fill
# `self._metrics`) and transformers' Trainer (`loss`, `grad_norm`, `learning_rate`).
TRL_NAMES = {
    "reward": "reward/mean",  # mean reward over the step's completions
    "entropy": "rollout/entropy",  # mean token entropy of the policy on the completions
    "completions/mean_length": "rollout/response_len_mean",
    "clip_ratio/region_mean": "objective/masked_frac",  # tokens whose ratio the clip cut, over completion tokens
    "loss": "optim/loss",
    "grad_norm": "optim/grad_norm",
    "learning_rate": "optim/lr",
}
# verl: verl/trainer/ppo/metric_utils.py (`compute_data_metrics`: critic/score, response_length), the actor's
# update_policy (actor/*), verl/trainer/ppo/rollout_corr_helper.py (`compute_offpolicy_metrics`: kl = mean(log mu -
# log pi), k3_kl = mean(r - log r - 1), r = pi/mu: our k1 and k3) and verl/utils/debug/metrics.py
# (`calculate_debug_metrics`: |pi - mu| per token).
VERL_NAMES = {
    "critic/score/mean": "reward/mean",
    "response_length/mean": "rollout/response_len_mean",
    "actor/entropy": "rollout/entropy",
    "actor/pg_clipfrac": "objective/masked_frac",
    "actor/pg_loss": "optim/loss",
    "actor/grad_norm": "optim/grad_norm",
    "actor/lr": "optim/lr",
    "rollout_corr/kl": "mismatch/k1",
    "rollout_corr/k3_kl": "mismatch/k3",
    "training/rollout_probs_diff_mean": "mismatch/abs_prob_diff_mean",
    "training/rollout_probs_diff_max": "mismatch/abs_prob_diff_max",
}
# verl's validation: val-core/<data source>/<variable>/mean@<n> (the core variable: acc, else reward).
_VERL_EVAL = re.compile(r"val-core/(?P<bench>.+)/(?:acc|reward)/mean@(?P<n>\d+)")
_TRL_EVAL_PREFIX = "eval_"


def is_external(root: str | Path) -> bool:
    return str(root).startswith(PREFIXES)


def read_external(spec: str) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """One TRL or verl run (`trl:<path>[#experiment]`, `verl:<path>[#experiment]`): (config, metrics records,
    eval records), shaped like a run directory's config, metrics.jsonl and eval.jsonl (analysis.load wraps them)."""
    kind, _, rest = spec.partition(":")
    path_text, _, experiment = rest.partition("#")
    path = Path(path_text).expanduser()
    if not path.exists():
        raise ValueError(f"{spec}: {path} does not exist; expected {kind}:<run folder or file>[#<experiment>]")
    config: dict[str, Any] = {}
    if _is_wandb_folder(path):
        run = wandb_offline.read(path)
        rows = _trl_wandb_rows(run.history) if kind == "trl" else run.history
        config = {k: v for k, v in run.config.items() if not isinstance(v, dict | list)}  # TrainingArguments: flat
    elif kind == "trl":
        rows = _trl_history(path)
    else:
        rows = [{"step": r["step"], **r.get("data", {})} for r in read_jsonl(path)]
    config.update({"name": experiment or kind, "objective.name": kind})
    metrics, evals = _split(kind, rows)
    return config, metrics, evals


def _is_wandb_folder(path: Path) -> bool:
    return path.is_dir() and (any(path.glob("run-*.wandb")) or any(path.glob("**/offline-run-*/run-*.wandb")))


def _trl_wandb_rows(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A TRL run's W&B history as its log_history: transformers' WandbCallback logs each value as `train/<name>`
    (`eval/<name>` for `eval_<name>`) with the optimizer step in `train/global_step`, and TRL adds `profiling/*`
    timings in rows of their own; W&B's `_step` counts log calls, not steps."""
    rows = []
    for row in history:
        step = row.get("train/global_step")
        values = {}
        for key, value in row.items():
            if key.startswith("train/") and key != "train/global_step":
                values[key.removeprefix("train/")] = value
            elif key.startswith("eval/"):
                values[_TRL_EVAL_PREFIX + key.removeprefix("eval/")] = value
        if step is not None and values:
            rows.append({"step": step, **values})
    return rows


def _trl_history(path: Path) -> list[dict[str, Any]]:
    state = path / "trainer_state.json" if path.is_dir() else path
    if not state.exists():
        raise ValueError(f"trl:{path}: no trainer_state.json (a TRL output or checkpoint folder holds one)")
    return list(json.loads(state.read_text(encoding="utf-8")).get("log_history", []))


def _split(kind: str, rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Their rows -> (metrics records, eval records) in our names, one of each per step (TRL logs a step's training
    and evaluation values as separate entries)."""
    names = TRL_NAMES if kind == "trl" else VERL_NAMES
    metrics: dict[int, dict[str, Any]] = {}
    evals: dict[tuple[int, str], dict[str, Any]] = {}
    for row in rows:
        step = row.get("step", row.get("_step"))
        if not isinstance(step, int | float) or isinstance(step, bool):
            continue
        step = int(step)
        # Names already ours come last, so they win over a framework name mapped to the same one (a verl run with
        # our adapter logs objective/masked_frac and actor/pg_clipfrac, which counts over A = 0 tokens too).
        for key, value in sorted(row.items(), key=lambda item: item[0].startswith(OURS)):
            if key in ("step", "epoch") or key.startswith("_") or not _number(value):
                continue
            match = _VERL_EVAL.fullmatch(key) if kind == "verl" else None
            if match:
                evals.setdefault((step, match["bench"]), {"step": step, "benchmark": match["bench"]})[
                    f"avg@{match['n']}"
                ] = value
            elif kind == "trl" and key.startswith(_TRL_EVAL_PREFIX):
                evals.setdefault((step, "trl"), {"step": step, "benchmark": "trl"})[key.removeprefix("eval_")] = value
            else:
                ours = names.get(key, key if key.startswith(OURS) else f"{kind}/{key}")
                metrics.setdefault(step, {"step": step})[ours] = value
    return [metrics[s] for s in sorted(metrics)], [evals[k] for k in sorted(evals)]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value  # NaN: absent
