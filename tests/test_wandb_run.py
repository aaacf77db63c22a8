"""How runs appear in W&B (harness/loop/wandb_run.py): job type, name, group, top-level config. The offline W&B
runs that carry them are read back in tests/test_runlog.py, tests/test_train.py and tests/test_launchers.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.config import RunConfig, compose, validate
from harness.loop.wandb_run import MAX_NAME_CHARS, job_overrides, run_name, wandb_settings

SWEEP_JOB = [
    "+experiment=mini_dppo_main",
    "+experiment/arm=dppo_0.2",
    "seed=2",
    "trainer.lr=1e-4",
    "hydra/launcher=joblib",
    "hydra.sweep.dir=outputs/x/2026-12-01_10-00-00",
    "trainer.threads=1",
    "logger.mode=online",
    "model.path=Qwen/Qwen3-4B",
    "model.cache_dir=/tmp/cache",
    "~trainer.horizon",
]


@pytest.fixture(scope="module")
def cfg() -> RunConfig:
    return validate(compose("objective=dppo", "precision=bf16", "seed=2", "name=mini_dppo_main"))


def test_name_is_objective_and_the_overrides_that_tell_runs_apart(cfg: RunConfig) -> None:
    # Launcher, output folder, threads, logging, caches and the experiment file (the group) are left out; the
    # arm shows its last part, the hub id its last component; keys sorted, so the order typed does not matter.
    assert run_name(cfg, SWEEP_JOB) == "dppo-arm=dppo_0.2-model.path=Qwen3-4B-seed=2-trainer.lr=1e-4"
    assert run_name(cfg, SWEEP_JOB[::-1]) == run_name(cfg, SWEEP_JOB)
    # The seed is always there, whether typed or not: two seeds, two names.
    assert run_name(replace(cfg, seed=1), []) == "dppo-seed=1"
    assert run_name(replace(cfg, seed=3), []) == "dppo-seed=3"


def test_a_long_name_is_cut_and_stays_unique(cfg: RunConfig) -> None:
    many = [f"objective.key_{i:02d}=value" for i in range(12)]
    a, b = run_name(cfg, many), run_name(cfg, [*many[:-1], "objective.key_11=other"])
    assert len(a) == len(b) == MAX_NAME_CHARS and a != b and a[:80] == b[:80]
    assert a == run_name(cfg, many)  # deterministic


def test_settings_of_a_training_and_an_eval_run(cfg: RunConfig) -> None:
    assert job_overrides() == []  # outside a Hydra job: the name is the objective and the seed alone
    train = wandb_settings(cfg)
    assert (train.job_type, train.name, train.group) == ("train", "dppo-seed=2", "mini_dppo_main")
    assert train.config == {
        "objective": "dppo", "precision": "bf16", "model": "tiny", "seed": 2, "experiment": "mini_dppo_main",
        "benchmark": "arith",
    }  # fmt: skip
    ev = wandb_settings(replace(cfg, mode="eval", benchmark=replace(cfg.benchmark, name="aime24")))
    assert (ev.job_type, ev.name, ev.group) == ("eval", "eval-aime24-seed=2", "mini_dppo_main")
    assert wandb_settings(replace(cfg, logger=replace(cfg.logger, name="none"))) is None
