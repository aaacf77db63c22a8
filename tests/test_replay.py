"""Rollout replay (analysis/replay.py): every objective on the same saved tokens; saving them changes no training."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from analysis.replay import main, replay, summary
from harness.config import validate
from harness.loop.train import train
from harness.rundir.files import read_jsonl
from tests.conftest import FAST_TRAINER, compose


def batch(mu: list[float], pi: list[float], adv: list[float]) -> dict:
    """One sequence, one token per entry; entropy 1 on the first token, 0 elsewhere."""
    t = len(mu)
    return {
        "logp": torch.tensor([pi]).log(), "behavior_logp": torch.tensor([mu]).log(),
        "advantages": torch.tensor([adv]), "mask": torch.ones(1, t), "entropy": torch.tensor([[1.0] + [0.0] * (t - 1)]),
        "old_logp": None, "update": 0,
    }  # fmt: skip


def test_replay_on_hand_built_tokens():
    """Four tokens, A = +1 on all:
    - mu 0.05, pi 0.10: ratio 2 > 1.28, GRPO clips it; mu < 0.1, so Relax gives it back; |pi - mu| 0.05 < 0.15;
    - mu 0.50, pi 0.80: ratio 1.6, clipped by GRPO and Relax alike; pi - mu 0.3 > 0.15: beyond the TV boundary;
    - mu 0.50, pi 0.55: ratio 1.1, inside the clip window and the TV boundary, r != 1: DRPO penalises it;
    - mu 0.50, pi 0.50: r = 1: DRPO's penalty and its gradient vanish, so DRPO and Mask-DRPO agree.
    GRPO's clipped tokens: mean mu (0.05 + 0.5) / 2 = 0.275, half with mu < 0.1; Mask-DRPO differs from DRPO on the
    first and third tokens (inside the boundary with r != 1), never beyond it, where both penalise."""
    tokens = replay([batch([0.05, 0.5, 0.5, 0.5], [0.10, 0.8, 0.55, 0.5], [1.0] * 4)])
    out = summary(tokens)
    c3, c11 = out["claim3"], out["claim11"]
    assert out["tokens"] == 4
    assert c3["grpo_clipped"] == 2 and c3["clipped_mu_mean"] == pytest.approx(0.275)
    assert c3["clipped_low_mu_frac"] == 0.5 and c3["relax_frees"] == 1 and c3["relax_frees_all_low_mu"]
    assert c3["clipped_entropy_mean"] == pytest.approx(0.5) and c3["all_entropy_mean"] == pytest.approx(0.25)
    assert c11 == {**c11, "differ": 2, "beyond_boundary": 1, "differ_beyond_boundary": 0}
    # PG-IS zeroes nothing and weighs each token by r * A: 2, 1.6, 1.1, 1
    assert tokens.weights["pg_is"].tolist() == pytest.approx([2.0, 1.6, 1.1, 1.0], rel=1e-5)
    # DPPO-TV masks only the token beyond its boundary (pi - mu 0.3 > 0.15 with A > 0)
    assert tokens.weights["dppo_tv"].tolist() == pytest.approx([2.0, 0.0, 1.1, 1.0], rel=1e-5)
    # DRPO at delta 0.15: c = r A - |A| mu (r - 1) r / delta (the penalty's gradient through r = pi / mu)
    r = 1.1
    assert tokens.weights["drpo_0.15"][2] == pytest.approx(r - 0.5 * (r - 1) * r / 0.15, rel=1e-5)
    assert tokens.weights["drpo_mask_0.15"][2] == pytest.approx(r, rel=1e-5)
    rows = {row["objective"]: row for row in out["objectives"]}
    assert rows["grpo"]["zeroed"] == 2 and rows["pg_is"]["zeroed"] == 0 and math.isnan(rows["pg_is"]["zeroed_mu_mean"])


@pytest.mark.slow
def test_saving_batches_changes_no_training_and_the_replay_reads_them(tmp_path, small_model):
    base = (*small_model, *FAST_TRAINER, "rollout=hf", "trainer.total_steps=3", "trainer.group_size=8")
    metrics = {}
    for name, extra in (("plain", ()), ("saving", ("trainer.save_batches=[1,2,3]",))):
        raw = compose(*base, *extra)
        train(validate(raw), tmp_path / name, raw)
        metrics[name] = [{k: v for k, v in r.items() if not k.startswith(("perf/", "time/"))}
                         for r in read_jsonl(tmp_path / name / "metrics.jsonl")]  # fmt: skip
    assert metrics["saving"] == metrics["plain"]
    assert not (tmp_path / "plain" / "batches").exists()
    files = sorted((tmp_path / "saving" / "batches").glob("step_*.pt"))  # a step whose groups all tie saves nothing
    assert files and {f.name for f in files} <= {"step_1.pt", "step_2.pt", "step_3.pt"}
    for f in files:
        saved = torch.load(f)
        assert 1 <= len(saved) <= 2 and [b["update"] for b in saved] == list(range(len(saved)))  # 2 mini-batches
        assert saved[0]["logp"].shape == saved[0]["behavior_logp"].shape == saved[0]["entropy"].shape
    assert main([str(tmp_path / "saving"), "--out", str(tmp_path / "replay")]) == 0
    assert "## Claim 3" in (tmp_path / "replay" / "REPLAY.md").read_text()
    assert (tmp_path / "replay" / "figures" / "replay.png").read_bytes()[:4] == b"\x89PNG"


def test_a_run_without_saved_batches_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="no batches/step_<k>.pt; train with trainer.save_batches"):
        main([str(tmp_path)])


def test_the_2026_objectives_and_sequence_tis_on_hand_built_tokens():
    """The same four tokens with pi_old recomputed at (0.10, 0.5, 0.5, 0.5), so pi/pi_old = (1, 1.6, 1.1, 1) and
    pi_old/mu = (2, 1, 1, 1):
    - GRPO with sequence TIS: w = min(prod pi_old/mu, 2) = 2 on every token; the clip on pi/pi_old (1.28) zeroes the
      second; c = w r A with r = pi/pi_old: (2, 0, 2.2, 2);
    - IcePop: k = pi_old/mu inside [0.5, 5] everywhere; its clip on pi/pi_old (1.2) zeroes the second; c = k r A:
      (2, 0, 1.1, 1);
    - GSPO: the row's ratio exp(mean log pi/mu) = exp(1.2584 / 4) = 1.37 lies above 1 + 4e-4: every token zeroed.
    Without pi_old (a mu-anchored source run) the two pi_old objectives are reported as needing it."""
    b = batch([0.05, 0.5, 0.5, 0.5], [0.10, 0.8, 0.55, 0.5], [1.0] * 4)
    b["old_logp"] = torch.tensor([[0.10, 0.5, 0.5, 0.5]]).log()
    tokens = replay([b])
    assert tokens.weights["grpo_seq_tis"].tolist() == pytest.approx([2.0, 0.0, 2.2, 2.0], rel=1e-5)
    assert tokens.weights["icepop"].tolist() == pytest.approx([2.0, 0.0, 1.1, 1.0], rel=1e-5)
    assert tokens.weights["gspo"].tolist() == [0.0] * 4
    assert np.isfinite(tokens.weights["cppo"]).all()
    without = summary(replay([batch([0.05, 0.5], [0.1, 0.5], [1.0, 1.0])]))
    rows = {row["objective"]: row for row in without["objectives"]}
    assert rows["icepop"] == {"objective": "icepop", "needs_pi_old": True} and rows["grpo_seq_tis"]["needs_pi_old"]
    assert rows["gspo"]["zeroed"] == 2 and "needs_pi_old" not in rows["cppo"]


def test_sequence_share_and_the_corrections_weights_on_hand_built_tokens():
    """Two sequences of two tokens: GRPO's clip zeroes one token of the first (ratio 2), none of the second (ratio 1):
    one of two sequences has a zeroed token. With pi_old = (0.1, 0.5 | 0.5, 0.5) against mu = (0.05, 0.5 | 0.5, 0.5)
    the sequence TIS weights are min(prod pi_old/mu, 2) = (2 | 1): mean 1.5 over the four tokens, max 2, and none
    rejected."""
    b = batch([0.05, 0.5], [0.10, 0.5], [1.0, 1.0])
    two = {k: torch.cat([v, v]) if isinstance(v, torch.Tensor) else v for k, v in b.items()}
    two["logp"] = torch.tensor([[0.10, 0.5], [0.5, 0.5]]).log()
    two["behavior_logp"] = torch.tensor([[0.05, 0.5], [0.5, 0.5]]).log()
    two["old_logp"] = torch.tensor([[0.10, 0.5], [0.5, 0.5]]).log()
    doc = summary(replay([two]))
    rows = {row["objective"]: row for row in doc["objectives"]}
    assert rows["grpo"]["zeroed"] == 1 and rows["grpo"]["zeroed_seq_frac"] == 0.5
    assert rows["pg_is"]["zeroed_seq_frac"] == 0.0 and rows["pg_is"]["correction"] is None
    corr = rows["grpo_seq_tis"]["correction"]
    assert corr["is_weight_mean"] == pytest.approx(1.5) and corr["is_weight_max"] == pytest.approx(2.0)
