"""The CUDA path, wherever a GPU is present (skipped on CPU-only machines such as this project's CI)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import FAST_TRAINER
from tests.test_launchers import run_py

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_three_bf16_rl_steps_on_cuda(tmp_path, small_model):
    res = run_py(
        tmp_path, *small_model, *FAST_TRAINER, "device=cuda", "precision=bf16", "rollout=hf", "objective=dppo",
        "trainer.total_steps=3", f"hydra.run.dir={tmp_path / 'run'}",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 3
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    # bf16 rollout copy vs bf16-autocast trainer on the same weights: a small, non-zero mismatch.
    assert all(0 <= r["mismatch/k3"] < 0.05 for r in rows)
