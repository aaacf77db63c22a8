"""The run directory (metrics.jsonl, eval.jsonl, samples.jsonl, summary.json) and its optional W&B mirror.

The JSONL files are the source of truth that analysis reads; W&B is a convenience copy. So W&B trouble
(no network, bad key, a hung server) costs one warning line and the run carries on logging locally.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.errors import first_line

logger = logging.getLogger(__name__)

JSONL_FILES = ("metrics.jsonl", "eval.jsonl", "samples.jsonl")
WANDB_MODES = ("online", "offline", "disabled")
# Legacy spellings wandb itself still accepts in WANDB_MODE.
_ENV_MODE_ALIASES = {"dryrun": "offline", "run": "online"}
# wandb.init first resolves the account with its own ~10 s request timeout, and only then starts the
# init_timeout clock, so the hang guard waits init_timeout_s plus this margin (measured: 10 s + timeout).
_INIT_GRACE_S = 15.0
_FINISH_GRACE_S = 15.0


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


class LogWriteError(RuntimeError):
    """A run-directory file (metrics, eval, samples, tokens, tables) could not be written: a full disk or a lost
    mount. Not an OSError, so the checkpoint path's own handling (skip one checkpoint, go on) never swallows it:
    the run stops, everything up to its newest checkpoint intact, and continues with trainer.resume=true."""

    def __init__(self, path: Path, error: OSError, step: int | None = None) -> None:
        at = "" if step is None else f" at step {step}"
        super().__init__(
            f"{path.name} could not be written{at} ({error.strerror or error}); the run stopped with everything up "
            "to its newest checkpoint intact: free space, then continue it with trainer.resume=true"
        )


@contextlib.contextmanager
def writing(path: Path, step: int | None = None) -> Iterator[None]:
    """OSError inside -> LogWriteError naming the file."""
    try:
        yield
    except OSError as e:
        raise LogWriteError(path, e, step) from e


# --- atomic files -------------------------------------------------------------------------------------------


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """Replace `path` with `data` so readers see the old or the new file, never a half-written one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_path(path.parent)  # makes the rename itself survive a power cut


def atomic_write_text(path: Path | str, text: str) -> None:
    """atomic_write_bytes of `text` as UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path | str, obj: Any) -> None:
    """atomic_write_text of `obj` as indented JSON; tensors/numpy become numbers and NaN/inf become null."""
    atomic_write_text(path, json.dumps(_finite(_to_python(obj, Path(path).name)), indent=2) + "\n")


def fsync_path(path: Path) -> None:
    """fsync a file or a folder (a folder's fsync makes renames inside it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- values ---------------------------------------------------------------------------------------------------


def _to_python(value: Any, where: str) -> Any:
    """Plain Python copy of `value`: tensors and numpy values become numbers (0-dim) or nested lists."""
    if isinstance(value, dict):
        return {str(k): _to_python(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_python(v, where) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if hasattr(value, "tolist"):  # torch.Tensor, numpy arrays and numpy scalars; works with requires_grad too
        return _to_python(value.tolist(), where)
    raise ValueError(
        f"{where}: cannot log a {type(value).__name__}; allowed: numbers, str, bool, None, tensors, numpy, lists, dicts"
    )


def _finite(value: Any) -> Any:
    """NaN and +-inf become None, because JSON has no spelling for them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _numbers(record: dict[str, Any]) -> dict[str, float | int]:
    """The numeric fields of a record, NaN kept, for W&B (which plots NaN as a gap and cannot plot strings)."""
    return {k: v for k, v in record.items() if isinstance(v, int | float) and not isinstance(v, bool)}


# --- JSONL reading --------------------------------------------------------------------------------------------


def _parse_jsonl(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Records of the complete lines and the byte length they span.

    A line is complete when it ends in a newline and parses; the last line may be torn (a crash mid-write,
    or null bytes after a power cut) and is left out. A bad line anywhere else is corruption: ValueError.
    """
    data = path.read_bytes()
    pieces = data.split(b"\n")  # the last piece is whatever follows the final newline: b"" or a torn line
    records: list[dict[str, Any]] = []
    good_end = pos = 0
    for i, piece in enumerate(pieces[:-1]):
        pos += len(piece) + 1
        if not piece.strip():
            good_end = pos
            continue
        try:
            records.append(json.loads(piece))
        except ValueError:
            if i == len(pieces) - 2 and not pieces[-1]:
                break  # the last line is garbage: torn, drop it
            raise ValueError(f"{path}: line {i + 1} is not valid JSON (only the last line may be torn)") from None
        good_end = pos
    return records, good_end


def read_jsonl(path: Path | str) -> list[dict[str, Any]]:
    """All complete records of a JSONL file; a torn last line (a run still writing, or a crash) is skipped."""
    return _parse_jsonl(Path(path))[0]


# --- the run log ----------------------------------------------------------------------------------------------


class RunLog:
    """Writes one run directory; mirrors it to W&B when enabled.

    Fresh run: RunLog(run_dir, wandb, config, resume=False) refuses a directory that already holds metrics.
    Resume: RunLog(..., resume=True) drops torn last lines, then the trainer calls truncate_after(k) with
    the step of the checkpoint it restored (-1 when there is none) before logging step k + 1.
    """

    def __init__(
        self, run_dir: Path | str, wandb_cfg: WandbSettings | None, config: dict[str, Any], resume: bool
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._t0 = time.monotonic()
        self._started_at = _now()
        self._files: dict[str, int] = {}  # file name -> an O_APPEND descriptor
        self._finished = False
        self._resumed_from: int | None = None
        self._last_step = -1

        previous: dict[str, Any] = {}
        for name in JSONL_FILES:
            path = self.run_dir / name
            if not path.exists() or path.stat().st_size == 0:
                continue
            if not resume:
                raise ValueError(f"{path} already exists; pass resume=True to continue that run or use a new dir")
            records, good_end = _parse_jsonl(path)
            if good_end < path.stat().st_size:
                logger.warning("%s: dropping a torn last line left by the previous session", path)
                os.truncate(path, good_end)
            if name == "metrics.jsonl" and records:
                self._last_step = int(records[-1]["step"])
        if resume and (self.run_dir / "summary.json").exists():
            try:
                previous = json.loads((self.run_dir / "summary.json").read_text())
            except ValueError:
                previous = {}  # only used to find the W&B run id again; a new W&B run is fine

        self._wandb_mode = resolve_wandb_mode(wandb_cfg)
        self._finish_timeout_s = wandb_cfg.finish_timeout_s if wandb_cfg else 0.0
        self._wandb_id: str | None = None
        self._write_summary("running")  # before W&B, so a crash during its init still reads as unfinished
        self._wandb = None
        if self._wandb_mode != "disabled":
            assert wandb_cfg is not None
            self._wandb = self._start_wandb(wandb_cfg, config, previous.get("wandb", {}).get("id"))
            if self._wandb is not None:
                self._wandb_id = self._wandb.id
                self._write_summary("running")

    # --- writing ---

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Append one optimizer step to metrics.jsonl (flushed, so a crash loses at most this line)."""
        step = int(step)
        if step <= self._last_step:
            raise ValueError(
                f"metrics step {step} is not after the last logged step {self._last_step}; "
                "on resume call truncate_after(<checkpoint step>) first"
            )
        record = self._record(step, metrics, "metrics")
        self._append("metrics.jsonl", [record], step)
        self._last_step = step
        self._mirror(_numbers(record))

    def log_eval(self, step: int, record: dict[str, Any]) -> None:
        """Append one evaluation ({"benchmark": ..., "avg@k": ..., ...}) to eval.jsonl."""
        rec = self._record(step, record, "eval record")
        self._append("eval.jsonl", [rec], step)
        prefix = f"eval/{rec['benchmark']}/" if isinstance(rec.get("benchmark"), str) else "eval/"
        nums = {k if k.startswith("eval/") else prefix + k: v for k, v in _numbers(rec).items() if k != "step"}
        self._mirror({"step": rec["step"], **nums})

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        """Append a few prompt/completion/reward rows to samples.jsonl, one line per row."""
        recs = [self._record(step, row, f"samples[{i}]") for i, row in enumerate(rows)]
        self._append("samples.jsonl", recs, step)
        if self._wandb is not None and recs:
            import wandb

            cols = list(dict.fromkeys(k for r in recs for k in r))
            data = [[_cell(r.get(c)) for c in cols] for r in recs]
            try:
                table = wandb.Table(columns=cols, data=data, allow_mixed_types=True)
            except Exception as e:  # the rows are safe on disk; W&B just won't show them
                self._drop_wandb("W&B table failed", e)
                return
            self._mirror({"step": int(step), "samples": table})

    def truncate_after(self, step: int) -> None:
        """Drop every record with step > `step` from the JSONL files (resuming from a checkpoint at `step`)."""
        self._close_files()
        for name in JSONL_FILES:
            path = self.run_dir / name
            if not path.exists():
                continue
            records = read_jsonl(path)
            kept = [r for r in records if r["step"] <= step]
            if len(kept) < len(records):
                atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))
        self._last_step = min(self._last_step, int(step))
        self._resumed_from = int(step)
        self._write_summary("running")

    def last_step(self) -> int:
        """The last step in metrics.jsonl, or -1 if there is none."""
        return self._last_step

    def finish(self, status: str, summary: dict[str, Any], error: str | None = None) -> None:
        """Write the final summary.json ("completed" or "failed") and close W&B.

        `summary` holds the scores the trainer tracked, e.g. {"best/eval/avg@k": .., "last/reward/mean": ..}.
        RunLog owns status, error, started_at, finished_at, wall_time_s, last_step, resumed_from_step, pid and
        wandb; keys of those names in `summary` are ignored.
        """
        if status not in ("completed", "failed"):
            raise ValueError(f"finish status={status!r} is not allowed; use 'completed' or 'failed'")
        if self._finished:
            raise RuntimeError(f"RunLog.finish called twice for {self.run_dir}")
        summary = _to_python(summary, "summary")  # a bad value raises here, while finish can still be retried
        self._finished = True
        try:
            self._close_files()
            self._write_summary(status, summary, error)
        except LogWriteError:
            if status == "completed":
                raise
            # Failing already (a full disk, most likely): the caller's error says why; summary.json keeps "running".
        except OSError as e:
            if status == "completed":
                raise LogWriteError(self.run_dir / "summary.json", e) from e
        if self._wandb is not None:
            self._finish_wandb(self._wandb, status, summary)
            self._wandb = None

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        # A crash (or Ctrl-C) inside the with-block still leaves summary.json saying "failed" and why.
        if not self._finished:
            if exc is None:
                self.finish("completed", {})
            else:
                self.finish("failed", {}, error=f"{type(exc).__name__}: {exc}")

    # --- internals ---

    def _record(self, step: int, fields: dict[str, Any], where: str) -> dict[str, Any]:
        if "step" in fields:
            raise ValueError(f"{where}: key 'step' is reserved; pass the step as the first argument")
        return {"step": int(step), **_to_python(fields, where)}

    def _append(self, name: str, records: list[dict[str, Any]], step: int) -> None:
        """One write of whole lines, unbuffered: a crash can tear only the last line, which readers skip, and a
        failed write (disk full) is cut back off the file, so it ends on a whole line and loses only this step."""
        data = "".join(json.dumps(_finite(r), allow_nan=False) + "\n" for r in records).encode("utf-8")
        path = self.run_dir / name
        with writing(path, step):
            fd = self._files.get(name)
            if fd is None:
                fd = self._files[name] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            start = os.lseek(fd, 0, os.SEEK_END)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            except OSError:
                os.ftruncate(fd, start)
                raise

    def sync(self) -> None:
        """fsync the appended files: called before a checkpoint is published, so the lines of every step up to it
        survive a power cut as the checkpoint does."""
        for name, fd in self._files.items():
            with writing(self.run_dir / name):
                os.fsync(fd)

    def _close_files(self) -> None:
        try:
            self.sync()
        finally:
            for fd in self._files.values():
                os.close(fd)
            self._files.clear()

    def _write_summary(self, status: str, summary: dict[str, Any] | None = None, error: str | None = None) -> None:
        core = {
            "status": status,
            "error": error,
            "started_at": self._started_at,
            "finished_at": None if status == "running" else _now(),
            "wall_time_s": round(time.monotonic() - self._t0, 3),
            "last_step": self._last_step,
            "resumed_from_step": self._resumed_from,
            "pid": os.getpid(),  # which process wrote this: a kill drill checks it hit the session it meant to
            "wandb": {"mode": self._wandb_mode, "id": self._wandb_id},
        }
        # The core fields are RunLog's to set; a same-named key from the caller is ignored rather than an
        # error, because failing here would lose the end of a finished run.
        extra = {k: v for k, v in (summary or {}).items() if k not in core}
        atomic_write_json(self.run_dir / "summary.json", {**core, **extra})

    def _start_wandb(self, cfg: WandbSettings, config: dict[str, Any], resume_id: str | None) -> Any:
        import wandb  # lazily: ~1 s to import, and runs with W&B disabled never need it

        # wandb.init runs in a thread so that a hang past its own timeouts cannot hold up training.
        box: dict[str, Any] = {"abandoned": False}
        lock = threading.Lock()

        def init() -> None:
            try:
                run = wandb.init(
                    project=cfg.project,
                    entity=cfg.entity,
                    group=cfg.group,
                    name=cfg.name,
                    job_type=cfg.job_type,
                    tags=list(cfg.tags) or None,
                    config={**cfg.config, "cfg": config},
                    dir=str(self.run_dir),
                    mode=self._wandb_mode,  # explicit, so it wins over WANDB_MODE inside wandb too
                    id=resume_id,
                    resume="allow" if resume_id else None,
                    reinit="create_new",  # never finish or reuse another run living in this process
                    settings=wandb.Settings(init_timeout=cfg.init_timeout_s, finish_timeout=cfg.finish_timeout_s),
                )
                run.define_metric("step")
                run.define_metric("*", step_metric="step")
            except Exception as e:  # any W&B failure means local-only logging, never a dead run
                box["error"] = e
                return
            with lock:
                if not box["abandoned"]:
                    box["run"] = run
                    return
            run.finish(exit_code=1)  # came back after we gave up on it: don't leave a stray run open

        thread = threading.Thread(target=init, name="runlog-wandb-init", daemon=True)
        thread.start()
        thread.join(cfg.init_timeout_s + _INIT_GRACE_S)
        with lock:
            box["abandoned"] = "run" not in box
        if "run" in box:
            return box["run"]
        reason = box.get("error")
        why = first_line(reason) if reason else f"no answer in {cfg.init_timeout_s + _INIT_GRACE_S:.0f} s"
        logger.warning("W&B (%s) unavailable, logging to %s only: %s", self._wandb_mode, self.run_dir, why)
        return None

    def _mirror(self, payload: dict[str, Any]) -> None:
        if self._wandb is None:
            return
        try:
            self._wandb.log(payload)
        except Exception as e:  # the local files already hold this step; stop mirroring, keep training
            self._drop_wandb("W&B log failed", e)

    def _drop_wandb(self, what: str, e: Exception) -> None:
        logger.warning("%s, mirroring stopped, logging locally only: %s", what, first_line(e))
        run, self._wandb = self._wandb, None
        # Finishing may wait on the network, so it happens off the training thread.
        threading.Thread(target=_quiet_finish, args=(run, 1, False), daemon=True).start()

    def _finish_wandb(self, run: Any, status: str, summary: dict[str, Any]) -> None:
        def finish() -> None:
            try:
                run.summary.update({**summary, "status": status})
            except Exception as e:
                logger.warning("W&B summary update failed (summary.json is complete): %s", first_line(e))
            _quiet_finish(run, 0 if status == "completed" else 1, warn=True)

        # finish_timeout bounds wandb's upload wait; the thread bounds everything else in finish.
        thread = threading.Thread(target=finish, name="runlog-wandb-finish", daemon=True)
        thread.start()
        thread.join(self._finish_timeout_s + _FINISH_GRACE_S)
        if thread.is_alive():
            logger.warning("W&B finish did not return; the local run directory %s is complete", self.run_dir)


def _quiet_finish(run: Any, exit_code: int, warn: bool) -> None:
    try:
        run.finish(exit_code=exit_code)
    except Exception as e:  # after a failed log the warning has been given already
        logger.log(logging.WARNING if warn else logging.DEBUG, "W&B finish failed: %s", first_line(e))


def _cell(value: Any) -> Any:
    # W&B tables want scalars; nested values are shown as their JSON text.
    return json.dumps(_finite(value)) if isinstance(value, dict | list) else value


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class NullLog:
    """The log of ranks 1..N-1 of a multi-process run: rank 0 alone writes the run directory and W&B."""

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        pass

    def log_eval(self, step: int, record: dict[str, Any]) -> None:
        pass

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        pass

    def truncate_after(self, step: int) -> None:
        pass

    def sync(self) -> None:
        pass

    def finish(self, status: str, summary: dict[str, Any], error: str | None = None) -> None:
        pass
