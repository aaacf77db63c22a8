"""How a run appears in W&B: its job type, name and group, and the top-level config fields dashboards filter by;
and what the loop adds to a live W&B run (the preempting mark, the trained policy as a model artifact).

- job_type: "train" or "eval" (`mode`), so grouping by job type never mixes evaluations in with training runs.
- name: what tells the run apart from the others of its experiment: the objective (an eval run: `eval-<benchmark>`)
  then the job's Hydra overrides, sorted by key, seed always included, e.g. `dppo-seed=2-trainer.lr=1e-4`.
  Overrides that change how a run is carried out or watched rather than what it computes (threads, logging,
  output folders, the experiment file itself: rundir.record.FREE and hydra.*) are left out; a path keeps only its
  last component, a nested group only its last part (`+experiment/arm=dppo_0.2` -> `arm=dppo_0.2`).
  Deterministic: no dates, no run-directory stamp.
- group: the experiment (`name` in the config, the output folder outputs/<name>/).
- config: `objective`, `precision`, `model`, `seed`, `experiment`, `benchmark` as plain top-level values, and the
  whole resolved config, nested as in `.hydra/config.yaml`, under `cfg` (analysis/load.py reads it back).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.config import RunConfig
from harness.errors import first_line
from harness.loop.runlog import NullLog, RunLog
from harness.rundir.record import FREE
from harness.rundir.wandb import WandbSettings

logger = logging.getLogger(__name__)

JOB_TYPES = ("train", "eval")
# Beyond rundir.record.FREE: Hydra's own settings and caches. `hydra` and FREE's keys cover their sub-keys too.
_NOT_IN_NAME = (*FREE, "hydra", "model.cache_dir")
# The experiment file is the group already; its arms (+experiment/arm=dppo_0.2) do tell runs apart.
_EXACT_NOT_IN_NAME = ("experiment",)
# W&B shows names in narrow columns; a longer one is cut and given a hash of the whole so it stays unique.
MAX_NAME_CHARS = 96


def job_type(cfg: RunConfig) -> str:
    return "eval" if cfg.mode == "eval" else "train"


def run_name(cfg: RunConfig, overrides: Sequence[str]) -> str:
    """`<objective | eval-<benchmark>>-<key=value>-...`: see the module docstring."""
    prefix, prefix_key = (f"eval-{cfg.benchmark.name}", "benchmark") if cfg.mode == "eval" else (
        cfg.objective.name, "objective")  # fmt: skip
    items = {"seed": str(cfg.seed)}  # the validated seed, whether or not the command line named it
    for override in overrides:
        if override.startswith("~"):  # a deletion names no value
            continue
        key, _, value = override.lstrip("+").partition("=")
        if key in ("seed", prefix_key, *_EXACT_NOT_IN_NAME) or _free(key):
            continue
        # A nested group shows its last part (arm=dppo_0.2), a path its last component (model.path=step_80).
        items[key.rsplit("/", 1)[-1]] = value.rstrip("/").rsplit("/", 1)[-1] if "/" in value else value
    name = "-".join([prefix, *(f"{k}={items[k]}" for k in sorted(items))])
    if len(name) <= MAX_NAME_CHARS:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:8]
    return f"{name[: MAX_NAME_CHARS - 9]}~{digest}"


def _free(key: str) -> bool:
    root = key.replace("/", ".")  # group overrides such as hydra/launcher=joblib
    return any(root == k or root.startswith(k + ".") for k in _NOT_IN_NAME)


def top_level_config(cfg: RunConfig) -> dict[str, Any]:
    """The fields a W&B filter or group-by names directly (`config.objective`, ...)."""
    return {
        "objective": cfg.objective.name,
        "precision": cfg.precision.name,
        "model": cfg.model.name,
        "seed": cfg.seed,
        "experiment": cfg.name,
        "benchmark": cfg.benchmark.name,
    }


def job_overrides() -> list[str]:
    """The running Hydra job's overrides (a sweep job's values plus the command line's); none outside Hydra (a run
    started from Python: its name is the objective and seed alone)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    return [str(o) for o in HydraConfig.get().overrides.task]


def wandb_settings(cfg: RunConfig) -> WandbSettings | None:
    """Job type, name, group and top-level config of the run in W&B (harness/loop/py)."""
    if cfg.logger.name == "none":
        return None
    return WandbSettings(
        enabled=True,
        project=cfg.logger.project,
        entity=cfg.logger.entity,
        mode=cfg.logger.mode,
        group=cfg.name,
        name=run_name(cfg, job_overrides()),
        job_type=job_type(cfg),
        tags=[cfg.model.name, cfg.precision.name],
        config=top_level_config(cfg),
        init_timeout_s=cfg.logger.init_timeout_s,
    )


def mark_preempting(log: RunLog | NullLog) -> None:
    """Tell W&B the run is being stopped from outside, so it shows as preempted rather than crashed."""
    if log.wandb_run is None:
        return
    try:
        log.wandb_run.mark_preempting()
    except Exception as e:  # summary.json says preempted either way
        logger.warning("W&B mark_preempting failed: %s", first_line(e))


def log_policy(log: RunLog | NullLog, folder: Path, step: int, score: float | None) -> None:
    """policy/final as a W&B model artifact, `policy-<run id>:final` (offline: staged in the run's wandb/ folder, sent
    by `wandb sync`). The files are referenced where they lie (policy "immutable": nothing rewrites a finished
    export), not copied. A failure costs one warning: the folder on disk is the policy."""
    run = log.wandb_run
    if run is None:
        return
    import wandb

    try:
        artifact = wandb.Artifact(f"policy-{run.id}", type="model", metadata={"step": step, "score": score})
        artifact.add_dir(str(folder), policy="immutable")
        run.log_artifact(artifact, aliases=["final", f"step-{step}"])
    except Exception as e:
        logger.warning("W&B model artifact failed (the policy is complete in %s): %s", folder, first_line(e))
