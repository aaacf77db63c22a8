"""Issue 18: a run directory holds one run. One writer at a time (a lock naming its pid), a resume continues
the same experiment or is refused in one line without touching the directory, deliberate changes are named and
recorded, and nothing on the command line can make Hydra instantiate code.

Every check runs `python run.py` as a user would, with the small model and the HF engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from harness.rundir.files import read_jsonl
from harness.rundir.lock import RunDirBusy, RunDirLock, holder
from tests.conftest import FAST_TRAINER, ROOT
from tests.test_config import children_cpu_s, run_cli

# Every test starts Python processes: run.py on the small model, a second lock holder, a Hydra app.
pytestmark = pytest.mark.slow


def base(run_dir: Path, small_model: list[str], *extra: str) -> list[str]:
    """A 2-step grpo run into `run_dir`; `extra` may set any key again (one value per key: Hydra's rule)."""
    keys = {e.partition("=")[0] for e in extra}
    defaults = [d for d in ("objective=grpo", "trainer.total_steps=2") if d.partition("=")[0] not in keys]
    return [*small_model, *FAST_TRAINER, "rollout=hf", *defaults, "trainer.checkpoint_every=1",
            f"hydra.run.dir={run_dir}", *extra]  # fmt: skip


def one_line(res: subprocess.CompletedProcess) -> str:
    err = res.stderr.strip()
    assert err.splitlines() == [err], err[-3000:]
    return err


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, small_model) -> Path:
    """A completed 2-step grpo run, copied by each test that changes it."""
    tmp = tmp_path_factory.mktemp("finished")
    run_dir = tmp / "run"
    res = run_cli(*base(run_dir, small_model), cwd=tmp)
    assert res.returncode == 0, res.stderr[-2000:]
    return run_dir


def copy_of(run_dir: Path, tmp_path: Path) -> Path:
    import shutil

    target = tmp_path / "run"
    shutil.copytree(run_dir, target)
    return target


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_a_resume_with_another_objective_is_refused_and_the_directory_is_untouched(tmp_path, finished_run, small_model):
    run_dir = copy_of(finished_run, tmp_path)
    before = snapshot(run_dir)
    res = run_cli(*base(run_dir, small_model, "trainer.resume=true", "objective=drpo", "trainer.lr=0.5"), cwd=tmp_path)
    assert res.returncode == 2
    err = one_line(res)
    assert err.startswith("error: trainer.resume: the config differs from the run's in ")
    assert 'objective.name "grpo" -> "drpo"' in err and "trainer.lr 0.0001 -> 0.5" in err
    assert "trainer.resume_allow=[" in err
    # Hydra rewrote .hydra/ with the refused command before any of our code ran; the guard put the run's back.
    assert snapshot(run_dir) == before


def test_a_deliberate_change_is_allowed_by_name_recorded_and_used(tmp_path, finished_run, small_model):
    """More steps at another lr: refused until named in trainer.resume_allow; then the optimizer steps with the
    new lr (not the one restored from the checkpoint), which is also the lr logged."""
    run_dir = copy_of(finished_run, tmp_path)
    change = ["trainer.resume=true", "trainer.total_steps=3", "trainer.lr=2e-4"]
    refused = run_cli(*base(run_dir, small_model, *change), cwd=tmp_path)
    assert refused.returncode == 2 and "trainer.total_steps 2 -> 3" in one_line(refused)
    # eval_every and threads are operational: they may change without being named, and are not recorded.
    allow = ["trainer.resume_allow=[trainer.total_steps,trainer.lr]", "trainer.eval_every=5", "trainer.threads=1"]
    res = run_cli(*base(run_dir, small_model, *change, *allow), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[1]["optim/lr"] == pytest.approx(1e-4) and rows[2]["optim/lr"] == pytest.approx(2e-4)
    state = torch.load(run_dir / "checkpoints" / "step_3" / "optimizer.pt", weights_only=True)
    assert [g["lr"] for g in state["param_groups"]] == pytest.approx([2e-4] * len(state["param_groups"]))
    (record,) = read_jsonl(run_dir / "resume_changes.jsonl")
    assert record["changes"] == {"trainer.lr": [1e-4, 2e-4], "trainer.total_steps": [2, 3]}
    assert json.loads((run_dir / "run_config.json").read_text())["config"]["trainer"]["total_steps"] == 3


def test_the_final_and_best_policies_load_with_from_pretrained_and_mode_eval(tmp_path, finished_run):
    """Issue 19: policy/final and policy/best are Hugging Face model folders holding the trained weights, and
    `mode=eval model.path=<folder>` reproduces the training run's own evaluation of those weights."""
    from transformers import AutoModelForCausalLM

    from harness.loop.eval_only import read_weights

    evals = {r["step"]: r["avg@1"] for r in read_jsonl(finished_run / "eval.jsonl")}
    best_step = max((s for s in evals if s >= 1), key=lambda s: (evals[s], -s))  # ties keep the earlier step
    ids = torch.tensor([[4, 17, 9, 30, 5, 22, 11, 8]])
    for name, step in (("final", 2), ("best", best_step)):
        folder = finished_run / "policy" / name
        info = json.loads((folder / "policy.json").read_text())
        assert (info["step"], info["score_key"], info["score"]) == (step, "avg@1", evals[step])
        exported = AutoModelForCausalLM.from_pretrained(str(folder))
        # The trained policy: the base model with the step's checkpoint weights.
        trained = AutoModelForCausalLM.from_pretrained(info["base_model"])
        base_logits = trained(ids).logits
        trained.load_state_dict(read_weights(finished_run / "checkpoints" / f"step_{step}" / "model.safetensors"))
        with torch.no_grad():
            logits = exported(ids).logits
            assert torch.equal(logits, trained(ids).logits)
            assert not torch.allclose(logits, base_logits)  # training moved the weights: the check has teeth

    out = tmp_path / "eval"
    res = run_cli(
        "mode=eval", f"model.path={finished_run / 'policy' / 'final'}", "rollout=hf", "logger=none",
        "trainer.threads=1", "trainer.max_new_tokens=16", "benchmark.max_problems=12", f"hydra.run.dir={out}",
        cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert "evaluation finished: completed" in res.stdout
    (record,) = read_jsonl(out / "eval.jsonl")
    # Same problems, sampling seed (step 2's) and settings as the run's own evaluation after step 2.
    assert record["step"] == 2 and record["avg@1"] == evals[2]


def test_resume_with_nothing_to_resume_says_so_unless_auto(tmp_path, small_model):
    empty = tmp_path / "empty"
    start = children_cpu_s()
    res = run_cli(*base(empty, small_model, "trainer.resume=true"), cwd=tmp_path)
    assert res.returncode == 2 and children_cpu_s() - start < 60
    assert one_line(res).startswith(f"error: trainer.resume: {empty} has no checkpoint to resume from")
    assert not (empty / "metrics.jsonl").exists()
    res = run_cli(*base(empty, small_model, "trainer.resume=auto"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert [r["step"] for r in read_jsonl(empty / "metrics.jsonl")] == [1, 2]


def test_a_second_writer_is_refused_naming_the_first_and_a_dead_writers_lock_is_taken_over(tmp_path, small_model):
    run_dir = tmp_path / "run"
    first = subprocess.Popen(
        [sys.executable, str(ROOT / "run.py"), *base(run_dir, small_model, "trainer.total_steps=50")],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not (run_dir / "metrics.jsonl").exists():
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        hydra_before = snapshot(run_dir / ".hydra")
        second = run_cli(*base(run_dir, small_model, "trainer.resume=true"), cwd=tmp_path)
        assert second.returncode == 2
        assert one_line(second) == (
            f"error: hydra.run.dir: {run_dir} is being written by another process (pid {first.pid} on "
            f"{os.uname().nodename}); wait for it to end"
        )
        assert snapshot(run_dir / ".hydra") == hydra_before
    finally:
        first.kill()
        first.wait(timeout=60)
    # The dead writer's pid is still in .lock, but nobody holds the lock: the next run takes it over, warning once.
    assert (run_dir / ".lock").read_text().split()[0] == str(first.pid)
    res = run_cli(*base(run_dir, small_model, "trainer.resume=auto", "trainer.resume_allow=[trainer.total_steps]"),
                  cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"taking over the lock left by pid {first.pid}" in res.stderr
    assert (run_dir / ".lock").read_text() == ""  # a clean end leaves no pid behind


def test_the_lock_itself_refuses_a_second_process(tmp_path):
    """The in-process lock (sweep jobs, interpolated run directories: where run.py's early check cannot look)."""
    code = "import sys, time; from harness.rundir.lock import RunDirLock; RunDirLock(sys.argv[1]).acquire(); " \
           "print('held', flush=True); time.sleep(60)"  # fmt: skip
    other = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "held"
        assert holder(tmp_path) == f"pid {other.pid} on {os.uname().nodename}"
        with pytest.raises(RunDirBusy, match=f"being written by another process \\(pid {other.pid} on"):
            RunDirLock(tmp_path).acquire()
    finally:
        other.kill()
        other.wait(timeout=30)
    assert holder(tmp_path) is None  # the holder died: the lock is free again, and its pid is left to take over
    with RunDirLock(tmp_path):
        assert (tmp_path / ".lock").read_text().split()[0] == str(os.getpid())
    assert (tmp_path / ".lock").read_text() == ""


HYDRA_APP = """
import hydra

@hydra.main(version_base="1.3", config_path=None)
def main(cfg):
    pass

main()
"""


def test_a_target_on_the_command_line_is_refused_before_hydra_instantiates_it(tmp_path):
    target = tmp_path / "made_by_a_callback"
    payload = ["++hydra.callbacks.x._target_=os.makedirs", f"++hydra.callbacks.x.name={target}"]
    # The payload is real: a plain Hydra app runs it while it starts, before its task function.
    app = tmp_path / "app.py"
    app.write_text(HYDRA_APP)
    plain = subprocess.run([sys.executable, str(app), *payload, f"hydra.run.dir={tmp_path / 'plain'}"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert target.is_dir(), plain.stderr[-2000:]
    target.rmdir()
    res = run_cli(*payload, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert res.returncode == 2
    assert one_line(res).startswith("error: hydra.callbacks.x._target_: a _target_ or Hydra callback names code")
    assert not target.exists() and not (tmp_path / "run").exists()
    for other in ("+hydra.launcher._target_=os.system", "++hydra.callbacks={x: {_target_: os.makedirs}}"):
        res = run_cli(other, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
        assert res.returncode == 2 and "accepted only from the project's config files" in one_line(res)
