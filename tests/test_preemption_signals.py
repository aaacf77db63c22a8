"""Issue 51, the unit tier: the stop handler (harness/preemption.py) records a real signal sent to this process and
nothing more, a second Ctrl-C still stops at once, the grace alarm abandons a step that runs on, the handlers
that were there before come back; the resume guard refuses an unreadable only checkpoint, or with
trainer.resume=auto moves it aside; trainer.preempt_signals names real signals only."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from harness import preemption
from harness.config import validate
from harness.config.compose import compose
from harness.loop.checkpoint import save_checkpoint
from harness.loop.resume_guard import ResumeRefused, guard, unreadable


@pytest.fixture(autouse=True)
def no_stop_before_or_after():
    preemption.clear()
    yield
    preemption.clear()


def test_a_signal_is_recorded_not_obeyed_and_the_old_handler_comes_back():
    seen = []
    old = signal.signal(signal.SIGUSR1, lambda s, f: seen.append(s))
    try:
        with preemption.StopSignals(["SIGTERM", "SIGUSR1"], grace_s=0):
            os.kill(os.getpid(), signal.SIGUSR1)
            stop = preemption.requested()
            assert stop is not None and stop.signal == "SIGUSR1"
            assert seen == []  # ours ran, not the previous one
            os.kill(os.getpid(), signal.SIGTERM)  # the default would end this process; recorded (first wins)
            assert preemption.requested().signal == "SIGUSR1"
        os.kill(os.getpid(), signal.SIGUSR1)
        assert seen == [signal.SIGUSR1]  # the previous handler is back
        preemption.hand_on()  # calls the replaced handler for the signal that stopped the run (submitit's, there)
        assert seen == [signal.SIGUSR1, signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_a_second_ctrl_c_stops_at_once():
    with preemption.StopSignals(["SIGINT"], grace_s=0):
        os.kill(os.getpid(), signal.SIGINT)
        assert preemption.requested().signal == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the handler runs between bytecodes; it never gets here


def test_the_grace_alarm_abandons_a_step_that_runs_on_and_is_cancelled_at_the_boundary():
    with preemption.StopSignals(["SIGUSR2"], grace_s=0.2) as stop:
        os.kill(os.getpid(), signal.SIGUSR2)
        t0 = time.monotonic()
        with pytest.raises(preemption.StepAbandoned, match="preempt_grace_s=0.2 s after SIGUSR2"):
            while time.monotonic() - t0 < 5:  # a step that would take 5 s
                time.sleep(0.01)
        assert 0.15 < time.monotonic() - t0 < 1.0
    preemption.clear()
    with preemption.StopSignals(["SIGUSR2"], grace_s=0.2) as stop:
        os.kill(os.getpid(), signal.SIGUSR2)
        stop.step_done()  # the step ended in time: the checkpoint that follows is not interrupted
        time.sleep(0.4)
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)


def test_preempt_signals_must_name_a_stop_signal():
    with pytest.raises(ValueError, match=r"^trainer.preempt_signals: SIGKILL is not allowed; choose from SIGTERM"):
        validate(compose("trainer.preempt_signals=[SIGTERM,SIGKILL]"))
    assert validate(compose("trainer.preempt_signals=[]")).trainer.preempt_signals == ()


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    return save_checkpoint(run_dir, step, model, optimizer, {"skipped_steps": 0})


def a_run_dir(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    checkpoint_dir(run_dir, 2)
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    return run_dir


def test_the_guard_passes_a_whole_checkpoint_and_names_a_truncated_one(tmp_path):
    folder = checkpoint_dir(tmp_path / "run", 2)
    assert unreadable(folder) is None
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert unreadable(folder).startswith("Error while deserializing header")
    folder = checkpoint_dir(tmp_path / "run2", 2)
    path = folder / "optimizer.pt"
    path.write_bytes(path.read_bytes()[:100])
    assert "zip" in unreadable(folder)


def test_resume_true_refuses_when_the_only_checkpoint_is_unreadable_and_touches_nothing(tmp_path):
    run_dir = a_run_dir(tmp_path)
    state = run_dir / "checkpoints" / "step_2" / "state.pt"
    state.write_bytes(b"not a checkpoint")
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    cfg = validate(compose("trainer.resume=true"))
    with pytest.raises(ResumeRefused) as e:
        guard(cfg, run_dir, write=True)
    assert str(e.value).startswith(f"trainer.resume: {run_dir} has no readable checkpoint (step_2: ")
    assert "\n" not in str(e.value)
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


def test_resume_auto_starts_afresh_and_keeps_the_unreadable_checkpoint_aside(tmp_path):
    run_dir = a_run_dir(tmp_path)
    model = run_dir / "checkpoints" / "step_2" / "model.safetensors"
    model.write_bytes(model.read_bytes()[:-10])
    kept = model.read_bytes()
    guard(validate(compose("trainer.resume=auto")), run_dir, write=True)
    assert not (run_dir / "checkpoints").exists()
    (aside,) = run_dir.glob("checkpoints.unreadable-*")
    assert (aside / "step_2" / "model.safetensors").read_bytes() == kept
    assert json.loads((run_dir / "run_config.json").read_text())["config"]["trainer"]["resume"] == "auto"


def test_resume_true_goes_on_when_an_older_checkpoint_is_readable(tmp_path):
    run_dir = a_run_dir(tmp_path)
    checkpoint_dir(run_dir, 4)
    (run_dir / "checkpoints" / "step_4" / "state.pt").write_bytes(b"")
    (run_dir / "run_config.json").write_text(json.dumps({"config": dataclasses.asdict(validate(compose()))}))
    guard(validate(compose("trainer.resume=true")), run_dir, write=True)  # step_2 will be loaded
    assert (run_dir / "checkpoints" / "step_4").exists()  # left for load_latest to warn about and skip
