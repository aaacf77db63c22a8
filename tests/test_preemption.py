"""Issue 51: a real SIGTERM to a real run.py process mid-run (HF and vLLM engines) ends the run at a step boundary
with a checkpoint of that step, summary.json says preempted, run.py exits 75, and the run resumed with
trainer.resume=auto logs every step once and ends where an uninterrupted run of the same seed ends; a sweep
stopped the same way reports its jobs preempted and finishes on the rerun; an unreadable only checkpoint is
refused by resume=true and set aside by resume=auto."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.preemption import PREEMPTED_EXIT_CODE
from harness.rundir.files import read_jsonl
from tests.conftest import FAST_TRAINER, ROOT
from tests.test_faults import metric_steps, summary_of, wait_for, weights

pytestmark = pytest.mark.slow

STEPS = 6


def command(*extra: str, engine: str = "hf") -> list[str]:
    return [
        sys.executable, str(ROOT / "run.py"), *FAST_TRAINER, f"rollout={engine}", "objective=dppo",
        f"trainer.total_steps={STEPS}", "trainer.checkpoint_every=4", "trainer.eval_every=3", *extra,
    ]  # fmt: skip


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600)


def same_metrics(a: Path, b: Path) -> bool:
    """metrics.jsonl row for row, the wall-clock fields (perf/*) left out."""

    def rows(d: Path) -> list[dict]:
        return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in read_jsonl(d / "metrics.jsonl")]

    return rows(a) == rows(b)


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_sigterm_mid_run_checkpoints_that_step_and_the_resumed_run_ends_as_an_uninterrupted_one(
    tmp_path, small_model, engine
):
    run_dir = tmp_path / "stopped"
    args = command(*small_model, f"hydra.run.dir={run_dir}", engine=engine)
    proc = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: 2 in metric_steps(run_dir), proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == PREEMPTED_EXIT_CODE, err[-2000:]

    steps = metric_steps(run_dir)
    k = steps[-1]
    assert steps == list(range(1, k + 1)) and 2 <= k < 4, steps  # stopped before the scheduled checkpoint (4)
    summary = summary_of(run_dir)
    assert summary["status"] == "preempted" and summary["pid"] == proc.pid
    assert summary["preempted"] | {"received_at": None} == {
        "signal": "SIGTERM", "received_at": None, "stopped_after_step": k, "checkpoint_step": k, "abandoned": None,
    }  # fmt: skip
    assert summary["last_step"] == k
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step_{k}"
    assert "SIGTERM: stopping after the current step" in err
    assert f"preempted      by SIGTERM, checkpoint step_{k}: continue with trainer.resume=auto" in out

    res = run([*args, "trainer.resume=auto"], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert metric_steps(run_dir) == list(range(1, STEPS + 1))  # every step exactly once
    assert [e["step"] for e in read_jsonl(run_dir / "eval.jsonl")] == [0, 3, 6]
    summary = summary_of(run_dir)
    assert summary["status"] == "completed" and summary["resumed_from_step"] == k

    straight = tmp_path / "straight"
    # keep_checkpoints: checkpoints every step, the newest three kept (the schedule changes no number)
    res = run(
        [*command(*small_model, f"hydra.run.dir={straight}", engine=engine), "trainer.checkpoint_every=1",
         "trainer.keep_checkpoints=3"], tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert sorted(p.name for p in (straight / "checkpoints").glob("step_*")) == ["step_4", "step_5", "step_6"]
    assert same_metrics(straight, run_dir)
    assert read_jsonl(straight / "eval.jsonl") == read_jsonl(run_dir / "eval.jsonl")
    assert summary_of(straight)["final_score"] == summary["final_score"]
    a, b = weights(straight, STEPS), weights(run_dir, STEPS)
    assert all(torch.equal(a[name], b[name]) for name in a), "stopped-and-resumed weights differ"


def test_a_stopped_sweep_reports_its_jobs_preempted_and_the_rerun_with_resume_auto_finishes_them(tmp_path, small_model):
    sweep = tmp_path / "sweep"
    python, script, *overrides = command(*small_model, "seed=1,2", f"hydra.sweep.dir={sweep}")
    args = [python, script, "-m", *overrides, "hydra.sweep.subdir=job${hydra.job.num}"]
    first, second_dir = sweep / "job0", sweep / "job1"
    proc = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: 1 in metric_steps(first), proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == PREEMPTED_EXIT_CODE, err[-2000:]
    assert summary_of(first)["status"] == "preempted"
    second = summary_of(second_dir)  # did not start: the process had been told to stop
    assert second["status"] == "preempted" and second["preempted"]["not_started"] is True
    assert not (second_dir / "metrics.jsonl").exists()
    assert f"sweep: 2 of 2 jobs preempted under {sweep} (rerun the sweep with trainer.resume=auto" in err
    assert "failed" not in err

    res = run([*args, "trainer.resume=auto"], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"sweep: all 2 jobs completed under {sweep}" in res.stdout
    for job in (first, second_dir):
        assert metric_steps(job) == list(range(1, STEPS + 1))
        assert summary_of(job)["status"] == "completed"


def test_the_only_checkpoint_truncated_resume_true_refuses_resume_auto_starts_afresh(tmp_path, small_model):
    run_dir = tmp_path / "run"
    args = command(*small_model, f"hydra.run.dir={run_dir}", "trainer.total_steps=2", "trainer.checkpoint_every=2")
    assert run(args, tmp_path).returncode == 0
    model = run_dir / "checkpoints" / "step_2" / "model.safetensors"
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and ".hydra" not in p.parts}

    res = run([*args, "trainer.resume=true"], tmp_path)
    assert res.returncode == 2
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith(f"error: trainer.resume: {run_dir} has no readable checkpoint (step_2: "), line
    assert before == {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and ".hydra" not in p.parts}

    res = run([*args, "trainer.resume=auto"], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "no readable checkpoint" in res.stderr and "starting afresh" in res.stderr
    (aside,) = run_dir.glob("checkpoints.unreadable-*")
    assert (aside / "step_2" / "model.safetensors").read_bytes() == before[model]
    assert metric_steps(run_dir) == [1, 2]
    assert json.loads((run_dir / "summary.json").read_text())["resumed_from_step"] in (None, -1)


def worker_pid(parent: int, rank: int) -> int:
    """The pid of torchrun's worker process of `rank` (a child of the launcher with RANK=<rank> in its environment)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            environ = (stat.parent / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):  # a process that ended meanwhile
            continue
        if ppid == parent and f"RANK={rank}".encode() in environ:
            return int(stat.parent.name)
    raise AssertionError(f"no rank {rank} worker under pid {parent}")


def test_under_torchrun_a_signal_to_one_rank_stops_every_rank_after_the_same_step(tmp_path, small_model):
    from tests.test_distributed import TORCHRUN, _env

    run_dir = tmp_path / "two"
    python, *args = command(*small_model, f"hydra.run.dir={run_dir}", "trainer.minibatches=1")
    args = [*TORCHRUN, *args]
    proc = subprocess.Popen(args, env=_env(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: 1 in metric_steps(run_dir), proc)
    os.kill(worker_pid(proc.pid, rank=1), signal.SIGTERM)  # rank 0, which writes the run directory, gets none
    proc.communicate(timeout=180)

    steps = metric_steps(run_dir)
    k = steps[-1]
    assert steps == list(range(1, k + 1)) and k < STEPS, steps
    summary = summary_of(run_dir)
    assert summary["status"] == "preempted", summary
    assert summary["preempted"]["signal"] == "SIGTERM" and summary["preempted"]["checkpoint_step"] == k
    assert (run_dir / "checkpoints" / f"step_{k}" / ".metadata").exists()  # sharded: both ranks wrote theirs

    res = subprocess.run([*args, "trainer.resume=auto"], env=_env(), cwd=tmp_path, capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert metric_steps(run_dir) == list(range(1, STEPS + 1))
    assert summary_of(run_dir)["status"] == "completed"
