"""What `run.py` does around Hydra: one-line errors for bad options, run-directory bookkeeping, the summary, and
sweep isolation (a failed job is recorded in its run directory and the sweep goes on; the exit code counts them)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
GROUP_NAMES = ("model", "precision", "objective", "rollout", "data", "benchmark", "logger", "experiment")
# Exit codes above 125 mean "killed by a signal" or "command not found" to shells and schedulers.
MAX_EXIT_CODE = 125


def fail(message: str, code: int = 2) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def _parse_overrides(argv: list[str]) -> tuple[list[Any], bool] | None:
    """The command line's overrides as Hydra parses them, and whether it asks for a sweep; None when Hydra cannot
    parse it (Hydra then reports that itself)."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    args, rest = get_args_parser().parse_known_args(argv)
    try:
        overrides = OverridesParser.create().parse_overrides([*args.overrides, *(a for a in rest if a[:1] != "-")])
    except HydraException:
        return None
    return overrides, bool(args.multirun)


def _group_choices(o: Any) -> list[str]:
    """The options a group override picks: one, a comma sweep's, or those a glob(...) matches."""
    from hydra.core.override_parser.types import Glob

    value = o.value()
    if isinstance(value, Glob):
        return value.filter(group_options(o.key_or_group))
    return list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]


def check_group_options(argv: list[str]) -> None:
    """`objective=dpo` -> one line naming the valid options, before Hydra composes anything (Hydra's own message
    is a dozen lines and exits 1). The command line is read with Hydra's own parsers, so everything Hydra accepts
    passes: nested options (`+experiment=recipe/drpo_qwen3_4b`), `glob(...)`, `choice(...)`, comma sweeps,
    quoted values, deletions, flags anywhere. A line Hydra cannot parse is left for Hydra to report."""
    parsed = _parse_overrides(argv)
    if parsed is None:
        return
    for o in parsed[0]:
        if o.key_or_group not in GROUP_NAMES or o.package or o.is_delete():
            continue
        options = group_options(o.key_or_group)
        chosen = _group_choices(o)
        if not chosen:
            fail(f"{o.input_line} matches no option; valid {o.key_or_group} options: {', '.join(options)}")
        for option in chosen:
            if option not in options:
                fail(
                    f"{o.key_or_group}={option} is not an option; valid {o.key_or_group} options: {', '.join(options)}"
                )


# A sweep over many config groups is checked on its first combinations only: each costs one composition.
_MAX_KEY_CHECKS = 32


def check_override_keys(argv: list[str]) -> None:
    """`trainer.lrr=1`, or `objective.delta=0.3` under an objective without a delta -> one line naming the keys
    that exist there, as `+trainer.epochs=2` gets from validation (Hydra's own message is five lines and lists
    none). Only what Hydra itself would refuse is refused: the overrides are composed as Hydra composes them, once
    per choice of the config groups the command line (and, for a sweep, the experiment's `hydra.sweeper.params`)
    sweeps over, and only a "not in struct" failure is translated; anything else is left for Hydra to report."""
    import itertools

    from hydra.errors import ConfigCompositionException

    from harness.config import compose

    parsed = _parse_overrides(argv)
    if parsed is None:
        return
    overrides, multirun = parsed
    changes, groups = {}, {}
    for o in overrides:
        if o.is_delete() or o.package or o.key_or_group.startswith("hydra"):
            continue
        if o.key_or_group.split("/")[0] in GROUP_NAMES:
            groups[o.get_key_element()] = _group_choices(o)
        elif not o.is_add() and not o.is_force_add():  # `+key=` adds a key: validation names what is allowed
            changes[o.key_or_group] = _first_value(o)
    if not changes:
        return
    if multirun:  # an experiment's own sweep (`hydra.sweeper.params`) picks groups too; the command line wins
        first = [f"{k}={v[0]}" for k, v in groups.items() if v]
        try:
            params = compose(*first, hydra_config=True).get("hydra", {}).get("sweeper", {}).get("params") or {}
        except Exception:  # noqa: BLE001 - whatever fails here, Hydra reports itself
            return
        from hydra.core.override_parser.overrides_parser import OverridesParser

        try:
            swept = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
        except Exception:  # noqa: BLE001 - Hydra reports an experiment it cannot parse
            return
        for o in swept:
            key = o.key_or_group
            if key.split("/")[0] in GROUP_NAMES:
                if key not in groups and f"+{key}" not in groups:
                    groups[key] = _group_choices(o)
            elif key not in changes and not key.startswith("hydra"):
                changes[key] = _first_value(o)
    combos = itertools.product(*([f"{k}={c}" for c in v] for k, v in groups.items()))
    for combo in itertools.islice(combos, _MAX_KEY_CHECKS):
        try:
            compose(*combo, *changes.values())
        except ConfigCompositionException as e:
            text = f"{e} {e.__cause__}"
            key = next((k for k in changes if f"Could not override '{k}'" in text), None)
            if key is None or "not in struct" not in text:
                return
            fail(_unknown_key_message(key, compose(*combo, hydra_config=True)))
        except Exception:  # noqa: BLE001 - not a missing key: left for Hydra to report
            return


def _first_value(o: Any) -> str:
    """A value override as one `key=value` line: a sweep's first value (keys, not values, are checked)."""
    if not o.is_sweep_override():
        return o.input_line
    return f"{o.key_or_group}={next(iter(o.sweep_string_iterator()), '')}"


def _unknown_key_message(key: str, config: dict[str, Any]) -> str:
    """`objective (objective=grpo): unknown key 'delta'; allowed keys: agg, anchor, ...`: the deepest part of
    `key` that exists, the first part that does not, and what exists beside it."""
    parts, node, depth = key.split("."), config, 0
    while depth < len(parts) - 1 and isinstance(node, dict) and isinstance(node.get(parts[depth]), dict):
        node, depth = node[parts[depth]], depth + 1
    where = ".".join(parts[:depth]) or "the config"
    choice = config.get("hydra", {}).get("runtime", {}).get("choices", {}).get(parts[0]) if depth else None
    if choice:
        where += f" ({parts[0]}={choice})"
    keys = sorted(k for k in node if k != "hydra")
    return f"{where}: unknown key '{parts[depth]}'; allowed keys: {', '.join(keys)}"


def info_requested(argv: list[str]) -> bool:
    """--help, --hydra-help, --cfg/-c, --info/-i, --version, --shell-completion: Hydra prints and exits, and nothing
    may be written (no output folder either)."""
    from hydra._internal.utils import get_args_parser

    args, _ = get_args_parser().parse_known_args(argv)
    flags = ("help", "hydra_help", "cfg", "info", "shell_completion")
    return any(getattr(args, f, None) for f in flags) or "--version" in argv


def group_options(group: str) -> list[str]:
    """A config group's options: its YAML files, nested folders included (experiment=recipe/drpo_qwen3_4b)."""
    root = CONF_DIR / group
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.yaml"))


def check_command_line(argv: list[str]) -> None:
    """Before Hydra reads the command line: refuse what Hydra would act on before any of our validation runs.

    - A `_target_` (or any `hydra.callbacks` entry): Hydra instantiates callbacks, launchers and sweepers named in
      the config as it starts, so one given on the command line would run arbitrary code. They are accepted only
      from the project's config files.
    - A `hydra.run.dir` another live process is writing: Hydra would overwrite that run's .hydra/ files before
      our lock could refuse (harness.loop.lock)."""
    from harness.loop.lock import holder

    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if not sep:
            continue
        if "_target_" in arg or key == "hydra.callbacks" or key.startswith("hydra.callbacks."):
            fail(
                f"{key}: a _target_ or Hydra callback names code to run; it is accepted only from the project's "
                "config files (conf/), not from the command line"
            )
        if key == "hydra.run.dir" and "${" not in value and (who := holder(Path(value).expanduser())):
            fail(f"hydra.run.dir: {value} is being written by another process ({who}); wait for it to end")


def check_output_dir(argv: list[str]) -> None:
    """An output folder that cannot be created -> one line naming it, instead of Hydra's traceback.

    Checks `hydra.run.dir` / `hydra.sweep.dir` when given (a literal path, not an interpolation), else `outputs/`
    under the working directory, where both default to. Creating it early is harmless: Hydra would.
    """
    targets = {"hydra.run.dir": None, "hydra.sweep.dir": None}
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if sep and key in targets:
            targets[key] = value
    given = [(k, v) for k, v in targets.items() if v and "${" not in v]
    for key, value in given or [("output folder", "outputs")]:
        path = Path(value).expanduser()
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / f".write-test-{os.getpid()}"
            probe.touch()
            probe.unlink()
        except OSError as e:
            fail(f"{key}: cannot write to {str(path)!r} ({e.strerror or e}); choose a writable folder")


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
    from harness.loop.lock import RunDirBusy
    from harness.loop.resume_guard import ResumeRefused
    from harness.loop.runlog import LogWriteError

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
    from harness.loop.lock import RunDirLock

    main = rank_from_env() == 0  # under torchrun rank 0 writes the run directory and speaks for the run
    with RunDirLock(run_dir) if main else contextlib.nullcontext():
        if run_cfg.mode == "eval":
            from harness.loop.eval_only import print_eval_summary, run_eval

            summary = run_eval(run_cfg, run_dir, raw)
            print_eval_summary(summary)
            return summary.get("final_score")
        from harness.loop.resume_guard import guard
        from harness.loop.train import train

        guard(run_cfg, run_dir, write=main)
        summary = train(run_cfg, run_dir, raw)
    if main:
        print_summary(summary)
    return summary.get("final_score")


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


def plan_requested(argv: list[str]) -> bool:
    return any(a.lstrip("+~") == "mode=plan" for a in argv)


def plan_argv(argv: list[str], scratch: str) -> list[str]:
    """`mode=plan` builds nothing and leaves no run directories: Hydra's job folders (it always makes one) go to
    a scratch folder that run.py deletes, with no .hydra/ record and no log files, and Hydra's own log lines are
    off, so stdout is the PLAN lines and the sweep's summary."""
    return [
        *argv,
        f"hydra.run.dir={scratch}",
        f"hydra.sweep.dir={scratch}",
        "hydra.output_subdir=null",
        "hydra/job_logging=none",
        "hydra/hydra_logging=none",
    ]


def rank_from_env() -> int:
    value = os.environ.get("RANK", "0").strip()
    return int(value) if value.isdigit() else 0


def share_run_stamp() -> None:
    """Under torchrun every process composes the config; they must agree on the run directory, whose name has the
    start time in it. Rank 0's time goes to all of them (HARNESS_RUN_STAMP, read by the `run_stamp` resolver)."""
    from harness.config import STAMP_FORMAT
    from harness.loop import distributed

    if distributed.world_size_from_env() == 1 or "HARNESS_RUN_STAMP" in os.environ:
        return
    pg = distributed.setup()
    os.environ["HARNESS_RUN_STAMP"] = pg.broadcast(time.strftime(STAMP_FORMAT))


def threads_from_env() -> int | None:
    """OMP_NUM_THREADS as a positive int, or None (unset or unusable: then train() uses every core)."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def record_failure(run_dir: Path, exc: BaseException) -> str:
    """Make `run_dir/summary.json` say failed, keeping what train()/run_eval() wrote there, with a one-line
    error and the full traceback (its cause included). Returns the one-line error."""
    from harness.config import SetupError
    from harness.errors import first_line
    from harness.loop.runlog import atomic_write_json

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
        from harness.loop.runlog import LogWriteError

        if not isinstance(exc, LogWriteError):  # whose own line already says the disk is full
            print(f"warning: could not write {path}: {e}", file=sys.stderr)
    return error


# --- the end of a sweep ---

_sweep_failures: list[Path] | None = None  # set by SweepReport in the launching process; run.py's exit code


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
        done = sum(
            job_status(job) in ("completed", "failed") for job in sweep_jobs(Path(hydra.sweep.dir), self._started)
        )
        now = time.time()
        print(
            job_line(list(job_return.overrides or []), self._swept, run_dir.name, job_status(run_dir), done,
                     self._total, now - self._job_started, now - self._started),
            file=sys.stderr,
            flush=True,
        )  # fmt: skip

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        global _sweep_failures
        if config.get("mode") == "plan":  # nothing ran; a job that fails to plan raises (Hydra exits 1)
            return
        sweep_dir = Path(str(config.hydra.sweep.dir))
        jobs = sweep_jobs(sweep_dir, self._started)
        failed = [job for job in jobs if job_status(job) != "completed"]
        _sweep_failures = failed
        if failed:
            names = "; ".join(str(job.relative_to(sweep_dir)) for job in failed)
            print(f"sweep: {len(failed)} of {len(jobs)} jobs failed under {sweep_dir}: {names}", file=sys.stderr)
        else:
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
    """0 after a single run or a clean sweep; otherwise the number of failed jobs, capped at 125."""
    return min(len(_sweep_failures or []), MAX_EXIT_CODE)


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
    if s.get("policy"):  # the trained policy as a Hugging Face model folder
        lines.insert(-2, f"  policy         {s['policy']}   (from_pretrained, vLLM, mode=eval model.path=)")
    print("\n".join(lines))
