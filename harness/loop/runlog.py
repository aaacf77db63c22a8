"""The run directory (metrics.jsonl, eval.jsonl, samples.jsonl, summary.json) and its optional W&B mirror.

The JSONL files are the source of truth that analysis reads; W&B is a convenience copy. So W&B trouble
(no network, bad key, a hung server) costs one warning line and the run carries on logging locally.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import traceback
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.errors import first_line
from harness.preemption import PREEMPTED_EXIT_CODE
from harness.rundir.files import (
    JSONL_FILES,
    LogWriteError,
    atomic_write_json,
    atomic_write_text,
    finite,
    parse_jsonl,
    read_jsonl,
    to_python,
    writing,
)
from harness.rundir.wandb import WandbSettings, resolve_wandb_mode

logger = logging.getLogger(__name__)

# wandb.init first resolves the account with its own ~10 s request timeout, and only then starts the
# init_timeout clock, so the hang guard waits init_timeout_s plus this margin (measured: 10 s + timeout).
_INIT_GRACE_S = 15.0
_FINISH_GRACE_S = 15.0


def _numbers(record: dict[str, Any]) -> dict[str, float | int]:
    """The numeric fields of a record, NaN kept, for W&B (which plots NaN as a gap and cannot plot strings)."""
    return {k: v for k, v in record.items() if isinstance(v, int | float) and not isinstance(v, bool)}


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
            records, good_end = parse_jsonl(path)
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
        """Write the final summary.json ("completed", "failed" or "preempted") and close W&B.

        `summary` holds the scores the trainer tracked, e.g. {"best/eval/avg@k": .., "last/reward/mean": ..}.
        RunLog owns status, error, started_at, finished_at, wall_time_s, last_step, resumed_from_step, pid and
        wandb; keys of those names in `summary` are ignored.
        """
        if status not in ("completed", "failed", "preempted"):
            raise ValueError(f"finish status={status!r} is not allowed; use 'completed', 'failed' or 'preempted'")
        if self._finished:
            raise RuntimeError(f"RunLog.finish called twice for {self.run_dir}")
        summary = to_python(summary, "summary")  # a bad value raises here, while finish can still be retried
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

    @property
    def wandb_run(self) -> Any:
        """The live W&B run, None when W&B is off or was dropped (harness/loop/wandb_run.py adds to it)."""
        return self._wandb

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
        return {"step": int(step), **to_python(fields, where)}

    def _append(self, name: str, records: list[dict[str, Any]], step: int) -> None:
        """One write of whole lines, unbuffered: a crash can tear only the last line, which readers skip, and a
        failed write (disk full) is cut back off the file, so it ends on a whole line and loses only this step."""
        data = "".join(json.dumps(finite(r), allow_nan=False) + "\n" for r in records).encode("utf-8")
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
            code = {"completed": 0, "preempted": PREEMPTED_EXIT_CODE}.get(status, 1)
            _quiet_finish(run, code, warn=True)

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
    return json.dumps(finite(value)) if isinstance(value, dict | list) else value


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

    wandb_run = None

    def truncate_after(self, step: int) -> None:
        pass

    def sync(self) -> None:
        pass

    def finish(self, status: str, summary: dict[str, Any], error: str | None = None) -> None:
        pass


@contextlib.contextmanager
def finishing(log: RunLog | NullLog, summary: dict[str, Any], t_start: float) -> Iterator[None]:
    """The body of a run (training or evaluation): summary.json ends "completed" with the wall time, or, on any
    exception (KeyboardInterrupt too: the run directory must say it did not finish), "failed" with the error and
    the traceback, and the exception goes on."""
    try:
        yield
    except BaseException as exc:
        summary.update(status="failed", error=f"{type(exc).__name__}: {exc}")
        log.finish("failed", summary, error=traceback.format_exc())
        raise
    summary["wall_time_s"] = time.time() - t_start
    log.finish(summary.get("status", "completed"), summary)  # or "preempted" (harness/loop/stop.py)
