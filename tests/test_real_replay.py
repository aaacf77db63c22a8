"""The real-vocabulary token study (analysis/real_replay.py): its per-token measures on hand-built tokens, and the
ordering Binary <= Top-K <= exact TV that coarsening a distribution implies, on rollouts of the tiny model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from analysis.real_replay import Scored, Setting, mismatch_row, score
from harness.config import validate
from harness.loop.model_path import model_dir
from harness.rollout import make_engine
from tests.conftest import compose


def scored(mu: list[float], pi: list[float]) -> Scored:
    return Scored(
        logp=np.log(pi), mu_logp=np.log(mu), entropy=np.zeros(len(mu)), full=None, batch={}, reward_mean=0.0,
        seconds=0.0,
    )  # fmt: skip


def test_the_mismatch_row_on_hand_built_tokens():
    """Four tokens. mu 0.05 -> pi 0.06 (ratio 1.2, outside [0.9, 1.1], the one with mu < 0.1); mu 0.5 -> 0.5;
    mu 0.5 -> 0.56 (ratio 1.12, outside); mu 0.9 -> 0.9. Outside: 2 of 4; of the low-mu tokens 1 of 1, of the rest
    1 of 3; low mu among the outside tokens: 1 of 2. |pi - mu|: 0.01, 0, 0.06, 0 -> mean 0.0175, max 0.06."""
    row = mismatch_row(scored([0.05, 0.5, 0.5, 0.9], [0.06, 0.5, 0.56, 0.9]))
    assert row["tokens"] == 4
    assert row["outside_band"] == 0.5 and row["low_mu_frac"] == 0.25
    assert row["outside_band_low_mu"] == 1.0 and row["outside_band_high_mu"] == pytest.approx(1 / 3)
    assert row["low_mu_among_outside"] == 0.5
    assert row["abs_diff_mean"] == pytest.approx(0.0175) and row["abs_diff_max"] == pytest.approx(0.06)
    log_ratio = np.log([1.2, 1.0, 1.12, 1.0])
    assert row["log_ratio_sd"] == pytest.approx(log_ratio.std()) and row["log_ratio_mean"] == pytest.approx(
        log_ratio.mean()
    )
    assert "tv_full_mean" not in row  # no full distributions (the vLLM row): no TV columns


def test_no_token_outside_the_band_gives_no_share_among_them():
    row = mismatch_row(scored([0.05, 0.5], [0.05, 0.5]))
    assert row["outside_band"] == 0.0 and math.isnan(row["low_mu_among_outside"])


@pytest.fixture(scope="module")
def tiny_path(small_model) -> str:
    return str(model_dir(validate(compose(*small_model))))


def test_on_the_tiny_model_binary_top_k_and_exact_tv_are_ordered(tiny_path):
    """Binary's two buckets coarsen Top-K's (the sampled token is one of the K), which coarsen the full vocabulary,
    and TV can only shrink under coarsening: Binary <= Top-K <= exact, token by token, with a BF16 copy against
    the fp32 trainer. With an fp32 copy the two distributions are the same forward: every TV is 0."""
    policy = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()
    for precision in ("bf16", "fp32"):
        engine = make_engine("hf", tiny_path, precision, seed=1, max_model_len=256, device="cpu", max_topk=1)
        s = score(policy, engine, Setting(precision, "hf", precision), 1.0, n_prompts=4, group=4)
        engine.close()
        f = s.full
        assert f is not None and len(f["full_tv"]) == len(s.logp) > 0
        if precision == "fp32":
            assert np.abs(f["full_tv"]).max() == 0 and np.abs(f["binary_tv"]).max() == 0
            continue
        assert f["full_tv"].max() > 1e-4  # a BF16 copy moves the distribution
        assert (f["binary_tv"] <= f["topk_tv"] + 1e-6).all()
        assert (f["topk_tv"] <= f["full_tv"] + 1e-6).all()
        assert ((f["outside_top20"] >= -1e-6) & (f["outside_top50"] <= f["outside_top20"] + 1e-6)).all()
        row = mismatch_row(s)
        assert 0 < row["binary_share_of_full"] <= row["topk_share_of_full"] <= 1 + 1e-6
        # the replay batch is the rollout's: pi_old is pi (the first update), mu the engine's recorded log-probs
        assert torch.equal(s.batch["old_logp"], s.batch["logp"])
        assert torch.equal(s.batch["behavior_logp"][s.batch["mask"].bool()], torch.from_numpy(s.mu_logp).float())
