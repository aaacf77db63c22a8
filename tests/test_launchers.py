"""Sweeps through real Hydra launchers: a job that fails does not stop the others, its summary.json says why (with
the traceback), and the sweep's exit code counts the failures. Cluster launcher configs are composed, not run."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.config import validate
from harness.loop.wandb_run import run_name
from tests.conftest import FAST_TRAINER, ROOT, wandb_run_record

TWO_STEPS = ["rollout=hf", "trainer.total_steps=2", "objective=dppo"]


def run_py(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("OMP_NUM_THREADS", None)  # so the joblib test sees what the launcher sets, not what the shell had
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def jobs_by_override(sweep_dir: Path, key: str) -> dict[str, dict]:
    """{value of `key` in the job's overrides: its summary.json}; job folder names are hashed when long."""
    out = {}
    for overrides in sweep_dir.glob("*/.hydra/overrides.yaml"):
        value = dict(o.split("=", 1) for o in yaml.safe_load(overrides.read_text()))[key]
        out[value] = json.loads((overrides.parent.parent / "summary.json").read_text())
    return out


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


@pytest.mark.slow  # starts run.py
def test_a_sweep_in_its_default_stamped_folder_keeps_every_job_in_it_and_counts_them(tmp_path, small_model):
    """The default sweep directory is outputs/<name>/<start time>: every job goes under that one folder, however
    many seconds later it starts, and the progress lines and the end-of-sweep report count them (with the stamp
    read anew per job, the jobs were scattered over one folder per second and a failed sweep exited 0)."""
    res = run_py(tmp_path, "-m", *small_model, *FAST_TRAINER, *TWO_STEPS, "objective.delta=-1,0.1")
    assert res.returncode == 1, res.stderr[-3000:]
    [sweep] = [p.parent for p in (tmp_path / "outputs" / "default").glob("*/multirun.yaml")]
    assert [p.name for p in (tmp_path / "outputs" / "default").iterdir()] == [sweep.name]
    assert sorted(jobs_by_override(sweep, "objective.delta")) == ["-1", "0.1"]
    progress = [re.sub(r"\d+ (s|min)", "T", line) for line in res.stderr.splitlines() if line.startswith("[")]
    assert progress == ["[1/2] objective.delta=-1 done in T (failed), elapsed T, ~T left",
                        "[2/2] objective.delta=0.1 done in T (completed), elapsed T"], res.stderr[-3000:]  # fmt: skip
    assert last_line(res.stderr).startswith(f"sweep: 1 of 2 jobs failed under outputs/default/{sweep.name}: ")


@pytest.mark.slow  # starts run.py
def test_basic_sweep_runs_every_job_and_exits_with_the_number_failed(tmp_path, small_model):
    # A failed run left by an earlier sweep into the same directory: it must not be counted again.
    stale = tmp_path / "sweep" / "objective.delta=-9"
    (stale / ".hydra").mkdir(parents=True)
    (stale / ".hydra" / "overrides.yaml").write_text("- objective.delta=-9\n")
    (stale / "summary.json").write_text('{"status": "failed", "error": "from an earlier sweep"}')
    with_wandb = [o if o != "logger=none" else "logger=wandb" for o in FAST_TRAINER]
    res = run_py(
        tmp_path, "-m", *small_model, *with_wandb, *TWO_STEPS, "objective.delta=-1,0.1,-2",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    )  # fmt: skip
    assert res.returncode == 2, res.stderr[-3000:]
    assert last_line(res.stderr).startswith(f"sweep: 2 of 3 jobs failed under {tmp_path / 'sweep'}: ")
    assert "delta=-9" not in last_line(res.stderr)
    # A progress line per finished job, named by the swept key; the stale job of the earlier sweep is not counted.
    progress = [line for line in res.stderr.splitlines() if line.startswith("[")]
    assert [re.sub(r"\d+ (s|min)", "T", line) for line in progress] == [
        "[1/3] objective.delta=-1 done in T (failed), elapsed T, ~T left",
        "[2/3] objective.delta=0.1 done in T (completed), elapsed T, ~T left",
        "[3/3] objective.delta=-2 done in T (failed), elapsed T",
    ], res.stderr[-3000:]
    jobs = jobs_by_override(tmp_path / "sweep", "objective.delta")
    # The job between the two failures ran to the end: a failure did not stop the sweep.
    assert jobs["0.1"]["status"] == "completed" and jobs["0.1"]["steps"] == 2
    # Its W&B run (offline): a training job, in the experiment's group, named by the job's own Hydra overrides.
    (job,) = [p.parent.parent for p in (tmp_path / "sweep").glob("*/.hydra/overrides.yaml") if "=0.1" in p.read_text()]
    record = wandb_run_record(job)
    overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
    expected = run_name(validate(yaml.safe_load((job / ".hydra" / "config.yaml").read_text())), overrides)
    assert (record["job_type"], record["group"], record["name"]) == ("train", "default", expected)
    assert expected.startswith("dppo-benchmark.max_problems=12-model.")  # the test's many overrides: cut, hashed
    for delta in ("-1", "-2"):
        s = jobs[delta]
        assert s["status"] == "failed"
        assert s["error"] == f"objective.delta: must be > 0, got {float(delta)}"
        assert s["traceback"].startswith("Traceback") and "ValueError: objective.delta" in s["traceback"]
    assert "objective.delta: must be > 0, got -1.0" in res.stderr  # each failure also has its own stderr line


@pytest.mark.slow  # starts run.py
def test_joblib_sweep_isolates_a_failed_job(tmp_path, small_model):
    # No trainer.threads here: each job must take its thread count from the launcher (OMP_NUM_THREADS).
    fast = [o for o in FAST_TRAINER if not o.startswith("trainer.threads=")]
    not_a_model = tmp_path / "empty"  # exists, so it passes validation; train() fails to load it
    not_a_model.mkdir()
    res = run_py(
        tmp_path, "-m", "hydra/launcher=joblib", *small_model, *fast, *TWO_STEPS, f"model.path=null,{not_a_model}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    )  # fmt: skip
    assert res.returncode == 1, res.stderr[-3000:]
    assert last_line(res.stderr).startswith("sweep: 1 of 2 jobs failed under ")
    # The joblib workers print the progress lines: one per job, counted from the run directories.
    # Two jobs ending at the same moment may print the same count: the lines say [1/2] or [2/2].
    progress = [line for line in res.stderr.splitlines() if line.startswith("[")]
    assert len(progress) == 2, res.stderr[-3000:]
    assert all(re.match(r"\[[12]/2\] model\.path=\S+ done in \d+ s \((completed|failed)\)", p) for p in progress)
    jobs = jobs_by_override(tmp_path / "sweep", "model.path")
    assert jobs["null"]["status"] == "completed" and jobs["null"]["steps"] == 2
    failed = jobs[str(not_a_model)]
    assert failed["status"] == "failed" and "\n" not in failed["error"]
    assert failed["error"].startswith(f"folder '{not_a_model}' is not a loadable model")
    # train() raised it after its RunLog started: what train() wrote is kept, the traceback reaches into train().
    assert failed["objective"] == "dppo" and "harness/loop/state.py" in failed["traceback"]


@pytest.mark.slow  # starts joblib's worker processes
def test_joblib_workers_get_one_thread_each(monkeypatch):
    """The joblib test above relies on this: loky gives each of n_jobs=-1 workers cores // n_jobs = 1 thread
    (unless the caller's own OMP_NUM_THREADS, which loky passes on, says otherwise)."""
    import joblib

    from harness.loop.job import threads_from_env

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    if joblib.cpu_count() < 2:
        pytest.skip("one core: joblib runs the jobs in this process, one after another")
    assert joblib.Parallel(n_jobs=-1)(joblib.delayed(threads_from_env)() for _ in range(2)) == [1, 1]


@pytest.mark.parametrize(("value", "threads"), [("1", 1), ("4", 4), (" 2 ", 2), ("0", None), ("two", None), ("", None)])
def test_threads_from_env(monkeypatch, value, threads):
    from harness.loop.job import threads_from_env

    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert threads_from_env() == threads


@pytest.mark.slow  # starts run.py
def test_single_run_still_exits_2_with_one_line_and_records_the_traceback(tmp_path):
    res = run_py(tmp_path, "objective=dppo", "objective.delta=-1", f"hydra.run.dir={tmp_path / 'run'}")
    assert res.returncode == 2
    assert res.stderr.strip() == "error: objective.delta: must be > 0, got -1.0"
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["status"] == "failed" and s["error"] == "objective.delta: must be > 0, got -1.0"
    assert "Traceback" in s["traceback"]


# --- cluster launchers: composed here, run on a cluster ---


def launcher_config(*overrides: str) -> dict:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from harness.config import register_schemas

    register_schemas()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
    return OmegaConf.to_container(cfg.hydra.launcher, resolve=True)  # type: ignore[return-value]


def test_slurm_config_composes_with_one_gpu_per_job():
    launcher = launcher_config("hydra/launcher=slurm", "hydra.launcher.partition=gpu", "hydra.sweep.dir=/shared/s")
    assert launcher["_target_"] == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert launcher["partition"] == "gpu" and launcher["gpus_per_node"] == 1 and launcher["tasks_per_node"] == 1
    assert launcher["timeout_min"] == 1440 and launcher["mem_gb"] == 64 and launcher["cpus_per_task"] == 16
    assert launcher["submitit_folder"] == "/shared/s/.submitit/%j"
    assert launcher["setup"] == ["export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK"]


def test_slurm_config_has_exactly_the_plugins_fields():
    if importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None:
        pytest.skip("hydra-submitit-launcher is not installed: the slurm config composes but cannot launch")
    from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf

    # The plugin reads each field by name at launch and passes the rest on to sbatch, so none may be missing or extra.
    assert set(launcher_config("hydra/launcher=slurm")) == {f.name for f in dataclasses.fields(SlurmQueueConf)}


@pytest.mark.slow  # starts run.py
def test_slurm_launcher_gets_as_far_as_looking_for_slurm(tmp_path):
    if importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None:
        pytest.skip("hydra-submitit-launcher is not installed")
    if shutil.which("srun"):
        pytest.skip("this machine has SLURM: the test would submit real jobs")
    res = run_py(tmp_path, "-m", "hydra/launcher=slurm", "objective=dppo,drpo", f"hydra.sweep.dir={tmp_path / 's'}")
    # Hydra built the SlurmLauncher from the config; submitit stops where it needs the cluster.
    assert res.returncode == 1 and 'Could not detect "srun"' in res.stderr, res.stderr[-2000:]


def test_ray_config_composes():
    if importlib.util.find_spec("hydra_plugins.hydra_ray_launcher") is None:
        pytest.skip("hydra-ray-launcher is not installed (it pins cloudpickle<3, so joblib<1.6; see README)")
    launcher = launcher_config("hydra/launcher=ray", "+hydra.launcher.ray.remote.num_gpus=1")
    assert launcher["_target_"] == "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher"
    assert launcher["ray"]["init"]["address"] is None  # a local Ray unless ray.init.address=auto (a cluster)
    assert launcher["ray"]["remote"] == {"num_gpus": 1}


def test_sweep_size_counts_the_experiment_params_and_globs():
    """The [k/N] of the per-job lines: N from hydra.sweeper.params (an experiment file) and the command line, the way
    the basic sweeper expands them (a key given twice takes its last value)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import open_dict

    from harness.cli.checks import group_options
    from harness.cli.sweep import sweep_plan
    from harness.config import register_schemas

    register_schemas()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = hydra_compose("config", overrides=["+experiment=mini_dppo_main"], return_hydra_config=True)
    dppo = len([o for o in group_options("objective") if o.startswith("dppo")])
    with open_dict(cfg):
        cfg.hydra.overrides.task = ["+experiment=mini_dppo_main", "seed=0,1", "objective=glob(dppo*)"]
    # 4 arms x 2 seeds (the command line's seed replaces the file's 0,1,2) x the dppo* objectives.
    assert sweep_plan(cfg) == (4 * 2 * dppo, ["+experiment/arm", "seed", "objective"])
