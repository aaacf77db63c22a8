"""Issue 6: runs survive SIGKILL (also mid-checkpoint), a full disk, and an unwritable output directory.

Every run here is a real `python run.py` subprocess with the small model and the HF engine; the kills are real
SIGKILLs, the full disk is a real file-size limit (RLIMIT_FSIZE: writes past it fail with EFBIG).
"""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from harness.loop.runlog import read_jsonl
from tests.conftest import FAST_TRAINER, ROOT

pytestmark = pytest.mark.slow

STEPS = 6


def command(run_dir: Path, small_model: list[str], *extra: str) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "run.py"),
        *small_model,
        *FAST_TRAINER,
        "rollout=hf",
        "objective=dppo",
        f"trainer.total_steps={STEPS}",
        "trainer.checkpoint_every=2",
        "trainer.eval_every=3",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]


def start(run_dir: Path, small_model: list[str], *extra: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        command(run_dir, small_model, *extra), cwd=run_dir.parent, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, **kw,
    )  # fmt: skip


def wait_for(predicate, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"the run ended before the kill point: {proc.stderr.read()[-2000:]}"
        assert time.monotonic() < deadline, "kill point not reached"
        time.sleep(0.02)


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def metric_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    return [r["step"] for r in read_jsonl(path)] if path.exists() else []


def weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "checkpoints" / f"step_{step}" / "model.safetensors")


def test_sigkill_anywhere_then_resume_matches_an_uninterrupted_run(tmp_path, small_model):
    straight = tmp_path / "straight"
    res = subprocess.run(command(straight, small_model), cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]

    run_dir = tmp_path / "killed"
    # 1. Between checkpoints: step 3 is logged, the newest checkpoint is step 2.
    proc = start(run_dir, small_model)
    wait_for(lambda: 3 in metric_steps(run_dir), proc)
    kill(proc)
    # 2. In the middle of writing checkpoint 4 (files written, folder not yet renamed into place).
    proc = start(run_dir, small_model, "trainer.resume=true", "trainer.checkpoint_pause_s=30")
    ckpts = run_dir / "checkpoints"
    wait_for(lambda: any(p.name.startswith(".tmp-step_4") for p in ckpts.iterdir()), proc)
    kill(proc)
    assert not (ckpts / "step_4").exists()  # the half-written checkpoint never looks complete
    # 3. Right after a resume started (before its first step finished).
    proc = start(run_dir, small_model, "trainer.resume=true")
    wait_for(lambda: (run_dir / "summary.json").exists() and "running" in (run_dir / "summary.json").read_text(), proc)
    kill(proc)
    # 4. Finish.
    res = subprocess.run(
        command(run_dir, small_model, "trainer.resume=true"), cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-2000:]

    assert metric_steps(run_dir) == list(range(1, STEPS + 1))  # every step exactly once
    assert [e["step"] for e in read_jsonl(run_dir / "eval.jsonl")] == [0, 3, 6]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    a, b = weights(straight, STEPS), weights(run_dir, STEPS)
    assert all(torch.equal(a[k], b[k]) for k in a), "killed-and-resumed weights differ (fp32 CPU is bit-exact)"
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".tmp-")]


def test_full_disk_during_a_checkpoint_keeps_the_previous_one(tmp_path, small_model):
    run_dir = tmp_path / "run"
    first = subprocess.run(
        command(run_dir, small_model, "trainer.total_steps=2"), cwd=tmp_path, capture_output=True, text=True
    )
    assert first.returncode == 0, first.stderr[-2000:]
    size = (run_dir / "checkpoints" / "step_2" / "model.safetensors").stat().st_size

    def small_disk() -> None:  # logs fit, a model file does not
        resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, size // 2))

    proc = start(run_dir, small_model, "trainer.total_steps=4", "trainer.resume=true", preexec_fn=small_disk)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-2000:]
    assert "checkpoint step_4 could not be written" in err and "previous checkpoint is intact" in err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["checkpoint_failed_steps"] == [4]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["latest", "step_2"]  # no temp left
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_2"
    assert set(weights(run_dir, 2)) and metric_steps(run_dir) == [1, 2, 3, 4]


@pytest.mark.skipif(sys.platform != "linux", reason="needs /dev/null to be a character device")
def test_an_unwritable_output_directory_is_one_clear_line(tmp_path, small_model):
    target = Path("/dev/null/run")  # a path under a file: no user, root included, can create it
    res = subprocess.run(command(target, small_model), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    expected = "error: hydra.run.dir: cannot write to '/dev/null/run' (Not a directory); choose a writable folder"
    assert lines == [expected]
