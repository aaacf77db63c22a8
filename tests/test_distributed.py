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
from safetensors.torch import load_file

from tests.conftest import FAST_TRAINER, ROOT

# Every test starts torchrun or run.py processes.
pytestmark = pytest.mark.slow

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


def _env() -> dict[str, str]:
    env = {**os.environ, "WANDB_MODE": "offline", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = str(ROOT)
    return env


# One process vs two: the same update up to float summation order.
TOL = 1e-4
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


def test_run_py_under_torchrun_matches_one_process_and_resumes_across_world_sizes(tmp_path, small_model):
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

    # The checkpoint is sharded (torch.distributed.checkpoint): each rank wrote its own file, nothing was gathered;
    # state.pt holds both ranks' RNG streams.
    step_2 = two / "checkpoints" / "step_2"
    assert sorted(p.name for p in step_2.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp", "state.pt"]
    assert len(torch.load(step_2 / "state.pt", weights_only=True)["rng_ranks"]) == 2
    check_sharded_checkpoint_loads_in_one_process(two, tmp_path / "one")

    # Across world sizes, both ways: the 2-process run resumes in one process (its shards resharded), the
    # 1-process run under torchrun (its full tensors scattered). Both then take the same step 3.
    allow = ["trainer.total_steps=3", "trainer.resume=true", "trainer.resume_allow=[trainer.total_steps]"]
    run([sys.executable], two, *allow)
    run(TORCHRUN, tmp_path / "one", *allow)
    for run_dir in (two, tmp_path / "one"):
        assert [r["step"] for r in metrics(run_dir)] == [1, 2, 3]
        assert json.loads((run_dir / "summary.json").read_text())["resumed_from_step"] == 2
    # The same rollout at step 3 (the engine's weights and seeds) and the same final weights (5.7e-7 apart when
    # measured; an optimizer a step off, as torch's state-dict helpers leave a fresh one, puts them 2.6e-5 apart).
    third = [metrics(run_dir)[2] for run_dir in (two, tmp_path / "one")]
    for key in ("reward/mean", "rollout/response_len_mean", "optim/updates"):
        assert third[0][key] == third[1][key], key
    finals = [load_file(run_dir / "policy" / "final" / "model.safetensors") for run_dir in (two, tmp_path / "one")]
    assert finals[0].keys() == finals[1].keys()
    for name, value in finals[0].items():
        torch.testing.assert_close(value, finals[1][name], rtol=0, atol=5e-6, msg=name)
    assert (two / "checkpoints" / "step_3" / "model.safetensors").exists()  # one process: the plain format
    assert (tmp_path / "one" / "checkpoints" / "step_3" / ".metadata").exists()


def check_sharded_checkpoint_loads_in_one_process(two: Path, one: Path) -> None:
    """The 2-process step-2 checkpoint, loaded here without a process group: the weights are the ones the run
    exported at step 2 (gathered from the same shards), the Adam state the 1-process run's at step 2."""
    from transformers import AutoModelForCausalLM

    from harness.loop.checkpoint import load_latest

    final = two / "policy" / "final"
    model = AutoModelForCausalLM.from_pretrained(json.loads((final / "policy.json").read_text())["base_model"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    assert load_latest(two, model, optimizer)["step"] == 2
    exported = AutoModelForCausalLM.from_pretrained(str(final)).state_dict()
    for name, value in model.state_dict().items():
        assert torch.equal(value, exported[name]), name
    reference = torch.load(one / "checkpoints" / "step_2" / "optimizer.pt", weights_only=True)["state"]
    loaded = optimizer.state_dict()["state"]
    assert loaded.keys() == reference.keys() and len(loaded) == len(list(model.parameters()))
    for i, slots in reference.items():
        assert loaded[i]["step"] == slots["step"] > 0
        for slot in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(loaded[i][slot], slots[slot], rtol=TOL, atol=TOL * slots[slot].abs().max())
