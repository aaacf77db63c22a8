"""One Hydra job: validate the config, check it against this machine, then train, evaluate or plan; the summary
it prints, and what a failed job leaves in its run directory (summary.json says failed, with the error and the
traceback) so a sweep goes on."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from harness import preemption
from harness.distributed import rank_from_env
from harness.errors import fail


@dataclass(frozen=True)
class JobFailed:
    """What a sweep job returns instead of raising: Hydra's sweepers re-raise a job's exception once its batch is
    done, and an exception (or SystemExit) inside a joblib worker ends the whole sweep."""

    run_dir: str
    error: str


def run_job(cfg: DictConfig) -> float | JobFailed | None:
    """Validate (before any model is built), train or evaluate, print the summary. Returns the final score.

    A single run that cannot start exits 2 with one line; a crash propagates (Hydra prints the traceback). In a
    sweep either one is recorded in the job's summary.json and returned as JobFailed, so the other jobs run.
    Both ways summary.json ends with status "failed", a one-line "error" and the "traceback".
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from harness.config import SetupError
    from harness.errors import first_line
    from harness.loop.resume_guard import ResumeRefused
    from harness.rundir.files import LogWriteError
    from harness.rundir.lock import RunDirBusy

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        return _run(cfg, run_dir)
    except KeyboardInterrupt:  # the user stops the whole sweep, not one job
        raise
    except (Exception, SystemExit) as exc:
        # A busy directory or a refused resume belongs to another run (or another config): leave it as it is.
        refused = isinstance(exc, RunDirBusy | ResumeRefused)
        error = first_line(exc) if refused else record_failure(run_dir, exc)
        if hydra_cfg.mode == RunMode.MULTIRUN:
            print(f"error: {run_dir.name}: {error}", file=sys.stderr)
            return JobFailed(str(run_dir), error)
        if isinstance(exc, SetupError):
            fail(error)
        if isinstance(exc, LogWriteError):  # a full disk: one line, and the run is resumable (not a bad config)
            fail(error, code=1)
        raise


def _run(cfg: DictConfig, run_dir: Path) -> float | None:
    from harness.config import SetupError, validate

    if preemption.requested() is not None:  # stopped during an earlier job of this sweep: this one does not start
        return _not_started(run_dir)

    raw: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    trainer = raw.get("trainer")
    if isinstance(trainer, dict) and trainer.get("threads") is None:
        # Launchers that run several jobs on one machine say how many threads each may use through OMP_NUM_THREADS
        # (joblib's loky workers get cores // n_jobs, Ray workers their num_cpus). train() would otherwise take
        # every core in every job, and OpenMP threads that spin-wait for a core another job holds make a step
        # 10x or more slower than one thread does (2 jobs on 2 cores: 9-21 s per step at 2 threads, <1 s at 1).
        trainer["threads"] = threads_from_env()
    from harness import machine

    try:
        run_cfg = validate(raw)
        if run_cfg.mode == "plan":  # before the machine check: a GPU sweep is planned anywhere
            print(plan_line(run_cfg, job_overrides()), flush=True)
            return None
        # What this machine lacks for the config (CUDA, FP8, vLLM, GPUs): one line, before any model is built.
        machine.check(run_cfg, machine.probe())
    except ValueError as exc:
        raise SetupError(str(exc)) from exc
    from harness.rundir.lock import RunDirLock

    main = rank_from_env() == 0  # under torchrun rank 0 writes the run directory and speaks for the run
    with RunDirLock(run_dir) if main else contextlib.nullcontext():
        if run_cfg.mode == "eval":
            from harness.loop.eval_only import evaluate_model, print_eval_summary

            summary = evaluate_model(run_cfg, run_dir, raw)
            print_eval_summary(summary)
            return summary.get("final_score")
        from harness.loop.resume_guard import guard
        from harness.loop.train import train

        guard(run_cfg, run_dir, write=main)
        summary = train(run_cfg, run_dir, raw)
    if main:
        print_summary(summary)
    if summary.get("status") == "preempted":
        preemption.hand_on()  # submitit's handler, when it launched this job: it requeues the job
    return summary.get("final_score")


def _not_started(run_dir: Path) -> None:
    """A sweep job after a stop: summary.json says preempted before its first step, so the sweep's report counts it
    and the rerun with trainer.resume=auto starts it."""
    from harness.rundir.files import atomic_write_json

    stop = preemption.requested()
    preemption.ended_preempted(count=True)
    if rank_from_env() == 0 and stop is not None:
        record = {**stop.record(), "stopped_after_step": None, "checkpoint_step": None, "not_started": True}
        atomic_write_json(run_dir / "summary.json", {"status": "preempted", "error": None, "preempted": record})
    print(f"{run_dir.name}: not started, the sweep was stopped by {stop and stop.signal}", file=sys.stderr)
    return None


# --- mode=plan ---

PLAN_PREFIX = "PLAN "


def job_overrides() -> list[str]:
    """The running Hydra job's own overrides (a sweep job's arm and seed plus the command line's)."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task)


def plan_record(run_cfg: Any, overrides: list[str]) -> dict[str, Any]:
    """What `mode=plan` prints for one job: its overrides and its validated config, every default resolved (the
    objective's hyperparameters included), as plain JSON types. `mode` itself is left out: it is "plan" here and
    "train" when the job really runs."""
    import dataclasses

    config = dataclasses.asdict(run_cfg)
    config.pop("mode")
    return {"overrides": [o for o in overrides if o.partition("=")[0].lstrip("+~") != "mode"], "config": config}


def plan_line(run_cfg: Any, overrides: list[str]) -> str:
    return PLAN_PREFIX + json.dumps(plan_record(run_cfg, overrides), sort_keys=True, default=list)


def threads_from_env() -> int | None:
    """OMP_NUM_THREADS as a positive int, or None (unset or unusable: then train() uses every core)."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def record_failure(run_dir: Path, exc: BaseException) -> str:
    """Make `run_dir/summary.json` say failed, keeping what train()/evaluate_model() wrote there, with a one-line
    error and the full traceback (its cause included). Returns the one-line error."""
    from harness.config import SetupError
    from harness.errors import first_line
    from harness.rundir.files import atomic_write_json

    message = first_line(exc)
    named = message == type(exc).__name__  # no message of its own
    error = message if isinstance(exc, SetupError) or named else f"{type(exc).__name__}: {message}"
    if rank_from_env() != 0:  # rank 0 writes the run directory; another rank's failure also fails rank 0's run
        return error
    path = run_dir / "summary.json"
    summary: dict[str, Any] = {}
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none yet (the job failed before its RunLog started) or torn
        pass
    summary.update(status="failed", error=error, traceback="".join(traceback.format_exception(exc)))
    try:
        atomic_write_json(path, summary)
    except OSError as e:  # an unwritable run directory must not hide the job's own error
        from harness.rundir.files import LogWriteError

        if not isinstance(exc, LogWriteError):  # whose own line already says the disk is full
            print(f"warning: could not write {path}: {e}", file=sys.stderr)
    return error


def print_summary(s: dict[str, Any]) -> None:
    key = s.get("score_key", "score")

    def pct(x: Any) -> str:
        if key == "rm_score":  # a reward model's score has its own scale: not a percentage
            return "-" if x is None else f"{x:.3f}"
        return "-" if x is None else f"{100 * x:.1f}%"

    if s.get("gain") is None:
        gain = "-"
    else:
        gain = f"{s['gain']:+.3f}" if key == "rm_score" else f"{100 * s['gain']:+.1f} points"
    lines = [
        "",
        f"run finished: {s.get('status')}  ({s.get('wall_time_s', 0):.0f} s)",
        f"  objective      {s.get('objective')}",
        f"  {s.get('benchmark')} {key}   start {pct(s.get('initial_score'))}  ->  end {pct(s.get('final_score'))}"
        f"   (gain {gain}; best {pct(s.get('best_score'))})",
        f"  run directory  {s.get('run_dir')}",
        "  figures        make figures   (reads every run under outputs/)",
        "",
    ]
    if s.get("status") == "preempted":
        p = s.get("preempted") or {}
        kept = "no checkpoint" if p.get("checkpoint_step") is None else f"checkpoint step_{p['checkpoint_step']}"
        lines.insert(-2, f"  preempted      by {p.get('signal')}, {kept}: continue with trainer.resume=auto")
    if s.get("policy"):  # the trained policy as a Hugging Face model folder
        lines.insert(-2, f"  policy         {s['policy']}   (from_pretrained, vLLM, mode=eval model.path=)")
    print("\n".join(lines))
