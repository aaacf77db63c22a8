"""Issue 19 (Hydra as everywhere): the command line is Hydra's. Nested options, glob/choice/range sweeps and
Hydra's flags anywhere on the line work; a bad option is still one line; --help lists the user-facing groups and
every key's help, and writes nothing."""

from __future__ import annotations

import json

import pytest

from harness.loop.job import PLAN_PREFIX
from tests.test_config import run_cli

# Every test starts run.py, as a user types the command line.
pytestmark = pytest.mark.slow


def test_cfg_job_works_with_overrides_before_and_nested_experiments(tmp_path):
    for args, expected in (
        (["model=qwen3_4b_base", "--cfg", "job"], "name: qwen3_4b_base"),
        (["+experiment=recipe/drpo_qwen3_4b", "--cfg", "job"], "path: Qwen/Qwen3-4B-Base"),
        (["--cfg", "job", "objective=dppo"], "name: dppo"),
    ):
        res = run_cli(*args, cwd=tmp_path)
        assert res.returncode == 0, res.stderr[-2000:]
        assert expected in res.stdout
    assert list(tmp_path.iterdir()) == []  # --cfg prints; no outputs/ folder


def test_glob_choice_and_range_sweeps_expand_as_hydra_does(tmp_path):
    res = run_cli("-m", "objective=glob(dppo_kl*)", "seed=range(1,3)", "mode=plan", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    plans = [json.loads(line[len(PLAN_PREFIX) :]) for line in res.stdout.splitlines() if line.startswith(PLAN_PREFIX)]
    jobs = sorted((p["config"]["objective"]["name"], p["config"]["seed"]) for p in plans)
    assert jobs == [("dppo_kl", 1), ("dppo_kl", 2), ("dppo_kl_recompute", 1), ("dppo_kl_recompute", 2)]


def test_a_bad_option_or_an_empty_glob_is_still_one_line(tmp_path):
    for arg, message in (
        ("objective=dpo", "error: objective=dpo is not an option; valid objective options: cispo"),
        ("objective=glob(zzz*)", "error: objective=glob(zzz*) matches no option; valid objective options: cispo"),
        ("+experiment=recipe/nope", "error: experiment=recipe/nope is not an option; valid experiment options: arm/"),
    ):
        res = run_cli("-m", arg, "mode=plan", cwd=tmp_path)
        err = res.stderr.strip()
        assert res.returncode == 2 and err.splitlines() == [err] and err.startswith(message), err


def test_help_lists_groups_and_key_help_and_writes_nothing(tmp_path):
    res = run_cli("--help", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    out = res.stdout
    assert "== Groups ==" in out and "objective: cispo, cispo_minimax, cppo, dppo" in out
    assert "trainer.lr (float, default 0.0001)" in out and "trainer.resume (bool | 'auto', default False)" in out
    assert "objective (dppo)" in out and "_schema" not in out
    assert "--multirun" in out  # Hydra's own flags are still listed
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv,info",
    [
        (["--help"], True), (["-h"], True), (["--hydra-help"], True), (["--version"], True),
        (["--cfg", "job"], True), (["-c", "hydra", "objective=dppo"], True), (["--info"], True),
        (["-i", "plugins"], True), (["--shell-completion", "install=bash"], True),
        (["objective=dppo"], False), (["-m", "seed=1,2"], False), (["--multirun", "+experiment=x"], False),
    ],
)  # fmt: skip
def test_hydras_flags_are_read_as_hydra_reads_them(argv, info):
    """run.py reads Hydra's flags itself (Hydra's parser is private): an info flag means nothing may be written."""
    from harness.cli.checks import _parse_overrides, info_requested

    assert info_requested(argv) is info
    parsed = _parse_overrides(argv)
    assert parsed is not None
    overrides, multirun = parsed
    assert multirun is ("-m" in argv or "--multirun" in argv)
    assert [o.input_line for o in overrides] == [a for a in argv if "=" in a]
