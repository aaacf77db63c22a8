"""How a run is mirrored to Weights & Biases: the settings and the mode they resolve to (no wandb import here:
analysis and the trainer both read these)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

WANDB_MODES = ("online", "offline", "disabled")
# Legacy spellings wandb itself still accepts in WANDB_MODE.
_ENV_MODE_ALIASES = {"dryrun": "offline", "run": "online"}


@dataclass
class WandbSettings:
    """How the run is mirrored to Weights & Biases (the local run directory is always written).

    Mode precedence: `mode` when set, else the WANDB_MODE environment variable, else "offline".
    "disabled" (or enabled=False) never imports wandb and writes nothing.
    """

    enabled: bool = True
    project: str = "trust-region-harness"
    entity: str | None = None
    mode: str | None = None
    group: str | None = None
    name: str | None = None
    job_type: str | None = None
    tags: list[str] = field(default_factory=list)
    # Top-level W&B config fields, for filters and group-by (harness/loop/wandb_run.py); the run's whole config
    # goes next to them under `cfg`.
    config: dict[str, Any] = field(default_factory=dict)
    # Bounds wandb.init's wait for the server (wandb's own default is 90 s, which stalls offline machines).
    init_timeout_s: float = 20.0
    # Bounds run.finish's final upload; unsent data stays on disk for `wandb sync`.
    finish_timeout_s: float = 60.0


def resolve_wandb_mode(settings: WandbSettings | None) -> str:
    """The mode W&B will run in: "online", "offline" or "disabled" (see WandbSettings for precedence)."""
    if settings is None or not settings.enabled:
        return "disabled"
    if settings.mode is not None:
        if settings.mode not in WANDB_MODES:
            raise ValueError(f"wandb mode={settings.mode!r} is not allowed; use one of {WANDB_MODES}")
        return settings.mode
    env = os.environ.get("WANDB_MODE", "").strip().lower()
    env = _ENV_MODE_ALIASES.get(env, env)
    if env and env not in WANDB_MODES:
        raise ValueError(f"WANDB_MODE={env!r} is not allowed; use one of {WANDB_MODES}")
    return env or "offline"
