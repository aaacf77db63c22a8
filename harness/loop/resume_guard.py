"""What a run directory promises about its experiment: `run_config.json` records the validated config a run
started with (and Hydra's .hydra/ files of that start), and a resume must match it.

`trainer.resume=true` continues the same experiment or nothing: a config that differs in anything that changes
the experiment (objective and its hyperparameters, model, precision, data, lr, batch shape, seed, steps, ...) is
refused in one line that lists the differing keys, before any model is built and without touching the run
directory. A deliberate change is named in `trainer.resume_allow=[key, ...]` (a group name allows its keys) and
recorded in `resume_changes.jsonl`. Operational keys (threads, logging, drills, how often to evaluate or
checkpoint, a logged metric's threshold) may change freely.

Hydra writes the new command's .hydra/ files into the directory before any of our code runs; a refused resume
puts the recorded ones back, so the directory still describes the run it holds.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import zipfile
from pathlib import Path

import torch
from safetensors import safe_open

from harness.config import RunConfig, SetupError
from harness.errors import first_line
from harness.loop.checkpoint import CHECKPOINTS, complete_checkpoints
from harness.loop.sharded import is_sharded
from harness.rundir.files import atomic_write_json, atomic_write_text
from harness.rundir.record import CHANGES, RECORD, differences, show

HYDRA_FILES = ("config.yaml", "overrides.yaml", "hydra.yaml")


class ResumeRefused(SetupError):
    """This resume would not continue the run in the directory; nothing in it was changed."""


def guard(cfg: RunConfig, run_dir: Path, write: bool) -> None:
    """Before a training run builds anything: refuse a resume that cannot continue the directory's run, record
    allowed changes, and record the config of a run that starts fresh. `write`: this process writes the run
    directory (rank 0); the others check only, so every rank refuses alike."""
    resume = cfg.trainer.resume
    config = dataclasses.asdict(cfg)
    if resume and not _readable_checkpoint(run_dir, auto=resume == "auto", write=write):
        resume = False  # auto, and nothing to continue: a fresh start
    if not resume:
        log = run_dir / "metrics.jsonl"
        if cfg.trainer.resume is False and log.exists() and log.stat().st_size:  # checked before anything is written
            raise ResumeRefused(
                f"hydra.run.dir: {run_dir} already holds a run; continue it with trainer.resume=true, or choose a new "
                "directory"
            )
        if write:
            atomic_write_json(run_dir / RECORD, {"config": config, "hydra": _hydra_files(run_dir)})
        return
    path = run_dir / RECORD
    if not path.exists():  # a run started before run directories kept their config
        print(f"warning: {run_dir} has no {RECORD}; the resumed config cannot be compared", file=sys.stderr)
        return
    record = json.loads(path.read_text(encoding="utf-8"))
    changed = differences(record["config"], config)
    allowed = cfg.trainer.resume_allow
    refused = [k for k in changed if not any(k == a or k.startswith(f"{a}.") for a in allowed)]
    if refused:
        if write:
            _restore_hydra_files(run_dir, record.get("hydra", {}))
        shown = ", ".join(f"{k} {show(changed[k][0])} -> {show(changed[k][1])}" for k in refused)
        raise ResumeRefused(
            f"trainer.resume: the config differs from the run's in {run_dir} ({shown}); resume with the run's own "
            f"config, or allow a deliberate change with trainer.resume_allow=[{','.join(refused)}]"
        )
    if changed and write:
        line = json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "changes": changed}, default=list)
        with open(run_dir / CHANGES, "a", encoding="utf-8") as f:
            f.write(line + "\n")
        atomic_write_json(path, {"config": config, "hydra": _hydra_files(run_dir)})


def _readable_checkpoint(run_dir: Path, auto: bool, write: bool) -> bool:
    """Whether the run has a checkpoint that looks whole. When none does: without `auto` the resume is refused in
    one line naming what was tried; with it, False, after the unreadable ones are moved aside (kept, not deleted)."""
    found = [p for _, p in reversed(complete_checkpoints(run_dir / CHECKPOINTS))]
    bad = {p.name: why for p in found if (why := unreadable(p))}
    if len(bad) < len(found):
        return True
    if not auto:
        why = "; ".join(f"{name}: {reason}" for name, reason in bad.items())
        tried = f"no readable checkpoint ({why})" if bad else "no checkpoint"
        raise ResumeRefused(
            f"trainer.resume: {run_dir} has {tried} to resume from; run without trainer.resume, or with "
            "trainer.resume=auto to start fresh when there is none"
        )
    if bad and write:
        aside = run_dir / f"{CHECKPOINTS}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}"
        (run_dir / CHECKPOINTS).rename(aside)
        print(f"warning: no readable checkpoint in {run_dir} ({', '.join(bad)}): starting afresh; the files are kept "
              f"in {aside}", file=sys.stderr)  # fmt: skip
    return False


def _hydra_files(run_dir: Path) -> dict[str, str]:
    folder = run_dir / ".hydra"
    return {n: (folder / n).read_text(encoding="utf-8") for n in HYDRA_FILES if (folder / n).is_file()}


def _restore_hydra_files(run_dir: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        atomic_write_text(run_dir / ".hydra" / name, text)


def unreadable(folder: Path) -> str | None:
    """Why a checkpoint folder cannot be restored, found cheaply before any model is built (file headers: a
    truncated safetensors or zip file fails here; state.pt is read whole, it is small); None when it looks whole.
    A subtler corruption is found when it is loaded, and the previous checkpoint is tried (load_latest)."""
    try:
        if is_sharded(folder):
            torch.load(folder / "state.pt", map_location="cpu", weights_only=True)
            return None
        with safe_open(str(folder / "model.safetensors"), framework="pt", device="cpu"):
            pass
        zipfile.ZipFile(folder / "optimizer.pt").close()  # torch.save's format is a zip: its index is at the end
        torch.load(folder / "state.pt", map_location="cpu", weights_only=True)
    except Exception as e:  # any failure to read means the same: this one cannot be resumed from
        return first_line(e)
    return None
