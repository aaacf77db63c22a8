"""Issue 49 item 6: the step-1 mismatch health check (harness/health.py) on rows measured by real runs (findings v7,
seed 3100), the identity it rests on (mean(pi/mu) = 1 + k3 - k1, checked on the real mismatch function), and a
real run that prints the line and records the check in summary.json."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from harness import health
from harness.batch import TrainBatch
from harness.config import validate
from harness.config.compose import compose
from harness.loop.diagnostics import mismatch
from tests.conftest import FAST_TRAINER, ROOT

NO_DOSE = {"mismatch/k1": -9.407767009861345e-08, "mismatch/k3": 8.173743257754162e-14,
           "mismatch/abs_prob_diff_mean": 2.8949702368663566e-07}  # fmt: skip
NOISE_2 = {"mismatch/k1": 0.34268248081207275, "mismatch/k3": 0.3868512511253357,
           "mismatch/abs_prob_diff_mean": 0.05608006566762924}  # fmt: skip


def test_the_ratio_mean_is_one_plus_k3_minus_k1():
    g = torch.Generator().manual_seed(0)
    logp = torch.log_softmax(torch.randn(4, 7, 9, generator=g), -1)[..., 0]
    mu = logp + 0.3 * torch.randn(4, 7, generator=g)
    mask = (torch.rand(4, 7, generator=g) > 0.3).float()
    ids = torch.zeros(4, 7, dtype=torch.long)
    mb = TrainBatch(
        input_ids=ids, attention_mask=ids, position_ids=ids, prompt_len=0, response_ids=ids, mask=mask,
        behavior_logp=mu, topk_ids=ids[..., None], topk_behavior_logp=mu[..., None], advantages=torch.zeros(4, 7),
    )  # fmt: skip
    m = mismatch(logp, mb)
    ratio_mean = float(torch.exp(logp - mu)[mask > 0].mean())
    assert abs(ratio_mean - (1 + m["mismatch/k3"] - m["mismatch/k1"])) < 1e-6
    assert health.step_one(m)["ratio_mean_gap"] == pytest.approx(abs(ratio_mean - 1), abs=1e-6)
    # The adapters' tensor version (no host sync) gives the loop's numbers on the same tokens.
    adapters = health.mismatch_estimates(logp.requires_grad_(True), mu, mask)
    assert all(not v.requires_grad and v.dim() == 0 for v in adapters.values())
    for key, value in adapters.items():
        assert float(value) == pytest.approx(m[key], rel=1e-5), key


def test_no_dose_passes_and_records_its_values():
    record, line = health.check(NO_DOSE)
    assert line is None and record["over"] == [] and record["expected"] is None
    assert record["values"]["k3"] == NO_DOSE["mismatch/k3"]
    assert record["limits"] == {"ratio_mean_gap": 0.05, "k3": 0.01, "abs_prob_diff_mean": 0.02}


def test_a_dose_the_config_asked_for_is_named_not_blamed():
    record, line = health.check(NOISE_2, expected="rollout.logit_noise=2")
    assert record["over"] == ["k3", "abs_prob_diff_mean"]  # |k3 - k1| = 0.044 is under its 0.05
    assert line == (
        "health check after step 1: the training-inference mismatch is high (k3 0.387 > 0.01, abs_prob_diff_mean "
        "0.0561 > 0.02); expected here: rollout.logit_noise=2"
    )


def test_a_biased_sampler_moves_the_ratio_mean_and_the_line_names_the_causes():
    # truncated sampling (top-p) leaves mu too high on the tokens drawn: pi/mu averages below 1
    row = {"mismatch/k1": 0.07, "mismatch/k3": 0.004, "mismatch/abs_prob_diff_mean": 0.01}
    record, line = health.check(row)
    assert record["over"] == ["ratio_mean_gap"]
    assert line.startswith("health check after step 1: the training-inference mismatch is high (ratio_mean_gap ")
    assert "likely causes: sampling settings that change what the engine samples" in line
    assert "anchored on the trainer's recompute" in line and "precision gap" in line


def test_the_dose_and_context_come_from_the_config():
    assert health.expected_dose(validate(compose())) is None
    cfg = validate(compose("rollout=hf", "rollout.logit_noise=2", "precision=w4a4_rollout"))
    assert health.expected_dose(cfg) == "rollout.logit_noise=2, precision=w4a4_rollout"
    context = health.run_context(validate(compose("rollout.behavior=trainer", "objective=dppo_kl_recompute")))
    assert context["anchor"] == "old" and context["mu_from"] == "trainer (rollout.behavior=trainer)"
    assert context["sampling"]["temperature"] == 1.0


@pytest.mark.slow
def test_a_run_with_a_dose_prints_the_line_and_records_the_check(tmp_path, small_model):
    run_dir = tmp_path / "run"
    res = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *small_model, *FAST_TRAINER, "rollout=hf", "rollout.logit_noise=2",
         "trainer.total_steps=1", "trainer.checkpoint_every=0", f"hydra.run.dir={run_dir}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert "health check after step 1: the training-inference mismatch is high (" in res.stderr
    assert "expected here: rollout.logit_noise=2" in res.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["health"]["expected"] == "rollout.logit_noise=2" and "k3" in summary["health"]["over"]
    assert summary["behavior"] == {
        "anchor": "behavior", "mu_from": "hf", "precision": "fp32", "logit_noise": 2.0,
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": None, "min_p": None},
    }  # fmt: skip
