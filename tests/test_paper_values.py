"""Every full-scale experiment's jobs, as `mode=plan` resolves them, carry the papers' values.

The values live in one data file, tests/fixtures/paper_values.yaml. The in-process check expands each sweep as
Hydra's basic sweeper does (tests/test_experiments.py) and builds each job's PLAN record with the same function
`run.py ... mode=plan` prints (`harness.loop.job.plan_record`); one subprocess run of `run.py -m ... mode=plan` checks
that the command prints exactly those records and leaves no run directory behind.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import subprocess
import sys
from typing import Any

import pytest
import yaml

from harness.cli.checks import check_group_options
from harness.loop.job import PLAN_PREFIX, plan_record
from tests.test_experiments import FULL, ROOT, arm_of, arm_run, sweep_jobs

VALUES = yaml.safe_load((ROOT / "tests" / "fixtures" / "paper_values.yaml").read_text())


def flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and k != "architecture":
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def expected_arms(name: str) -> dict[str, dict[str, Any]]:
    """arm key (the job's overrides without the seed, sorted, comma-joined) -> every value the papers fix for it."""
    spec = VALUES["experiments"][name]
    shared = {**VALUES["settings"].get(spec.get("setting"), {}), **spec.get("overrides", {})}
    if "arms_grid" in spec:
        axes = [[(k, v) for v in vs] for k, vs in spec["arms_grid"].items()]
        arms = {}
        for combo in itertools.product(*axes):
            key = ",".join(sorted(f"{k}={v}" for k, v in combo))
            arms[key] = {("objective.name" if k == "objective" else k): v for k, v in combo}
    else:
        arms = dict(spec["arms"])
    if "arms_by_precision" in spec:
        arms = {
            ",".join(sorted([*key.split(","), f"precision={p}"])): {**values, "precision.name": p}
            for key, values in arms.items()
            for p in spec["arms_by_precision"]
        }
    return {key: {**shared, **values} for key, values in arms.items()}


@functools.cache
def planned(name: str) -> dict[str, dict[str, Any]]:
    """arm key -> the PLAN record's config (flattened) of each job, built in-process. The validated config is
    test_experiments' cached `arm_run` (a full-scale sweep has one seed, 0, the default), so running both modules
    composes each arm once."""
    out = {}
    for job in sweep_jobs(name):
        assert [o for o in job if o.startswith("seed=")] == ["seed=0"]
        record = plan_record(arm_run(name, arm_of(job)), list(job))
        assert record["overrides"] == list(job)
        out[",".join(arm_of(job))] = flat(json.loads(json.dumps(record["config"], default=list)))
    return out


def test_every_full_scale_experiment_has_paper_values():
    assert set(VALUES["experiments"]) == set(FULL)


@pytest.mark.slow  # plans every arm of every experiment (test_experiments' compositions)
@pytest.mark.parametrize("name", FULL)
def test_planned_jobs_carry_the_paper_values(name):
    want, got = expected_arms(name), planned(name)
    assert set(got) == set(want), f"{name}: arms differ from paper_values.yaml"
    for arm, values in want.items():
        wrong = {k: (got[arm].get(k, "<missing>"), v) for k, v in values.items() if got[arm].get(k, "<missing>") != v}
        assert not wrong, f"{name} [{arm}]: (planned, paper) = {wrong}"


@pytest.mark.slow  # starts run.py
def test_run_py_plan_prints_one_line_per_job_and_builds_nothing(tmp_path):
    name = "dppo_fig3_sanity"
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # trainer.threads stays null, as in-process
    env.update(WANDB_MODE="offline", PYTHONPATH=str(ROOT))
    res = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "-m", f"+experiment={name}", "mode=plan"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    lines = [json.loads(x[len(PLAN_PREFIX) :]) for x in res.stdout.splitlines() if x.startswith(PLAN_PREFIX)]
    assert len(lines) == len(sweep_jobs(name))
    assert all(f"+experiment={name}" in r["overrides"] for r in lines)  # the command line's own overrides too
    jobs = [tuple(o for o in r["overrides"] if not o.startswith("+experiment=")) for r in lines]
    by_arm = {",".join(arm_of(job)): flat(r["config"]) for job, r in zip(jobs, lines, strict=True)}
    assert by_arm == planned(name)
    assert list(tmp_path.iterdir()) == []  # no outputs/, no run directories


def test_misspelt_experiment_lists_the_valid_ones_in_one_line(capsys):
    with pytest.raises(SystemExit):
        check_group_options(["+experiment=dppo_fig10_topk"])
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "experiment=dppo_fig10_topk is not an option" in err
    assert all(n in err for n in FULL)
