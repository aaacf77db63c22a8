"""Save and resume training state: model, optimizer, RNG streams and the trainer's own counters.

Layout under the run directory. One process (`save_checkpoint`):

    checkpoints/step_<k>/model.safetensors   model weights (tied weights stored once, see save_model)
    checkpoints/step_<k>/optimizer.pt        optimizer.state_dict()
    checkpoints/step_<k>/state.pt            {"step": k, "extra": {...}, "rng": {...}}
    checkpoints/latest                       the folder name of the newest checkpoint

Several processes (`save_sharded_checkpoint`): the model and optimizer as torch.distributed.checkpoint shards, one
file per rank written in parallel (harness.loop.sharded), and state.pt with every rank's RNG streams. Either format
loads under any number of processes: `load_latest` reads the folder it finds.

A checkpoint is written into a hidden temp folder and renamed into place, so a folder named step_<k> is
always complete; a crash mid-save leaves only a temp folder, which loading ignores and the next save removes.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file, save_model
from tqdm import tqdm

from harness.errors import first_line
from harness.loop import sharded
from harness.loop.rollouts import checkpoint_extra
from harness.lora import adapter_state_dict, is_lora
from harness.rundir.files import atomic_write_text, fsync_path

if TYPE_CHECKING:
    from harness.distributed import ProcessGroup
    from harness.loop.state import Run

logger = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
LATEST = "latest"
_TMP_PREFIX = ".tmp-"
_STEP_DIR = re.compile(r"step_(\d+)")


def save_checkpoint(
    run_dir: Path | str,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Any],
    keep: int = 2,
    pause_s: float = 0.0,
    model_state: dict[str, torch.Tensor] | None = None,
    optim_state: dict[str, Any] | None = None,
) -> Path:
    """Write checkpoints/step_<step>/, point `latest` at it, and keep only the newest `keep` checkpoints.

    `extra` holds whatever else the trainer needs to continue (data position, scheduler state, ...): plain
    Python values and tensors only, because loading uses torch.load(weights_only=True). `pause_s` (fault drills)
    waits after the files are written and before the rename, so a test can kill the process mid-save.

    A failed write (disk full, file-size limit) removes its temp folder and raises OSError naming the step; the
    checkpoints already on disk are untouched.

    `model_state` / `optim_state`, when given, are written instead of the modules' own state (a LoRA run passes
    its adapters alone).
    """
    _check_args(keep, extra)
    tmp = _new_temp(Path(run_dir) / CHECKPOINTS, step)
    try:
        if model_state is None:
            save_model(model, str(tmp / "model.safetensors"))
        else:
            _save_tensors(model_state, tmp / "model.safetensors")
        torch.save(optimizer.state_dict() if optim_state is None else optim_state, tmp / "optimizer.pt")
        torch.save({"step": int(step), "extra": extra, "rng": _rng_state()}, tmp / "state.pt")
        for f in tmp.iterdir():
            fsync_path(f)  # the data must be on disk before the rename makes the folder count as complete
    except Exception as e:  # OSError, torch.save's RuntimeError, safetensors' own error: all mean "not saved"
        shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(f"checkpoint step_{step} could not be written under {tmp.parent}: {first_line(e)}") from e
    return _publish(tmp, step, keep, pause_s)


def save_sharded_checkpoint(
    run_dir: Path | str,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Any],
    ranks: ProcessGroup,
    adapters_only: bool = False,
    keep: int = 2,
    pause_s: float = 0.0,
) -> Path | None:
    """`save_checkpoint` for a multi-process run, without gathering anything: every rank writes its own shards of
    the model and optimizer into one temp folder at once (torch.distributed.checkpoint), rank 0 adds state.pt
    (counters and every rank's RNG streams); after a barrier, rank 0 alone publishes the folder (rename, `latest`,
    pruning). A collective: every rank calls it. Returns the folder on rank 0, None on the others.

    A failed write on any rank removes the temp folder and raises OSError naming the step on every rank; the
    checkpoints already on disk are untouched. `adapters_only`: a LoRA run's model part holds its adapters."""
    _check_args(keep, extra)  # on every rank: one raising alone would leave the others waiting
    root = Path(run_dir) / CHECKPOINTS
    made: str | None = None
    if ranks.main:
        try:
            made = str(_new_temp(root, step))
        except OSError as e:
            made = f"error: {first_line(e)}"
    name = ranks.broadcast(made)  # every rank writes into the folder rank 0 made
    if name is None or name.startswith("error: "):
        raise OSError(f"checkpoint step_{step} could not be written under {root}: {(name or '')[7:]}")
    tmp = Path(name)
    rngs = ranks.gather_objects(_rng_state())
    error = ""
    try:
        fresh = sharded.save_shards(tmp, model, optimizer, adapters_only)
        if ranks.main:
            state = {"step": int(step), "extra": extra, "rng": rngs[0], "rng_ranks": rngs, "optimizer_fresh": fresh}
            torch.save(state, tmp / "state.pt")
            fsync_path(tmp / "state.pt")
    except Exception as e:  # DCP raises its CheckpointException on every rank when any rank failed to write
        error = first_line(e)
    failed = ranks.any(bool(error))  # the state.pt write is rank 0's alone
    if failed:
        if ranks.main:
            shutil.rmtree(tmp, ignore_errors=True)
        ranks.barrier()
        raise OSError(f"checkpoint step_{step} could not be written under {root}: {error or 'another rank failed'}")
    ranks.barrier()  # every shard is on disk before the rename makes the folder count as complete
    return _publish(tmp, step, keep, pause_s) if ranks.main else None


def _check_args(keep: int, extra: dict[str, Any]) -> None:
    if keep < 1:
        raise ValueError(f"checkpoint keep={keep} is not allowed; keep at least 1")
    _check_plain(extra, "extra")


def _new_temp(root: Path, step: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(_TMP_PREFIX + "*"):  # left by a save that crashed before its rename
        shutil.rmtree(stale, ignore_errors=True)
    return Path(tempfile.mkdtemp(dir=root, prefix=f"{_TMP_PREFIX}step_{step}-"))


def _publish(tmp: Path, step: int, keep: int, pause_s: float) -> Path:
    """Rename the complete temp folder to step_<step>, point `latest` at it, prune. `pause_s` (fault drills) waits
    before the rename, so a test can kill the process mid-save."""
    if pause_s:
        time.sleep(pause_s)
    root = tmp.parent
    final = root / f"step_{step}"
    if final.exists():  # the same step saved again after a resume: the new state replaces it
        final.rename(root / f"{_TMP_PREFIX}replaced-{final.name}")
    os.replace(tmp, final)
    fsync_path(root)
    atomic_write_text(root / LATEST, final.name + "\n")

    # Checkpoints past `step` come from an abandoned future (we resumed from an earlier one): drop them,
    # then keep the newest `keep` of the rest.
    older = [p for s, p in complete_checkpoints(root) if s <= step]
    for s, p in complete_checkpoints(root):
        if s > step or p in older[:-keep]:
            shutil.rmtree(p)
    for stale in root.glob(_TMP_PREFIX + "*"):
        shutil.rmtree(stale, ignore_errors=True)
    return final


def _save_tensors(state: dict[str, torch.Tensor], path: Path) -> None:
    """A state dict in save_model's layout: a tensor shared under two names (a tied head) stored once, the other
    name kept in the metadata as an alias of it."""
    kept: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[int, int], str] = {}
    for name, t in state.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        if key in seen and t.numel():
            aliases[name] = seen[key]
        else:
            seen[key] = name
            kept[name] = t.detach().contiguous()
    save_file(kept, str(path), metadata=aliases)


Restore = Callable[[dict[str, torch.Tensor], Any], None]


def load_latest(
    run_dir: Path | str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    restore: Restore | None = None,
    adapters_only: bool = False,
) -> dict[str, Any] | None:
    """Restore the newest readable checkpoint into `model` and `optimizer`, and restore the RNG streams.

    Either format, under any number of processes: a sharded checkpoint (`.metadata`) is resharded by
    torch.distributed.checkpoint to this process group (`adapters_only`: its model part is a LoRA run's adapters);
    a one-process checkpoint (model.safetensors) goes through `restore(tensors, optimizer_state)` when given (every
    rank reads the full tensors and keeps its shard, harness.distributed), else load_state_dict.
    Returns {"step": k, "extra": {...}, "path": Path} or None if there is no checkpoint. An unreadable
    checkpoint (truncated or corrupt file) costs one warning and the previous one is tried; a readable one
    that does not fit the model or optimizer raises ValueError, since an older one would not fit either.
    """
    root = Path(run_dir) / CHECKPOINTS
    candidates = load_order(root) if root.is_dir() else []
    for path in candidates:
        if sharded.is_sharded(path):
            loaded = _load_sharded(path, model, optimizer, adapters_only)
            if loaded is None:
                continue
            return loaded
        try:
            tensors, aliases, opt_state, state = _read(path)
        except Exception as e:  # any read failure (truncation, bad zip, missing file) means "try older"
            logger.warning("checkpoint %s is unreadable, trying the previous one: %s", path, first_line(e))
            continue
        for alias, kept in aliases.items():  # tied weights were saved once under the kept name
            if kept in tensors:
                tensors[alias] = tensors[kept]
        try:
            if restore is None:
                model.load_state_dict(tensors, strict=True)
                optimizer.load_state_dict(opt_state)
            else:  # a sharded model: the caller scatters the full tensors (harness.distributed.restore)
                restore(tensors, opt_state)
        except (RuntimeError, ValueError, KeyError) as e:
            raise ValueError(f"checkpoint {path} does not fit this model/optimizer: {first_line(e)}") from e
        _set_rng_state(state["rng"])
        return {"step": int(state["step"]), "extra": state["extra"], "path": path}
    if candidates:
        logger.warning("no readable checkpoint under %s; starting from scratch", root)
    return None


def _load_sharded(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, adapters_only: bool
) -> dict[str, Any] | None:
    """A sharded checkpoint into this process group; None (try the previous one) when its state.pt is unreadable.
    The shards load straight into the live tensors, so a failure there is an error, not a fallback."""
    try:
        state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
    except Exception as e:
        logger.warning("checkpoint %s is unreadable, trying the previous one: %s", path, first_line(e))
        return None
    try:
        sharded.load_shards(path, model, optimizer, adapters_only, fresh=bool(state.get("optimizer_fresh")))
    except Exception as e:  # DCP's CheckpointException: a missing key or shape, a truncated shard
        raise ValueError(f"checkpoint {path} could not be loaded into this model/optimizer: {first_line(e)}") from e
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    ranks = state.get("rng_ranks") or [state["rng"]]
    if rank < len(ranks):
        _set_rng_state(ranks[rank])
    else:  # more processes now than wrote it: this rank keeps its seeded streams
        logger.info("checkpoint %s holds RNG streams for %d ranks; rank %d keeps its own", path, len(ranks), rank)
    return {"step": int(state["step"]), "extra": state["extra"], "path": path}


def _read(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str], dict[str, Any], dict[str, Any]]:
    # Everything is read before anything is applied, so a bad file never leaves the model half-restored.
    with safe_open(str(path / "model.safetensors"), framework="pt", device="cpu") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        aliases = dict(f.metadata() or {})
    opt_state = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
    state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
    return tensors, aliases, opt_state, state


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete checkpoint under `root` (a run's checkpoints/), oldest first; temp folders
    do not match the name. Empty when there is no such folder."""
    if not root.is_dir():
        return []
    found = [(s, p) for p in root.iterdir() if p.is_dir() and (s := checkpoint_step(p)) is not None]
    return sorted(found)


def checkpoint_step(folder: Path) -> int | None:
    """k of a checkpoint folder named step_<k>; None for any other name (a temp folder, `latest`)."""
    m = _STEP_DIR.fullmatch(folder.name)
    return int(m.group(1)) if m else None


def load_order(root: Path) -> list[Path]:
    """The folder `latest` names first, then the rest newest first."""
    order = [p for _, p in reversed(complete_checkpoints(root))]
    pointer = root / LATEST
    if pointer.exists():
        named = root / pointer.read_text().strip()
        if named in order:
            order.remove(named)
            order.insert(0, named)
        else:
            logger.warning("%s names %s, which does not exist; using the newest checkpoint", pointer, named.name)
    return order


def _rng_state() -> dict[str, Any]:
    kind, key, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (kind, key.tolist(), pos, has_gauss, gauss),  # lists load under weights_only, arrays do not
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    kind, key, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.asarray(key, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            have = torch.cuda.device_count()
            logger.warning("CUDA RNG not restored: saved for %d devices, %d present", len(cuda), have)


def _check_plain(value: Any, where: str) -> None:
    """Reject what torch.load(weights_only=True) could not read back, at save time rather than at resume."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str | int):
                raise ValueError(f"{where}: key {k!r} must be a str or int")
            _check_plain(v, f"{where}[{k!r}]")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _check_plain(v, f"{where}[{i}]")
    elif not (value is None or isinstance(value, bool | int | float | str | torch.Tensor)):
        raise ValueError(
            f"{where}: a {type(value).__name__} cannot go in a checkpoint; allowed: numbers, str, bool, None, "
            "tensors, lists, tuples, dicts"
        )


# --- a run's checkpoints ---


def checkpoint(run: Run, step: int, pause_s: float = 0.0) -> None:
    """checkpoints/step_<step>. One process: safetensors + optimizer.pt. Several: every rank writes its own shards
    at once (torch.distributed.checkpoint), nothing is gathered; rank 0 publishes the folder."""
    extra = {"skipped_steps": run.skipped, "clipped_tokens": run.clipped.state(), **checkpoint_extra(run, step)}
    lora = is_lora(run.policy)  # the adapters only: the frozen base is the model the run started from
    keep = run.cfg.trainer.keep_checkpoints
    if run.ranks.main:
        run.log.sync()  # the logged lines up to this step are as durable as the checkpoint that follows them
    if run.ranks.active:
        save_sharded_checkpoint(
            run.run_dir,
            step,
            run.policy,
            run.optimizer,
            extra,
            run.ranks,
            adapters_only=lora,
            keep=keep,
            pause_s=pause_s,
        )
    else:
        weights = adapter_state_dict(run.policy.state_dict()) if lora else None
        save_checkpoint(run.run_dir, step, run.policy, run.optimizer, extra, keep, pause_s, model_state=weights)
    run.checkpointed = step


def checkpoint_or_warn(run: Run, step: int) -> None:
    """A scheduled checkpoint. A failed write (disk full, quota) leaves the older checkpoints intact: training goes
    on and the summary lists the step."""
    try:
        checkpoint(run, step, pause_s=run.cfg.trainer.checkpoint_pause_s)
    except OSError as exc:
        run.failed_saves.append(step)
        tqdm.write(f"warning: {exc}; training continues, the previous checkpoint is intact", sys.stderr)
