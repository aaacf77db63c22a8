"""The findings suite: run a calibrated set of CPU experiments, then turn them into one verdict per paper claim.

    python -m analysis.suite                       # findings/suite.yaml: every run, then FINDINGS.md + findings.json
    python -m analysis.suite --quick               # the suite's named `quick` subset (fewer arms and seeds)
    python -m analysis.suite --report-only         # verdicts from the runs already on disk
    python -m analysis.suite --seeds 3-12          # a replication: new seeds, their own folder and verdicts
    python -m analysis.suite --claims 12           # one claim's arms only (a replication reports only it)

The suite file (findings/suite.yaml) holds the calibrated base setting, the arms (Hydra overrides), the seeds and,
per claim, the comparisons and the rule that decides each one, written before any run. Runs are `run.py`
processes, `jobs` at a time with one thread each, in findings/runs/<arm>/seed<k>; a run whose summary.json says
completed is not run again, so an interrupted suite resumes where it stopped. A failed run is reported in
FINDINGS.md with its error, the comparisons that needed it become inconclusive, and the exit code is non-zero. A
completed run whose recorded overrides (`.hydra/overrides.yaml`) differ from what the suite file now asks, or
whose composed config (`.hydra/config.yaml`) differs from what those overrides compose to today (edited defaults), is
*stale*: a pass runs it again, and `--report-only` reports it as failed, saying how it differs. A pass claims each
job (an flock on `<arm>/.seed<k>.claim`) before it touches the run, so a run that another live suite process has
claimed (two suites sharing a run folder through `runs:`) is left to it, whenever that process took it.
"""

from __future__ import annotations

import argparse
import fcntl  # run_one's claim on a job; harness.rundir.lock.locked_by reads it
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from analysis import suite_checks
from analysis.run_metrics import METRICS
from analysis.verdicts import Rule
from harness.cli.sweep import job_line  # the sweeps' progress line: `[3/32] arm=dppo seed=1 done in 3 min (...)`
from harness.config import compose
from harness.errors import first_line
from harness.rundir.lock import holder, locked_by
from harness.rundir.record import differences

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SUITE = ROOT / "findings" / "suite.yaml"
ELSEWHERE = "elsewhere"  # run_one: another live process has the job


@dataclass(frozen=True)
class Job:
    arm: str
    seed: int
    overrides: tuple[str, ...]
    run_dir: Path


@dataclass
class Suite:
    path: Path
    base: list[str]
    arms: dict[str, list[str]]
    seeds: list[int]
    claims: list[dict[str, Any]]
    quick: dict[str, Any] = field(default_factory=dict)
    jobs: int = 2
    runs: Path | None = None  # the run folder when not <report folder>/runs (`runs:`, relative to the file)
    optin: list[Suite] = field(default_factory=list)  # the opt-in suites its report names (`optin:`)
    # Arms that run only the first n of the seeds in force (`arm_seeds:`): seeds go where a claim needs them. Not
    # inherited through `extends`, and a replication (--seeds) runs every arm on all its seeds.
    arm_seeds: dict[str, int] = field(default_factory=dict)
    # Named conditions a claim runs at (`conditions:`): what they are, and whether the testbed map found a positive
    # control for the mechanism there. A claim names one with `condition:`.
    conditions: dict[str, dict[str, Any]] = field(default_factory=dict)
    version: int = 7  # `version:`; from 8 on analysis.suite_checks holds the file to what v8 must state

    @classmethod
    def load(cls, path: Path, _seen: tuple[Path, ...] = (), _optin: bool = True) -> Suite:
        raw = read_mapping(path)
        if path.resolve() in _seen:
            raise SystemExit(f"error: {path}: extends itself through {' -> '.join(p.name for p in _seen)}")
        # An opt-in suite `extends:` another: it inherits base, seeds, jobs and arms, adds arms, has its own claims.
        parent = cls.load(path.parent / raw["extends"], (*_seen, path.resolve()), False) if "extends" in raw else None
        if parent is not None:
            raw.setdefault("base", parent.base)
            raw.setdefault("seeds", parent.seeds)
            raw.setdefault("jobs", parent.jobs)
            raw.setdefault("arms", {})
        missing = [k for k in ("base", "arms", "seeds", "claims") if k not in raw]
        if missing:
            raise SystemExit(f"error: {path}: missing key(s) {', '.join(missing)}")
        arms = {k: list(v) for k, v in (parent.arms if parent else {}).items()}
        for arm, overrides in raw["arms"].items():
            if arm in arms and arms[arm] != list(overrides):
                raise SystemExit(f"error: {path}: arm {arm!r} is {raw['extends']}'s with other overrides: rename it")
            arms[arm] = list(overrides)
        suite = cls(
            path, list(raw["base"]), arms, list(raw["seeds"]), list(raw["claims"]), dict(raw.get("quick") or {}),
            int(raw.get("jobs", 2)), (path.parent / raw["runs"]).resolve() if "runs" in raw else None,
        )  # fmt: skip
        for arm, n in (raw.get("arm_seeds") or {}).items():
            if arm not in suite.arms:
                raise SystemExit(f"error: {path}: arm_seeds names {arm!r}, not in arms")
            if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= len(suite.seeds):
                raise SystemExit(
                    f"error: {path}: arm_seeds.{arm} is {n!r}; allowed: a whole number of seeds, "
                    f"1 to {len(suite.seeds)}"
                )
            suite.arm_seeds[arm] = n
        suite.conditions = {str(k): dict(v or {}) for k, v in (raw.get("conditions") or {}).items()}
        _computed_controls(path, raw, suite)
        suite.version = int(raw.get("version", 7))
        for claim in suite.claims:
            _check_claim(path, claim, suite)
            if suite.version >= 8:
                suite_checks.check_claim(path, claim, suite.conditions, suite.arms)
            for part in claim.get("parts", []):  # a rule the report cannot apply must fail now, not after the runs
                try:
                    Rule(**part.get("rule", {}))
                except (TypeError, ValueError) as e:
                    raise SystemExit(f"error: {path}: claim {claim['id']}: rule {part.get('rule')!r}: {e}") from None
        for arm in suite.quick.get("arms", []):
            if arm not in suite.arms:
                raise SystemExit(f"error: {path}: quick.arms names {arm!r}, not in arms")
        for name in raw.get("optin", []) if _optin else ():  # not through `extends`: an opt-in extends this file
            opt = path.parent / name
            if not opt.is_file():
                raise SystemExit(f"error: {path}: optin names {opt}, which is not a file")
            suite.optin.append(cls.load(opt, _optin=False))  # checked now, before any run, not by the report after
        return suite

    def selection(self, quick: bool) -> tuple[list[dict[str, Any]], list[int], list[str] | None]:
        """The claims whose arms run, the seeds, and (quick) the arms to run: everything, or the `quick` subset."""
        if not quick:
            return self.claims, self.seeds, None
        ids = set(self.quick.get("claims", []))
        claims = [c for c in self.claims if c["id"] in ids]
        return claims, list(self.quick.get("seeds", self.seeds)), self.quick.get("arms")

    def jobs_for(
        self, claims: Sequence[dict[str, Any]], seeds: Sequence[int], runs_dir: Path, only: list[str] | None = None
    ) -> list[Job]:
        # A claim at a condition without a positive control is not testable here: its arms do not run, but for
        # the arms of its parts that need none (`needs_control: false`).
        wanted = {
            a for c in claims if c.get("cpu", True) and c.get("positive_control") is not False for a in claim_arms(c)
        } | {
            a
            for c in claims
            if c.get("cpu", True)
            for part in c.get("parts", [])
            if part.get("needs_control") is False
            for a in claim_arms({"parts": [part]})
        }
        arms = sorted(wanted & set(only or wanted), key=list(self.arms).index)
        return [
            Job(arm, seed, (*self.base, *self.arms[arm], f"seed={seed}"), runs_dir / arm / f"seed{seed}")
            for i, seed in enumerate(seeds)
            for arm in arms
            if i < self.arm_seeds.get(arm, len(seeds))
        ]


MECHANISM_JSON = ROOT / "findings" / "map" / "mechanism.json"


def _computed_controls(path: Path, raw: dict[str, Any], suite: Suite) -> None:
    """A condition's positive control read from the mechanism map (`control: <model>`, its mechanism.json's computed
    `positive_control`), never written by hand from suite v8 on: a hand-written one is refused. Its claims get the
    computed value."""
    version = int(raw.get("version", 7))
    where = f"error: {path}"
    if version >= 8:
        for name, cond in suite.conditions.items():
            if "positive_control" in cond:
                raise SystemExit(
                    f"{where}: conditions.{name}.positive_control is written by hand; from v8 on it is computed by "
                    "the mechanism map: name the map's model with `control: <model>`"
                )
        for claim in suite.claims:
            if "positive_control" in claim:
                raise SystemExit(
                    f"{where}: claim {claim.get('id')}: positive_control is written by hand; from v8 on its "
                    "condition's `control:` reads it from the mechanism map"
                )
    for name, cond in suite.conditions.items():
        if "control" not in cond:
            continue
        source = (path.parent / cond["map"]).resolve() if "map" in cond else MECHANISM_JSON
        try:
            models = json.loads(source.read_text(encoding="utf-8"))["models"]
        except (OSError, ValueError, KeyError):
            raise SystemExit(
                f"{where}: conditions.{name}.control: {source} is missing or unreadable; run make mechanism-map"
            ) from None
        model = str(cond["control"])
        if model not in models:
            raise SystemExit(
                f"{where}: conditions.{name}.control: {model!r} is not a model of {source.name} ({', '.join(models)})"
            )
        # The staleness-only cell controls for staleness, never for the mismatch: its computed field is its own.
        cond["control_kind"] = models[model].get("kind", "candidate")
        key = "staleness_control" if cond["control_kind"] == "staleness" else "positive_control"
        cond["positive_control"] = bool(models[model].get(key, False))
        cond["evidence"] = cond.get("evidence") or f"{source.name}: {model} ({models[model].get('status')}, `{key}`)"
    for claim in suite.claims:
        cond = suite.conditions.get(str(claim.get("condition")))
        if cond is not None and "control" in cond:
            if cond["control_kind"] == "staleness" and claim.get("id") in suite_checks.MISMATCH_CLAIMS:
                raise SystemExit(
                    f"{where}: claim {claim.get('id')} is about the mismatch; condition {claim.get('condition')!r} "
                    f"rests on the staleness-only cell ({cond['control']}); allowed: a mismatch model of the map"
                )
            claim["positive_control"] = cond["positive_control"]


def _check_claim(path: Path, claim: dict[str, Any], suite: Suite) -> None:
    """A claim's arms, condition, positive control, metrics and rules must all exist before any run."""

    where = f"error: {path}: claim {claim.get('id')}"
    for arm in claim_arms(claim):
        if arm not in suite.arms:
            raise SystemExit(f"{where} names arm {arm!r}, not in arms")
    if "condition" in claim and str(claim["condition"]) not in suite.conditions:
        allowed = ", ".join(suite.conditions) or "none: the file has no `conditions:`"
        raise SystemExit(f"{where}: condition {claim['condition']!r} is not one of the file's conditions ({allowed})")
    if claim.get("positive_control", None) not in (True, False, None):
        raise SystemExit(f"{where}: positive_control is {claim['positive_control']!r}; allowed: true, false")
    for part in claim.get("parts", []):
        if part.get("metric") not in METRICS:
            raise SystemExit(f"{where}: metric {part.get('metric')!r} is not one of {', '.join(METRICS)}")


def read_mapping(path: Path, expected: str = "base, arms, seeds and claims") -> dict[str, Any]:
    """A suite or map file's YAML mapping, or one line naming the file and what it should hold."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise SystemExit(f"error: {path}: {e}") from e
    if not isinstance(raw, dict):
        raise SystemExit(f"error: {path}: expected a mapping with {expected}")
    return raw


def parse_seeds(text: str) -> list[int]:
    """'3-12' -> [3, ..., 12]; '3,5,8' -> [3, 5, 8]."""
    try:
        if "-" in text.strip("-"):
            lo, hi = (int(x) for x in text.split("-"))
            seeds = list(range(lo, hi + 1))
        else:
            seeds = [int(x) for x in text.split(",")]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"{text!r}: expected distinct seeds >= 0 as a range 3-12 or a list 3,5,8")
    return seeds


def parse_claims(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected claim ids such as 12 or 1,12") from None


def report_command(args: argparse.Namespace) -> str:
    """The command that reruns this report's selection, for its header: a replication's folder holds only some
    claims on some seeds, and the header has to say which."""
    words = ["python -m analysis.suite"]
    if args.suite.resolve() != DEFAULT_SUITE.resolve():
        words.append(f"--suite {args.suite}")
    if args.quick:
        words.append("--quick")
    if args.claims is not None:
        words.append(f"--claims {','.join(map(str, args.claims))}")
    if args.seeds is not None:
        words.append(f"--seeds {seeds_label(args.seeds)}")
    return " ".join(words)


def seeds_label(seeds: list[int]) -> str:
    contiguous = seeds == list(range(seeds[0], seeds[0] + len(seeds)))
    return f"{seeds[0]}-{seeds[-1]}" if contiguous and len(seeds) > 1 else "_".join(map(str, seeds))


def claim_arms(claim: dict[str, Any]) -> list[str]:
    """Every arm a claim compares or draws."""
    arms = list(claim.get("arms", []))
    for part in claim.get("parts", []):
        arms += [part["a"]] + ([part["b"]] if isinstance(part.get("b"), str) else [])
    return list(dict.fromkeys(arms))


def run_status(run_dir: Path) -> str | None:
    try:
        return json.loads((run_dir / "summary.json").read_text(encoding="utf-8")).get("status")
    except (OSError, ValueError):
        return None


def job_overrides(job: Job) -> list[str]:
    """The overrides run.py gets for a job (besides `hydra.run.dir`), as Hydra records them in the run's
    `.hydra/overrides.yaml`."""
    return [*job.overrides, "trainer.threads=1", "name=findings"]


def settings_differ(job: Job) -> str | None:
    """How the settings a run on disk was made with differ from the job's, or None when they agree or the run
    left no record of them. A suite file edited after its runs (another lr, base, arm) must not pass the old runs
    off as the new setting's: first the overrides (the ones only the run has, the ones only the job has), then
    what they composed to."""
    try:
        made = yaml.safe_load((job.run_dir / ".hydra" / "overrides.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    want = job_overrides(job)
    if made == want:
        return defaults_differ(job)
    made = list(made or [])
    gone, new = [o for o in made if o not in want], [o for o in want if o not in made]
    if gone or new:
        return (
            f"made with {', '.join(gone) or 'nothing more'} where the suite file now says {', '.join(new) or 'nothing'}"
        )
    return "made with the same overrides in another order"


def defaults_differ(job: Job) -> str | None:
    """How the run's composed config (`.hydra/config.yaml`) differs from what the job's overrides compose to now:
    the same overrides over edited defaults (conf/'s YAML, or the schemas' defaults in harness/config/) are
    another setting too. None when they agree or the run left no config."""
    try:
        made = yaml.safe_load((job.run_dir / ".hydra" / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    try:
        now = compose(*job_overrides(job))
    except Exception as e:  # Hydra's errors share no base class; any of them means the setting is gone
        return f"its overrides no longer compose: {first_line(e)}"
    # The resume guard's comparison: keys that change how a run is watched (threads, eval cadence) are not a new
    # setting here either.
    changed = list(differences(made, now).items())
    if not changed:
        return None
    shown = ", ".join(f"{k}={old!r} (the defaults now give {new!r})" for k, (old, new) in changed[:3])
    return f"made with {shown}{f' and {len(changed) - 3} more' if len(changed) > 3 else ''}"


def job_status(job: Job) -> str | None:
    """The run's summary status, "stale" for a completed run made with other settings than the job's."""
    status = run_status(job.run_dir)
    return "stale" if status == "completed" and settings_differ(job) else status


def disk_status(job: Job) -> str:
    """What a run left on disk: its summary's status ("stale" when it completed with other settings than the
    suite file's); "failed" when only the suite's log of it exists (refused before its directory was made, e.g.
    a bad override); "not run" when neither does, or when the run is still going (`--report-only` beside a
    running suite): unfinished is not failed. A run is still going while a live suite holds its claim (from before
    run.py starts, so its first seconds too) or a live run.py holds its lock; a "running" summary that neither
    holds is a run that died, and counts as failed."""
    if running(job):
        return "not run"
    if status := job_status(job):
        return status
    return "failed" if _log(job).exists() else "not run"


def running(job: Job) -> bool:
    """Whether a live process has the run: a suite holds its claim (from before run.py starts), or run.py its run
    directory's lock. The kernel drops a dead holder's lock, so nothing stale needs cleaning up."""
    return locked_by(claim_path(job)) is not None or holder(job.run_dir) is not None


def claim_path(job: Job) -> Path:
    """The file a suite process flocks while it runs the job: two suites on one run folder (`runs:`) never run,
    and so never delete, the same job at once."""
    return job.run_dir.parent / f".seed{job.seed}.claim"


def _log(job: Job) -> Path:
    return job.run_dir.parent / f"seed{job.seed}.log"


def run_one(job: Job) -> tuple[Job, str, float]:
    """One run.py process with one thread, from scratch (an unfinished earlier attempt is removed); its console
    output goes to seed<k>.log beside the run directory. The job is claimed first and checked again under the
    claim, so a job another live process took, or completed, since this pass began is left as it is
    (status ELSEWHERE, or "completed")."""
    job.run_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(claim_path(job), "a", encoding="utf-8") as claim:
        try:
            fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return job, ELSEWHERE, 0.0
        if holder(job.run_dir) is not None:  # a run.py started by hand on this directory
            return job, ELSEWHERE, 0.0
        if job_status(job) == "completed":
            return job, "completed", 0.0
        shutil.rmtree(job.run_dir, ignore_errors=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "TOKENIZERS_PARALLELISM": "false"}
        cmd = [sys.executable, str(ROOT / "run.py"), *job_overrides(job), f"hydra.run.dir={job.run_dir}"]
        t0 = time.time()
        with open(_log(job), "w", encoding="utf-8") as out:
            subprocess.run(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
        return job, run_status(job.run_dir) or "failed", time.time() - t0


def run_jobs(jobs: list[Job], workers: int) -> dict[Job, str]:
    """Run what is not complete yet, `workers` at a time; one progress line per finished run. A completed run
    made with other settings than the suite file's is run again."""
    on_disk = {j: job_status(j) for j in jobs}
    status = {j: "completed" for j, st in on_disk.items() if st == "completed"}
    # A run another live process holds (a second suite on a shared run folder, `runs:`) is left to it: starting it
    # here would first delete the directory it is writing.
    elsewhere = [j for j in jobs if j not in status and running(j)]
    todo = [j for j in jobs if j not in status and j not in elsewhere]
    stale = sum(on_disk[j] == "stale" for j in todo)
    notes = [f"{stale} of them made with other settings than the suite file's"] if stale else []
    notes += [f"{len(elsewhere)} running in another process, left to it"] if elsewhere else []
    print(
        f"findings: {len(jobs)} runs, {len(status)} already complete, {len(todo)} to run"
        + "".join(f", {n}" for n in notes) + f" ({workers} at a time)"
    )  # fmt: skip
    t0, done = time.time(), 0
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for fut in as_completed([pool.submit(run_one, j) for j in todo]):
            job, st, secs = fut.result()
            done += 1
            if st == ELSEWHERE:  # taken by another process since this pass began: its status is read from disk
                print(f"[{done}/{len(todo)}] arm={job.arm} seed={job.seed} running in another process, left to it")
                continue
            status[job] = st
            line = job_line(
                [f"arm={job.arm}", f"seed={job.seed}"], ["arm", "seed"], job.arm, st, done, len(todo), secs,
                time.time() - t0,
            )  # fmt: skip
            print(line, flush=True)
    return status


def main(argv: list[str] | None = None) -> int:
    from analysis.findings import write_report

    p = argparse.ArgumentParser(prog="python -m analysis.suite", description=__doc__.splitlines()[0])
    p.add_argument("--suite", type=Path, default=DEFAULT_SUITE)
    p.add_argument("--out", type=Path, default=None, help="output folder (default: the suite file's folder)")
    p.add_argument("--quick", action="store_true", help="the suite's `quick` subset")
    p.add_argument("--jobs", type=int, default=None, help="parallel one-thread runs (default: the suite's)")
    p.add_argument("--report-only", action="store_true", help="no runs: verdicts from what is on disk")
    p.add_argument(
        "--seeds", type=parse_seeds, default=None,
        help="a replication's seeds, e.g. 3-12 or 3,5,8: runs and verdicts in their own folder (default "
        "<suite folder>/seeds_<seeds>), never pooled with the suite's own seeds",
    )  # fmt: skip
    p.add_argument(
        "--claims", type=parse_claims, default=None,
        help="only these claim ids, e.g. 12 or 1,12: their arms run; the suite folder's report still covers "
        "every claim, a replication's (--seeds) only these",
    )  # fmt: skip
    args = p.parse_args(argv)
    suite = Suite.load(args.suite)
    if args.claims is not None:
        unknown = sorted(set(args.claims) - {c["id"] for c in suite.claims})
        if unknown:
            ids = ", ".join(str(c["id"]) for c in suite.claims)
            raise SystemExit(f"error: --claims: {unknown} not in {suite.path.name} (claims: {ids})")
        chosen = [c for c in suite.claims if c["id"] in args.claims]
        if not any(c.get("cpu", True) and claim_arms(c) for c in chosen):
            tested = ", ".join(str(c["id"]) for c in suite.claims if c.get("cpu", True) and claim_arms(c))
            raise SystemExit(
                f"error: --claims: {args.claims} has no runs in {suite.path.name} (its report says why); claims "
                f"with runs: {tested}"
            )
        if args.seeds is not None:  # a replication's folder holds these claims' runs alone: it reports only them
            suite.claims = chosen
    # The quick subset writes its own folder: a fresh clone's quick pass must never replace the full report.
    out = args.out or (suite.path.parent / "quick" if args.quick else suite.path.parent)
    claims, seeds, only = suite.selection(args.quick)
    if args.claims is not None:
        # Only the chosen claims' arms run; the suite folder's report still covers every claim (from the runs on
        # disk), so rerunning one claim never shrinks FINDINGS.md to that claim.
        claims = [c for c in claims if c["id"] in args.claims]
    if args.seeds is not None:
        # A replication is a new experiment: the suite's rules on new seeds, decided on those seeds alone.
        suite.seeds = seeds = args.seeds
        suite.arm_seeds = {}
        out = args.out or suite.path.parent / f"seeds_{seeds_label(seeds)}"
    # A replication keeps its runs in its own folder; otherwise the suite file may name a shared one (`runs:`).
    # The quick subset shares the suite folder's runs, so a full pass after it reuses them.
    runs = suite.runs if suite.runs is not None and args.seeds is None else None
    runs = runs or (suite.path.parent / "runs" if args.quick and args.seeds is None else out / "runs")
    jobs = suite.jobs_for(claims, seeds, runs, only)
    if args.report_only and jobs and not any(j.run_dir.exists() or _log(j).exists() for j in jobs):
        # A report of nothing but "not run" says nothing, and would replace whatever report the folder holds.
        # (No job at all: every claim is not testable here, and that report says so.)
        raise SystemExit(
            f"error: --report-only: no run of this selection is on disk under {runs}; run `{report_command(args)}` "
            "without --report-only first (a rerun skips the runs that completed)"
        )
    t0 = time.time()
    ran = {} if args.report_only else run_jobs(jobs, args.jobs or suite.jobs)
    wall = time.time() - t0
    # The report covers every claim and every run on disk: a quick pass leaves the other claims inconclusive (no
    # runs), and a full pass after it reuses the quick runs.
    reported = claims if args.quick else suite.claims  # the quick folder's report covers the quick claims alone
    every = jobs if args.quick else suite.jobs_for(suite.claims, suite.seeds, runs)
    every += [j for j in jobs if j not in every]
    status = {j: ran.get(j) or disk_status(j) for j in every}
    stale = {j: settings_differ(j) or "" for j, s in status.items() if s == "stale"}
    failed = write_report(
        suite, reported, every, status, out, wall_s=wall, quick=args.quick, command=report_command(args), stale=stale
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
