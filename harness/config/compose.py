"""Hydra plumbing: the schemas in Hydra's ConfigStore, the resolvers run directories are named with, and the
compose API for code outside `run.py`.

The schemas are registered as `<group>_schema/<name>` (plain dicts generated from the dataclass defaults) so that
every field exists in the composed config and `group.key=value` overrides work without `+`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Any

from harness.config.run import GROUPS
from harness.objectives import FAMILIES

DIRNAME_FIRST = ("objective", "correction", "precision", "seed", "model", "rollout", "data", "benchmark")


def safe_dirname(overrides: str, job_num: int | str = 0, limit: int = 120) -> str:
    """A sweep job's folder name from its overrides: the axes a researcher sweeps first, no path separators,
    and short enough for any filesystem (a long list keeps its head plus a hash of the whole)."""

    def rank(item: str) -> int:
        head = item.split("=", 1)[0].split(".", 1)[0]
        return DIRNAME_FIRST.index(head) if head in DIRNAME_FIRST else len(DIRNAME_FIRST)

    items = sorted(filter(None, overrides.split(",")), key=rank)  # stable: Hydra's order within a rank
    name = ",".join(items).replace("/", "_").replace("\\", "_") or f"job{job_num}"
    if len(name) > limit:
        name = f"{name[: limit - 9]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"
    return name


STAMP_FORMAT = "%Y-%m-%d_%H-%M-%S"


def run_stamp(fmt: str = STAMP_FORMAT) -> str:
    """The time in a run directory's name: now, or the one rank 0 of a torchrun run shared
    (`harness.cli.checks.share_run_stamp`)."""
    return os.environ.get("HARNESS_RUN_STAMP") or time.strftime(fmt)


def register_schemas() -> None:
    """Put each schema's defaults into Hydra's ConfigStore so YAML options can extend them."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("safe_dirname"):
        OmegaConf.register_new_resolver("safe_dirname", safe_dirname)
    if not OmegaConf.has_resolver("run_stamp"):
        # Cached, as Hydra's own `now`: a sweep's directory is read again for every job and at the end, and Hydra
        # hands each job the launching config's resolver cache. Uncached, every job got a new second, so a sweep
        # scattered its jobs over several folders and its report counted none of them (exit code 0 on failures).
        OmegaConf.register_new_resolver("run_stamp", run_stamp, use_cache=True)

    cs = ConfigStore.instance()
    for group, schema in GROUPS.items():
        cs.store(group=f"{group}_schema", name=group, node=_defaults(schema))
    for family, (_, schema) in FAMILIES.items():
        cs.store(group="objective_schema", name=family, node=_defaults(schema))


def _defaults(schema: type) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(schema):
        value = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
# Hydra's compose API initialises one process-wide GlobalHydra: two threads inside `initialize_config_dir` at
# once fail ("already initialized"). The findings suite checks its runs' settings from its worker threads.
_COMPOSE_LOCK = threading.Lock()


def compose(*overrides: str, hydra_config: bool = False) -> dict[str, Any]:
    """The project's config composed with Hydra overrides, unresolved, outside `run.py` (tests, benchmarks, the
    findings suite's check of a run's recorded config, run.py's check of the command line's keys); with
    `hydra_config`, Hydra's own node too. Thread-safe."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    register_schemas()
    with _COMPOSE_LOCK, initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=list(overrides), return_hydra_config=hydra_config)
    return OmegaConf.to_container(cfg, resolve=False)
