"""Data-parallel training over processes (torchrun, gloo on CPU, FSDP2) gives the single-process update.

The worker (tests/dist_worker.py) takes one mini-batch through the trainer's pieces; the end-to-end test runs
`run.py` itself under torchrun.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import FAST_TRAINER, ROOT

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


def _env() -> dict[str, str]:
    env = {**os.environ, "WANDB_MODE": "offline", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = str(ROOT)
    return env


CASES = ["dppo:seq-mean-token-sum-norm", "drpo:token-mean", "grpo:token-sum"]


def worker(tmp_path: Path, launcher: list[str]) -> dict:
    out = tmp_path / f"world-{len(launcher)}.pt"
    cmd = [*launcher, str(ROOT / "tests" / "dist_worker.py"), str(out), *CASES]
    res = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return torch.load(out, weights_only=True)


def test_two_processes_give_the_single_process_loss_and_gradients(tmp_path):
    ones, twos = worker(tmp_path, [sys.executable]), worker(tmp_path, TORCHRUN)
    assert ones.keys() == twos.keys() == set(CASES)
    for case in CASES:  # objectives with three aggregations: the denominators differ
        one, two = ones[case], twos[case]
        assert (one["world"], two["world"]) == (1, 2)
        assert abs(one["loss"]) > 1e-3, case  # a real loss, not a vacuous zero
        assert abs(two["loss"] - one["loss"]) <= 1e-5, case
        assert abs(two["grad_norm"] - one["grad_norm"]) <= 1e-5 * max(1.0, one["grad_norm"]), case
        assert one["grads"].keys() == two["grads"].keys()
        for name, g in one["grads"].items():
            assert g.abs().max() > 0, (case, name)
            torch.testing.assert_close(two["grads"][name], g, atol=1e-5, rtol=0, msg=f"{case} {name}")


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_run_py_under_torchrun_matches_one_process_and_resumes(tmp_path, small_model):
    args = [
        str(ROOT / "run.py"), *small_model, *FAST_TRAINER, "rollout=hf", "objective=dppo", "trainer.minibatches=1",
        "trainer.total_steps=2", "trainer.checkpoint_every=1",
    ]  # fmt: skip

    def run(launcher: list[str], run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
        cmd = [*launcher, *args, f"hydra.run.dir={run_dir}", *extra]
        res = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert res.returncode == 0, res.stderr[-3000:]
        return res

    run([sys.executable], tmp_path / "one")
    res = run(TORCHRUN, tmp_path / "two")
    two = tmp_path / "two"
    summary = json.loads((two / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 2
    assert res.stdout.count("run finished: completed") == 1  # one summary, from rank 0
    rows = metrics(two)
    assert [r["step"] for r in rows] == [1, 2]  # written once, by rank 0
    # Rank 0's rollout is the single process's (same engine, same seeds), and each step's one update sums the
    # two ranks' halves of the batch: the same loss and gradient norm. (On this seed step 1 has no signal.)
    for r1, r2 in zip(metrics(tmp_path / "one"), rows, strict=True):
        assert r1["reward/mean"] == r2["reward/mean"] and r1["optim/updates"] == r2["optim/updates"]
        for key in ("optim/loss", "optim/grad_norm"):
            assert (r1.get(key) is None) == (r2.get(key) is None)
            if r1.get(key) is not None:
                assert abs(r1[key] - r2[key]) <= 1e-5, (key, r1[key], r2[key])
    assert sum(r["optim/updates"] for r in rows) >= 1
    assert (two / "checkpoints" / "step_2" / "model.safetensors").exists()

    # Resume under torchrun from the step-2 checkpoint for one more step: the full checkpoint goes back to shards.
    run(TORCHRUN, two, "trainer.total_steps=3", "trainer.resume=true", "trainer.resume_allow=[trainer.total_steps]")
    assert [r["step"] for r in metrics(two)] == [1, 2, 3]
    assert json.loads((two / "summary.json").read_text())["resumed_from_step"] == 2
