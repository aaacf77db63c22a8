"""RunLog: the run directory contract (JSONL, summary.json, resume) and the W&B mirror with real wandb."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.loop.runlog import RunLog
from harness.rundir.files import atomic_write_json, read_jsonl
from harness.rundir.wandb import WandbSettings, resolve_wandb_mode
from tests.conftest import wandb_run_record

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _wandb_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Keep wandb's caches and settings out of the home folder, and never let a real key leak into a test.
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb_home"))


def strict_lines(path: Path) -> list[dict]:
    """Parse every line, refusing NaN/Infinity, which json.dumps would emit but JSON does not allow."""

    def reject(token: str) -> None:
        raise AssertionError(f"{path} holds {token}")

    return [json.loads(line, parse_constant=reject) for line in path.read_text().splitlines()]


def test_log_converts_values_and_writes_valid_json(tmp_path: Path) -> None:
    run = RunLog(tmp_path, None, {}, resume=False)
    run.log(0, {"reward/mean": torch.tensor(0.25), "optim/lr": np.float32(0.5), "perf/n": np.int64(3)})
    run.log(1, {"objective/loss": float("nan"), "optim/grad_norm": torch.tensor(float("inf")), "x": 2})
    run.log_eval(1, {"benchmark": "arith", "avg@4": torch.tensor(0.5), "pass@4": 1.0})
    run.log_samples(1, [{"prompt": "1+1=", "completion": "2", "reward": 1.0}, {"prompt": "2+2=", "reward": 0}])
    run.finish("completed", {"best/eval/avg@4": 0.5})

    assert strict_lines(tmp_path / "metrics.jsonl") == [
        {"step": 0, "reward/mean": 0.25, "optim/lr": 0.5, "perf/n": 3},
        {"step": 1, "objective/loss": None, "optim/grad_norm": None, "x": 2},
    ]
    assert strict_lines(tmp_path / "eval.jsonl") == [{"step": 1, "benchmark": "arith", "avg@4": 0.5, "pass@4": 1.0}]
    samples = strict_lines(tmp_path / "samples.jsonl")
    assert [s["step"] for s in samples] == [1, 1] and samples[1] == {"step": 1, "prompt": "2+2=", "reward": 0}
    assert not (tmp_path / "wandb").exists()


def test_log_rejects_bad_input(tmp_path: Path) -> None:
    run = RunLog(tmp_path, None, {}, resume=False)
    run.log(3, {"a": 1.0})
    with pytest.raises(ValueError, match="step 3 is not after the last logged step 3"):
        run.log(3, {"a": 1.0})
    with pytest.raises(ValueError, match="'step' is reserved"):
        run.log(4, {"step": 1})
    with pytest.raises(ValueError, match=r"metrics\['bad'\]: cannot log a object"):
        run.log(4, {"bad": object()})
    assert len(read_jsonl(tmp_path / "metrics.jsonl")) == 1  # nothing half-written by the refused calls


def test_summary_is_running_until_finish(tmp_path: Path) -> None:
    run = RunLog(tmp_path, None, {}, resume=False)
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "running"
    run.log(0, {"a": 1.0})
    run.finish("completed", {"last/reward/mean": 0.75, "best/eval/avg@4": float("nan")})
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["error"] is None and summary["last_step"] == 0
    assert summary["last/reward/mean"] == 0.75 and summary["best/eval/avg@4"] is None
    assert summary["wall_time_s"] >= 0 and summary["wandb"] == {"mode": "disabled", "id": None}
    with pytest.raises(RuntimeError, match="twice"):
        run.finish("completed", {})


def test_crash_inside_with_block_marks_failed(tmp_path: Path) -> None:
    with pytest.raises(ZeroDivisionError), RunLog(tmp_path, None, {}, resume=False) as run:
        run.log(0, {"a": 1.0})
        _ = 1 / 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == "ZeroDivisionError: division by zero"


def test_finish_rejects_unknown_status_and_keeps_its_own_fields(tmp_path: Path) -> None:
    run = RunLog(tmp_path, None, {}, resume=False)
    with pytest.raises(ValueError, match="status='done'"):
        run.finish("done", {})
    with pytest.raises(ValueError, match=r"summary\['model'\]: cannot log a Linear"):
        run.finish("completed", {"model": torch.nn.Linear(1, 1)})
    run.finish("failed", {"status": "completed", "error": "short", "score": 1.0}, error="Traceback ...")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["status"], summary["error"], summary["score"]) == ("failed", "Traceback ...", 1.0)


def test_atomic_write_leaves_no_temp_files(tmp_path: Path) -> None:
    target = tmp_path / "summary.json"
    for i in range(5):
        atomic_write_json(target, {"i": i, "x": np.float64(1.5)})
    with pytest.raises(ValueError, match="cannot log a set"):
        atomic_write_json(target, {"i": {1, 2}})  # fails before any file is touched
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]
    assert json.loads(target.read_text()) == {"i": 4, "x": 1.5}


def test_fresh_run_refuses_a_directory_with_metrics(tmp_path: Path) -> None:
    RunLog(tmp_path, None, {}, resume=False).log(0, {"a": 1.0})
    with pytest.raises(ValueError, match="metrics.jsonl already exists; pass resume=True"):
        RunLog(tmp_path, None, {}, resume=False)


@pytest.mark.parametrize("tail", [b'{"step": 3, "a": 0.', b'{"step": 3, "a": 0.\n', b"\x00\x00\x00\x00"])
def test_resume_drops_a_torn_last_line(tmp_path: Path, tail: bytes) -> None:
    run = RunLog(tmp_path, None, {}, resume=False)
    for k in range(3):
        run.log(k, {"a": float(k)})
    metrics = tmp_path / "metrics.jsonl"
    complete = metrics.read_bytes()
    with open(metrics, "ab") as f:  # what a kill or power cut in the middle of a write leaves behind
        f.write(tail)

    assert [r["step"] for r in read_jsonl(metrics)] == [0, 1, 2]
    resumed = RunLog(tmp_path, None, {}, resume=True)
    assert metrics.read_bytes() == complete and resumed.last_step() == 2
    resumed.log(3, {"a": 3.0})
    assert [r["step"] for r in strict_lines(metrics)] == [0, 1, 2, 3]


def test_corruption_before_the_last_line_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        read_jsonl(path)


def test_truncate_after_removes_later_steps_everywhere(tmp_path: Path) -> None:
    run = RunLog(tmp_path, None, {}, resume=False)
    for k in range(6):
        run.log(k, {"a": float(k)})
        if k in (2, 4):
            run.log_eval(k, {"benchmark": "arith", "avg@4": k / 10})
            run.log_samples(k, [{"completion": str(k)}])
    del run  # the process died after step 5; the last checkpoint was at step 3

    resumed = RunLog(tmp_path, None, {}, resume=True)
    assert resumed.last_step() == 5
    resumed.truncate_after(3)
    assert resumed.last_step() == 3
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [0, 1, 2, 3]
    assert [r["step"] for r in read_jsonl(tmp_path / "eval.jsonl")] == [2]
    assert [r["step"] for r in read_jsonl(tmp_path / "samples.jsonl")] == [2]
    with pytest.raises(ValueError, match="not after the last logged step 3"):
        resumed.log(3, {"a": 3.0})
    resumed.log(4, {"a": 40.0})
    resumed.finish("completed", {})
    assert [r["a"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [0.0, 1.0, 2.0, 3.0, 40.0]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["resumed_from_step"] == 3 and summary["last_step"] == 4
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_truncate_after_minus_one_empties_a_run_without_checkpoint(tmp_path: Path) -> None:
    run = RunLog(tmp_path, None, {}, resume=False)
    run.log(0, {"a": 1.0})
    resumed = RunLog(tmp_path, None, {}, resume=True)
    resumed.truncate_after(-1)
    assert resumed.last_step() == -1 and read_jsonl(tmp_path / "metrics.jsonl") == []
    resumed.log(0, {"a": 2.0})


def test_wandb_mode_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert resolve_wandb_mode(WandbSettings(mode="offline")) == "offline"  # the config wins when it is set
    assert resolve_wandb_mode(WandbSettings()) == "disabled"  # else the environment
    assert resolve_wandb_mode(WandbSettings(mode="online", enabled=False)) == "disabled"
    assert resolve_wandb_mode(None) == "disabled"
    monkeypatch.setenv("WANDB_MODE", "dryrun")
    assert resolve_wandb_mode(WandbSettings()) == "offline"
    monkeypatch.delenv("WANDB_MODE")
    assert resolve_wandb_mode(WandbSettings()) == "offline"  # else offline
    with pytest.raises(ValueError, match="wandb mode='cloud' is not allowed"):
        resolve_wandb_mode(WandbSettings(mode="cloud"))
    monkeypatch.setenv("WANDB_MODE", "sometimes")
    with pytest.raises(ValueError, match="WANDB_MODE='sometimes' is not allowed"):
        resolve_wandb_mode(WandbSettings())


@pytest.mark.slow  # starts W&B's service process, which a busy machine can keep past the init guard
def test_wandb_offline_run_lives_inside_the_run_dir(tmp_path: Path) -> None:
    cfg = WandbSettings(mode="offline", group="g", name="n", job_type="train", tags=["t"], config={"objective": "dppo"})
    run = RunLog(tmp_path, cfg, {"objective": {"name": "dppo"}, "seed": 1}, resume=False)
    for k in range(3):
        run.log(k, {"reward/mean": torch.tensor(k / 2)})
    run.log_eval(2, {"benchmark": "arith", "avg@4": 0.5})
    run.log_samples(2, [{"prompt": "1+1=", "completion": "2", "reward": 1.0}])
    run.finish("completed", {"best/eval/avg@4": 0.5})

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["wandb"]["mode"] == "offline"
    run_id = summary["wandb"]["id"]
    offline = list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(offline) == 1 and (offline[0] / f"run-{run_id}.wandb").stat().st_size > 0
    assert len(read_jsonl(tmp_path / "metrics.jsonl")) == 3
    # What `wandb sync` would upload: the settings as given, the top-level fields beside the whole config.
    record = wandb_run_record(tmp_path)
    assert (record["name"], record["group"], record["job_type"]) == ("n", "g", "train")
    assert record["config"] == {"objective": "dppo", "cfg": {"objective": {"name": "dppo"}, "seed": 1}}

    # A resumed session continues the same W&B run id.
    resumed = RunLog(tmp_path, cfg, {}, resume=True)
    resumed.truncate_after(2)
    resumed.finish("completed", {})
    assert json.loads((tmp_path / "summary.json").read_text())["wandb"]["id"] == run_id


def test_wandb_disabled_writes_nothing(tmp_path: Path) -> None:
    run = RunLog(tmp_path, WandbSettings(mode="disabled"), {"a": 1}, resume=False)
    run.log(0, {"a": 1.0})
    run.finish("completed", {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "summary.json"]


def test_failing_wandb_log_warns_once_and_logging_continues(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run = RunLog(tmp_path, WandbSettings(mode="offline"), {}, resume=False)
    run.log(0, {"a": 0.0})
    run._wandb.finish()  # a W&B run that died under us: wandb.log now raises UsageError
    with caplog.at_level(logging.WARNING, logger="harness.loop.runlog"):
        for k in range(1, 4):
            run.log(k, {"a": float(k)})
    ours = [r.getMessage()[:15] for r in caplog.records if r.name == "harness.loop.runlog"]
    assert ours == ["W&B log failed,"]
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [0, 1, 2, 3]
    run.finish("completed", {})


def closed_port() -> int:
    """A local port nothing listens on, so connections are refused at once (no DNS, no network)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A fresh interpreter per case: wandb reads WANDB_BASE_URL once per process, and the exit time counts too.
ONLINE_SCRIPT = textwrap.dedent(
    """
    import json, logging, socket, sys, time
    import harness.loop.runlog as runlog
    logging.basicConfig(level=logging.WARNING, format="WARN %(name)s %(message)s")
    run_dir, hang, timeout = sys.argv[1], sys.argv[2] == "hang", float(sys.argv[3])
    if hang:  # a server that accepts connections and never answers
        server = socket.socket(); server.bind(("127.0.0.1", int(sys.argv[4]))); server.listen(64)
        runlog._INIT_GRACE_S = 1.0
    t0 = time.monotonic()
    run = runlog.RunLog(run_dir, runlog.WandbSettings(mode="online", init_timeout_s=timeout), {"a": 1}, False)
    for k in range(3):
        run.log(k, {"reward/mean": k / 2})
    run.finish("completed", {})
    print("ELAPSED", time.monotonic() - t0, flush=True)
    """
)


def run_online(tmp_path: Path, key: str, hang: bool, timeout_s: float) -> tuple[float, float, str]:
    port = closed_port()
    env = {**os.environ, "WANDB_API_KEY": key, "WANDB_BASE_URL": f"http://127.0.0.1:{port}"}
    if hang:  # not silent: wandb then looks the account up first, a request its init_timeout does not cover
        env["WANDB_SILENT"] = "false"
    args = [sys.executable, "-c", ONLINE_SCRIPT, str(tmp_path / "run"), "hang" if hang else "refuse", str(timeout_s)]
    t0 = time.monotonic()
    proc = subprocess.run([*args, str(port)], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    total = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-2000:]
    elapsed = float(re.search(r"ELAPSED (\S+)", proc.stdout).group(1))
    assert [r["step"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [0, 1, 2]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "completed"
    return elapsed, total, proc.stderr


@pytest.mark.slow  # starts a Python process per case
@pytest.mark.parametrize("key", ["dummy", "0123456789" * 4])
def test_wandb_online_without_network_warns_once_and_logs_locally(tmp_path: Path, key: str) -> None:
    # "dummy" is refused by wandb at once (keys have 40+ characters); a well-formed key gets as far as
    # connecting to the closed port and gives up after init_timeout_s.
    elapsed, total, stderr = run_online(tmp_path, key, hang=False, timeout_s=5.0)
    warnings = [line for line in stderr.splitlines() if line.startswith("WARN harness.loop.runlog")]
    assert len(warnings) == 1 and "W&B (online) unavailable" in warnings[0], stderr[-2000:]
    assert elapsed < 30 and total < 30


@pytest.mark.slow  # starts a Python process per case
def test_wandb_init_hang_is_cut_off_by_the_guard(tmp_path: Path) -> None:
    # A server that never answers: wandb's account lookup alone waits ~10 s before init_timeout starts, so
    # the thread guard (init_timeout_s + grace, here 1 + 1 s) is what returns control to training.
    elapsed, total, stderr = run_online(tmp_path, "0123456789" * 4, hang=True, timeout_s=1.0)
    # Whichever gives up first (the guard, or wandb's own init_timeout once its lookup is done) must warn once.
    assert "no answer in 2 s" in stderr or "unavailable, logging to" in stderr, stderr[-2000:]
    assert elapsed < 8  # wandb on its own needs ~11 s here
    print(f"guarded init returned after {elapsed:.1f} s; the process needed {total:.1f} s to exit")
