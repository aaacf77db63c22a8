"""The end of a sweep: a progress line as each job ends (`SweepReport`, a Hydra callback declared in
conf/config.yaml), one line naming the jobs that failed and one naming those stopped by a signal, and run.py's exit
code (the failed jobs' number, capped; else 75 when any was preempted)."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from harness import preemption
from harness.cli.checks import group_options
from harness.distributed import rank_from_env
from harness.preemption import PREEMPTED_EXIT_CODE

# Exit codes above 125 mean "killed by a signal" or "command not found" to shells and schedulers.
MAX_EXIT_CODE = 125


_sweep_failures: list[Path] | None = None  # set by SweepReport in the launching process; run.py's exit code
_sweep_preempted: list[Path] | None = None
ENDED = ("completed", "failed", "preempted")  # a job's summary.json status once it has ended


class SweepReport(Callback):
    """Hydra callback (declared in conf/config.yaml): a progress line as each job of a multirun ends, and at the
    end one line naming the jobs that did not complete, their count left for `sweep_exit_code()`.

    It reads summary.json in the run directories rather than the launcher's JobReturns: Hydra hands those to no
    callback in the launching process, and with joblib, submitit or Ray the jobs ran in other processes anyway.
    A job belongs to this sweep if its summary.json (or .hydra/ record) is newer than the sweep's multirun.yaml,
    which the sweeper writes before launching, so reusing a sweep directory does not count old runs.

    The per-job line is printed by the process that ran the job (`on_job_end` runs there: in this process for the
    basic launcher, in a worker for joblib, on the node for SLURM or Ray; each gets a copy of this object made after
    `on_multirun_start`, so it knows the sweep's start and size). How many jobs have finished is counted from the
    run directories, so parallel jobs agree; two that end at the same moment may print the same count.
    """

    def __init__(self) -> None:
        self._started = time.time()
        self._job_started = time.time()
        self._total: int | None = None
        self._swept: list[str] = []

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._started = time.time()
        self._total, self._swept = sweep_plan(config)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._job_started = time.time()

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        from hydra.types import RunMode

        hydra = config.hydra
        if hydra.mode != RunMode.MULTIRUN or config.get("mode") == "plan" or rank_from_env() != 0:
            return
        run_dir = Path(str(hydra.runtime.output_dir))
        done = sum(job_status(job) in ENDED for job in sweep_jobs(Path(hydra.sweep.dir), self._started))
        now = time.time()
        print(
            job_line(list(job_return.overrides or []), self._swept, run_dir.name, job_status(run_dir), done,
                     self._total, now - self._job_started, now - self._started),
            file=sys.stderr,
            flush=True,
        )  # fmt: skip

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        global _sweep_failures, _sweep_preempted
        if config.get("mode") == "plan":  # nothing ran; a job that fails to plan raises (Hydra exits 1)
            return
        sweep_dir = Path(str(config.hydra.sweep.dir))
        jobs = sweep_jobs(sweep_dir, self._started)
        preempted = [job for job in jobs if job_status(job) == "preempted"]
        failed = [job for job in jobs if job_status(job) not in ("completed", "preempted")]
        _sweep_failures, _sweep_preempted = failed, preempted

        def names(found: list[Path]) -> str:
            return "; ".join(str(job.relative_to(sweep_dir)) for job in found)

        if preempted:
            print(
                f"sweep: {len(preempted)} of {len(jobs)} jobs preempted under {sweep_dir} (rerun the sweep with "
                f"trainer.resume=auto to finish them): {names(preempted)}",
                file=sys.stderr,
            )
        if failed:
            print(
                f"sweep: {len(failed)} of {len(jobs)} jobs failed under {sweep_dir}: {names(failed)}", file=sys.stderr
            )
        elif not preempted:
            print(f"sweep: all {len(jobs)} jobs completed under {sweep_dir}")


def sweep_plan(config: DictConfig) -> tuple[int | None, list[str]]:
    """(number of jobs, the keys that vary) of the sweep the basic sweeper (every launcher here uses it) will run:
    `hydra.sweeper.params` then the command line, a key given twice taking its last value. (None, []) when it
    cannot be read here; Hydra then reports the sweep's own error."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Glob

    params = config.hydra.sweeper.get("params") or {}
    lines = [f"{k}={v}" for k, v in params.items()] + [str(o) for o in config.hydra.overrides.task]
    values: dict[str, int] = {}
    try:
        for o in OverridesParser.create().parse_overrides(lines):
            if not o.is_sweep_override():
                values[o.get_key_element()] = 1
            elif isinstance(o.value(), Glob):  # a glob over a group's options: the parser has no config loader
                values[o.get_key_element()] = len(o.value().filter(group_options(o.key_or_group)))
            else:
                values[o.get_key_element()] = len(list(o.sweep_string_iterator()))
    except Exception:  # noqa: BLE001 - any unreadable sweep: no count, and Hydra says what is wrong
        return None, []
    return math.prod(values.values()), [k for k, n in values.items() if n > 1]


def job_line(
    overrides: list[str], swept: list[str], dirname: str, status: str, done: int, total: int | None,
    took_s: float, elapsed_s: float,
) -> str:  # fmt: skip
    """`[3/12] objective=dppo seed=2 done in 41 s (completed), elapsed 2 min, ~6 min left`: the job named by the
    values of the swept keys (its folder name when nothing is swept); time left is the mean time per finished job
    so far times the jobs still to finish, parallel jobs included."""
    chosen = dict(o.lstrip("+").split("=", 1) for o in overrides if "=" in o and not o.startswith("~"))
    what = " ".join(f"{k.lstrip('+')}={chosen[k.lstrip('+')]}" for k in swept if k.lstrip("+") in chosen) or dirname
    count = f"[{done}/{total}]" if total else f"[{done}]"
    line = f"{count} {what} done in {duration(took_s)} ({status}), elapsed {duration(elapsed_s)}"
    if total and 0 < done < total:
        line += f", ~{duration(elapsed_s / done * (total - done))} left"
    return line


def duration(seconds: float) -> str:
    """41 s, 6 min, 1 h 5 min."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


def sweep_jobs(sweep_dir: Path, started: float) -> list[Path]:
    """Run directories under `sweep_dir` written since this sweep's multirun.yaml (or since `started`)."""
    marker = sweep_dir / "multirun.yaml"
    # The file's own mtime is on the same clock as the jobs' files, which matters on a cluster's shared disk.
    since = marker.stat().st_mtime if marker.exists() else started
    found = {p.parent for pattern in ("summary.json", ".hydra") for p in sweep_dir.rglob(pattern)}
    return sorted(d for d in found if d != sweep_dir and _newest_record(d) >= since)


def _newest_record(run_dir: Path) -> float:
    paths = [run_dir / "summary.json", run_dir / ".hydra" / "overrides.yaml"]
    return max((p.stat().st_mtime for p in paths if p.exists()), default=0.0)


def job_status(run_dir: Path) -> str:
    """summary.json's status; "missing" if the job never wrote one (it died before its first line)."""
    try:
        return str(json.loads((run_dir / "summary.json").read_text(encoding="utf-8")).get("status"))
    except (OSError, ValueError):
        return "missing"


def sweep_exit_code() -> int:
    """0 after a completed run or sweep; the number of failed jobs (capped at 125) when any failed; else
    PREEMPTED_EXIT_CODE (75) when a run or a sweep's job ended preempted (a signal during a run's last step lets it
    complete: 0), so a launcher can requeue the same command with trainer.resume=auto."""
    if _sweep_failures:
        return min(len(_sweep_failures), MAX_EXIT_CODE)
    return PREEMPTED_EXIT_CODE if _sweep_preempted or preemption.ended_preempted() else 0
