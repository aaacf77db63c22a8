"""The low-mu enrichment of clipped tokens (suite v8's claim 3): per sign of A, the share of clipped tokens with
mu < 0.1 and the share of all tokens with mu < 0.1, on a hand-built batch whose counts are known."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from analysis.run_metrics import METRICS
from harness.batch import TrainBatch
from harness.distributed import ProcessGroup
from harness.loop.diagnostics import ClippedTokens


def _batch(mu: list[list[float]], adv: list[float]) -> TrainBatch:
    b, t = len(mu), len(mu[0])
    ids = torch.arange(b * t).reshape(b, t)
    zeros = torch.zeros(b, 1, dtype=torch.long)
    logp = torch.tensor(mu).log()
    return TrainBatch(
        input_ids=torch.cat([zeros, ids], 1), attention_mask=torch.ones(b, t + 1, dtype=torch.long),
        position_ids=torch.arange(t + 1).expand(b, -1), prompt_len=1, response_ids=ids, mask=torch.ones(b, t),
        behavior_logp=logp, topk_ids=ids[..., None], topk_behavior_logp=logp[..., None],
        advantages=torch.tensor(adv)[:, None].expand(b, t).clone(),
    )  # fmt: skip


def test_shares_by_sign_of_advantage() -> None:
    # Row 0 (A > 0): mu 0.05, 0.08, 0.5, 0.9; the trust region zeroes the first and the third.
    # Row 1 (A < 0): mu 0.02, 0.6, 0.7, 0.95; it zeroes the second only.
    mb = _batch([[0.05, 0.08, 0.5, 0.9], [0.02, 0.6, 0.7, 0.95]], [1.0, -1.0])
    clipped = torch.tensor([[True, False, True, False], [False, True, False, False]])
    tokens = ClippedTokens()
    tokens.start_step()
    tokens.add(clipped, mb, entropy=torch.ones(2, 4))
    out = tokens.metrics(ProcessGroup())
    assert out["objective/lowmu_frac_pos"] == pytest.approx(2 / 4)  # 0.05 and 0.08 of four A > 0 tokens
    assert out["objective/clipped_lowmu_frac_pos"] == pytest.approx(1 / 2)  # 0.05 of the two clipped
    assert out["objective/lowmu_frac_neg"] == pytest.approx(1 / 4)
    assert out["objective/clipped_lowmu_frac_neg"] == pytest.approx(0.0)  # the clipped one has mu 0.6
    assert out["objective/clipped_mu_mean_pos"] == pytest.approx((0.05 + 0.5) / 2)


def test_no_clipped_token_is_nan() -> None:
    mb = _batch([[0.05, 0.5]], [1.0])
    tokens = ClippedTokens()
    tokens.start_step()
    tokens.add(torch.zeros(1, 2, dtype=torch.bool), mb, entropy=None)
    out = tokens.metrics(ProcessGroup())
    assert math.isnan(out["objective/clipped_lowmu_frac_pos"]) and out["objective/lowmu_frac_pos"] == 0.5


def test_run_metric_is_the_ratio_of_step_means() -> None:
    # Two steps: clipped tokens 0.6 and 0.2 low-mu (mean 0.4) against 0.1 and 0.1 of all tokens: enrichment 4.
    m = pd.DataFrame({
        "step": [1, 2], "objective/clipped_lowmu_frac_pos": [0.6, 0.2], "objective/lowmu_frac_pos": [0.1, 0.1],
        "objective/clipped_lowmu_frac_neg": [None, 0.3], "objective/lowmu_frac_neg": [0.2, 0.1],
    })  # fmt: skip
    m = m.astype(float)
    assert METRICS["lowmu_enrichment_pos"][0](m, pd.DataFrame()) == pytest.approx(4.0)
    # a step where nothing was clipped (NaN) leaves both means: 0.3 against 0.1 on the step that clipped
    assert METRICS["lowmu_enrichment_neg"][0](m, pd.DataFrame()) == pytest.approx(3.0)
    assert math.isnan(METRICS["lowmu_enrichment_pos"][0](pd.DataFrame({"step": [1]}), pd.DataFrame()))


def test_mismatch_slope_with_and_without_entropy() -> None:
    steps = pd.Series(range(1, 21), dtype=float)
    # A mismatch that grows 0.0002 per step (0.02 per 100 steps) at constant entropy: both slopes see it.
    m = pd.DataFrame({"step": steps, "mismatch/abs_prob_diff_mean": 0.01 + 0.0002 * steps, "rollout/entropy": 1.0})
    assert METRICS["mismatch_slope"][0](m, pd.DataFrame()) == pytest.approx(0.02)
    # A mismatch that only follows entropy, entropy rising with wiggles: the plain slope sees growth, the slope
    # with entropy held fixed sees none.
    entropy = 1.0 + 0.05 * steps + 0.1 * (steps % 3)
    m = pd.DataFrame({"step": steps, "mismatch/abs_prob_diff_mean": 0.5 * entropy, "rollout/entropy": entropy})
    assert METRICS["mismatch_slope"][0](m, pd.DataFrame()) > 2.0
    assert METRICS["mismatch_slope_given_entropy"][0](m, pd.DataFrame()) == pytest.approx(0.0, abs=1e-9)
    assert math.isnan(METRICS["mismatch_slope"][0](m.head(3), pd.DataFrame()))


def test_clipped_mu_by_side_by_hand() -> None:
    """Upper and lower clips apart: steps with no clipped token of a sign (NaN) are left out of that sign's mean."""
    m = pd.DataFrame({
        "objective/clipped_mu_mean_pos": [0.2, 0.4, None], "objective/clipped_mu_mean_neg": [None, 0.9, 0.7],
    }).astype(float)  # fmt: skip
    assert METRICS["clipped_mu_pos"][0](m, pd.DataFrame()) == pytest.approx(0.3)
    assert METRICS["clipped_mu_neg"][0](m, pd.DataFrame()) == pytest.approx(0.8)
    assert math.isnan(METRICS["clipped_mu_pos"][0](pd.DataFrame({"step": [1]}), pd.DataFrame()))
