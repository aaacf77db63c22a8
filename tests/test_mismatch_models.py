"""The rollout-side mismatch models that move with the policy (docs/mismatch.md): a quantised copy whose scales
stay where they were set, truncated sampling with mu recorded untruncated (and its cure), and a stale engine.
Each test fails when its model is switched off."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from harness.config import compose, validate
from harness.precision import rollout_weight_transform
from harness.quant import QuantSpec, ScaledCopy, amax_scale, quantize_state_dict
from harness.rollout.hf import _SampleAndRecord, truncate
from tests.conftest import FAST_TRAINER, ROOT

# --- a: the fixed-scale copy --------------------------------------------------------------------------------------


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model.layers.0.mlp.up_proj.weight": torch.randn(16, 32, generator=g),
        "model.embed_tokens.weight": torch.randn(8, 32, generator=g),
    }


def copy_error(transform, state: dict[str, torch.Tensor]) -> float:
    """The copy's mean error relative to the weights' mean magnitude (int4 on a fresh amax grid: ~0.10 here)."""
    name = "model.layers.0.mlp.up_proj.weight"
    return float((transform(state)[name] - state[name]).abs().mean() / state[name].abs().mean())


@pytest.mark.parametrize("factor", [1.5, 0.5])
def test_fixed_scales_error_grows_with_a_weight_move_and_refreshed_scales_stay_flat(factor: float) -> None:
    w0 = weights()
    # A planted move: the weights' range widens (entries past the old amax saturate) or narrows (the old grid is
    # coarse for them). Rounding on an amax grid is scale-equivariant, so refreshed scales keep the same relative error.
    moved = {k: v * factor for k, v in w0.items()}
    fixed, fresh = ScaledCopy("int4", refresh=0), ScaledCopy("int4", refresh=1)
    e_fixed0, e_fresh0 = copy_error(fixed, w0), copy_error(fresh, w0)
    assert e_fixed0 == e_fresh0  # the first sync sets the scales either way
    e_fixed1, e_fresh1 = copy_error(fixed, moved), copy_error(fresh, moved)
    assert e_fresh1 == pytest.approx(e_fresh0, rel=1e-5)  # flat
    assert e_fixed1 > 1.25 * e_fixed0, (e_fixed0, e_fixed1)  # measured: 0.102 -> 0.133 (x1.5), 0.230 (x0.5)
    # The embedding is never rounded; refresh 1 is the per-sync copy exactly.
    assert torch.equal(fixed(moved)["model.embed_tokens.weight"], moved["model.embed_tokens.weight"])
    spec = QuantSpec(weights="int4", activations="int4")
    name = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(ScaledCopy("int4", 1)(moved)[name], quantize_state_dict(moved, spec)[name])


def test_scales_refresh_every_k_syncs() -> None:
    copy = ScaledCopy("int8", refresh=3)
    name = "model.layers.0.mlp.up_proj.weight"
    states = [weights(s) for s in range(7)]
    seen = []
    for s in states:
        copy(s)
        seen.append(copy.scales[name].clone())
    # Syncs 0, 3, 6 set the scales from their own weights; 1-2 and 4-5 keep the last ones.
    for i in range(len(states)):
        setter = i // 3 * 3
        assert torch.equal(seen[i], amax_scale(states[setter][name], "int8")), i


def test_scale_refresh_needs_a_quantised_copy() -> None:
    assert isinstance(rollout_weight_transform("w4a4_rollout", 0), ScaledCopy)
    assert isinstance(rollout_weight_transform("fp8_rollout", 5), ScaledCopy)
    with pytest.raises(ValueError, match="rollout.scale_refresh: 0 needs a precision"):
        rollout_weight_transform("fp32", 0)


# --- b: truncated sampling ---------------------------------------------------------------------------------------


def sample_once(logits: torch.Tensor, mu: str, top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0, seed: int = 0):
    s = _SampleAndRecord(1.0, 2, torch.Generator().manual_seed(seed), top_p, top_k=top_k, min_p=min_p, mu=mu)
    out = s(torch.zeros(logits.shape[0], 1, dtype=torch.long), logits.clone())
    return out.argmax(dim=-1), s.stacked()[0][:, 0]


def test_top_p_records_untruncated_mu_and_the_cure_the_nucleus_one() -> None:
    # p = (0.5, 0.3, 0.15, 0.05): top_p 0.7 keeps the first two (0.5 < 0.7 <= 0.8), whose nucleus mass is 0.8.
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = p.log().repeat(400, 1)
    tokens, lp_full = sample_once(logits, "full", top_p=0.7)
    assert set(tokens.tolist()) == {0, 1}  # never outside the nucleus
    assert torch.allclose(lp_full.exp(), p[0, tokens], atol=1e-6)  # untruncated: 0.5 and 0.3
    tokens_t, lp_cut = sample_once(logits, "truncated", top_p=0.7)
    assert torch.equal(tokens, tokens_t)  # the same draws: only what is recorded differs
    assert torch.allclose(lp_cut.exp(), p[0, tokens] / 0.8, atol=1e-6)  # 0.625 and 0.375
    # The bias the cure removes: E_q[pi / mu_full] = 1 / 0.8 per sampled token's mass... pi/mu_full is 1 on every
    # token, while the true ratio pi/q is 0.8: IS with untruncated mu is off by the nucleus mass.
    assert torch.allclose(lp_full.exp() / lp_cut.exp(), torch.full_like(lp_full, 0.8), atol=1e-6)


def test_top_k_and_min_p_keep_what_they_should() -> None:
    p = torch.tensor([[0.4, 0.3, 0.2, 0.1]])
    kept = truncate(p, top_k=2, top_p=1.0, min_p=0.0)
    assert torch.equal(kept > 0, torch.tensor([[True, True, False, False]]))
    kept = truncate(p, top_k=0, top_p=1.0, min_p=0.4)  # keeps p >= 0.4 * 0.4 = 0.16
    assert torch.equal(kept > 0, torch.tensor([[True, True, True, False]]))
    kept = truncate(p, top_k=3, top_p=0.6, min_p=0.0)  # top-3 renormalised: 0.444, 0.333, 0.222 -> keep 2
    assert torch.equal(kept > 0, torch.tensor([[True, True, False, False]]))
    assert truncate(p, 0, 1.0, 0.0) is None
    tokens, lp = sample_once(p.log().repeat(300, 1), "truncated", top_k=2)
    assert set(tokens.tolist()) == {0, 1}
    assert torch.allclose(lp.exp(), p[0, tokens] / 0.7, atol=1e-6)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["rollout.top_p=0"], "rollout.top_p"),
        (["rollout.top_p=1.5"], "rollout.top_p"),
        (["rollout.sync_every=0"], "rollout.sync_every"),
        (["rollout.scale_refresh=-1"], "rollout.scale_refresh"),
        (["rollout.scale_refresh=0"], "needs a precision that quantises"),
        (["rollout.top_p=0.9"], "rollout.mu: full"),  # vLLM records renormalised log-probs
        (["rollout=hf", "rollout.top_k=5", "rollout.mu=truncated", "objective=dppo_topk_tv"], "rollout.mu: truncated"),
        (["rollout=hf", "rollout.sync_every=2", "rollout.sync=step"], "rollout.sync_every: 2"),
        (["rollout=hf", "rollout.sync_every=2", "trainer.max_staleness=1"], "rollout.sync_every: 2"),
        (["rollout=hf", "rollout.sync_every=2", "trainer.resume=auto"], "rollout.sync_every: 2"),
    ],
)
def test_bad_doses_are_refused_in_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message) as e:
        validate(compose(*overrides))
    assert "\n" not in str(e.value)


# --- c: a stale engine, in a real run ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 3])
def test_a_stale_engine_samples_from_the_weights_of_its_last_sync(tmp_path, small_model, k) -> None:
    """fp32 engine and trainer: mu = pi exactly when the engine is in step, and differs by the updates since its last
    sync otherwise. With k = 3 steps 2, 3 and 5 sample from weights 1, 2 and 1 steps old; 1 and 4 are fresh."""
    out = tmp_path / "run"
    args = [
        *small_model, *FAST_TRAINER, "rollout=hf", "objective=pg_is", "trainer.total_steps=5", "trainer.eval_every=5",
        "trainer.checkpoint_every=0", "trainer.lr=3e-3", f"rollout.sync_every={k}", f"hydra.run.dir={out}",
    ]  # fmt: skip
    res = subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=tmp_path, capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    gap = [r["mismatch/abs_prob_diff_mean"] for r in rows]
    stale = [(r["step"] - 1) % k for r in rows]
    assert [r.get("rollout/staleness", 0.0) for r in rows] == [float(s) for s in stale]
    # The policy moved since the engine's last sync when a step in between updated it (a step whose groups all
    # scored alike has no advantage, so no update).
    moved = [any(rows[j]["reward/adv_abs_mean"] > 0 for j in range(i - s, i)) for i, s in enumerate(stale)]
    for g, s, m in zip(gap, stale, moved, strict=True):
        if s == 0:
            assert g < 1e-5, (gap, stale)  # fresh: mu = pi to float rounding
        elif m:
            assert g > 1e-3, (gap, stale, moved)
    assert any(moved) or k == 1, "no stale step followed an update: the test saw nothing"
