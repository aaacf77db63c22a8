"""Every objective against the hand-checked vectors of objectives.md §6, through the public API.

c_t = -d(loss_mat.sum())/d logp_t is the per-token gradient coefficient of the spec (ascent direction).
Expected values are the spec's table; a few are re-derived in comments so a reader can check them by hand.
"""

from __future__ import annotations

import math

import pytest
import torch

from harness.objectives import OBJECTIVE_NAMES, aggregate, get_objective

# id: (mu, pi, A)
VECTORS = {
    "V1": (0.01, 0.05, 1.0),  # low-prob token pushed up: r = 5
    "V2": (0.99, 0.80, -1.0),  # high-prob token dropped: r = 0.808081
    "V3": (0.5, 0.2, 1.0),  # A > 0 but pi fell: a corrective move
    "V4": (0.001, 0.02, 1.0),  # rare token: r = 20
    "V5a": (0.3, 0.44, 1.0),  # |pi - mu| = 0.14, inside delta 0.15
    "V5b": (0.3, 0.46, 1.0),  # |pi - mu| = 0.16, just outside
    "V6": (0.9, 0.6, -0.5),  # small negative advantage
}
IDS = list(VECTORS)

# Expected gradient coefficients c per objective (spec §6 columns), in VECTORS order.
EXPECTED_C = {
    ("grpo", ()): [0.0, -0.808081, 0.4, 0.0, 0.0, 0.0, 0.0],
    ("dppo", ()): [5.0, 0.0, 0.4, 20.0, 1.466667, 0.0, 0.0],
    ("dppo_kl", ()): [5.0, 0.0, 0.4, 20.0, 1.466667, 0.0, 0.0],
    ("drpo", ()): [3.666667, 0.215488, 1.2, 17.466667, 0.097778, -0.102222, 0.333333],
    ("drpo", (("delta", 12.5),)): [4.984, -0.795798, 0.4096, 19.9696, 1.45024, 1.51371, -0.325333],
    ("spo", (("eps", 12.5),)): [3.4, -0.795674, 0.4192, -10.4, 1.41191, 1.46791, -0.324444],
    ("spo", ()): [-95.0, -0.03265, 1.6, -1880.0, -1.95556, -2.55556, 0.222222],
    ("cispo_minimax", ()): [1.28, -0.808081, 0.4, 1.28, 1.28, 1.28, -0.333333],
    # CISPO as the DPPO paper runs it: truncated IS at C = 5 (V1 r = 5 is not above the cap; V4 20 -> 5).
    ("cispo", ()): [5.0, -0.808081, 0.4, 5.0, 1.466667, 1.533333, -0.333333],
    ("pg_is", ()): [5.0, -0.808081, 0.4, 20.0, 1.466667, 1.533333, -0.333333],
    # TIS at the sanity test's C = 3 (P-DPPO App. C): V1 min(5, 3) = 3, V4 min(20, 3) = 3.
    ("pg_tis", ()): [3.0, -0.808081, 0.4, 3.0, 1.466667, 1.533333, -0.333333],
    ("pg_tis", (("is_cap", 10.0),)): [5.0, -0.808081, 0.4, 10.0, 1.466667, 1.533333, -0.333333],
    # mask_neg blocks only A < 0 with mu - pi > 0.5: none of the vectors (V2 drops 0.19, V6 0.3) -> PG-IS.
    ("mask_neg", ()): [5.0, -0.808081, 0.4, 20.0, 1.466667, 1.533333, -0.333333],
    ("mask_neg", (("delta", 0.1),)): [5.0, 0.0, 0.4, 20.0, 1.466667, 1.533333, 0.0],
    # c = r (A - (pi - mu)/delta); V6: 2/3 * (-0.5 + 0.3/0.15) = 1.0
    ("drpo_no_absadv", ()): [3.666667, 0.215488, 1.2, 17.466667, 0.097778, -0.102222, 1.0],
    # c = A r (1 - sign(A (r - 1)) beta mu); V1: 5 * (1 - 0.01) = 4.95
    ("penalty_tv", ()): [4.95, -0.008081, 0.6, 19.98, 1.026667, 1.073333, -0.033333],
    # c = A r + |A| beta; V1: 5 + 1 = 6
    ("penalty_kl", ()): [6.0, 0.191919, 1.4, 21.0, 2.466667, 2.533333, 0.166667],
    # c = A r - |A| beta (r - 1); V1: 5 - 4 = 1
    ("penalty_k3", ()): [1.0, -0.616162, 1.0, 1.0, 1.0, 1.0, -0.166667],
    # DRPO only where DPPO-TV fires (V2, V5b, V6), PG-IS elsewhere.
    ("drpo_mask", ()): [5.0, 0.215488, 0.4, 20.0, 1.466667, -0.102222, 0.333333],
    # PPO symmetric 0.2: V5a r = 1.4667 > 1.2 clipped, V6 r = 0.667 < 0.8 clipped.
    ("ppo", ()): [0.0, -0.808081, 0.4, 0.0, 0.0, 0.0, 0.0],
}


def run(name, mu, pi, adv, mask=None, dtype=torch.float64, **kw):
    logp = torch.tensor(pi, dtype=dtype).log().reshape(1, -1).requires_grad_(True)
    behavior = torch.tensor(mu, dtype=dtype).log().reshape(1, -1)
    a = torch.tensor(adv, dtype=dtype).reshape(1, -1)
    m = torch.ones_like(a) if mask is None else torch.tensor(mask, dtype=dtype).reshape(1, -1)
    out = get_objective(name, **kw)(logp=logp, behavior_logp=behavior, advantages=a, mask=m)
    out.loss_mat.sum().backward()
    return -logp.grad[0], out


def vectors():
    mu, pi, adv = zip(*VECTORS.values(), strict=True)
    return list(mu), list(pi), list(adv)


@pytest.mark.parametrize("key", list(EXPECTED_C), ids=lambda k: k[0] + "".join(f"-{a}={b}" for a, b in k[1]))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_spec_gradient_coefficients(key, dtype):
    name, kw = key
    c, _ = run(name, *vectors(), dtype=dtype, **dict(kw))
    tol = 1e-4 if dtype == torch.float32 else 1e-5
    assert c.tolist() == pytest.approx(EXPECTED_C[key], rel=tol, abs=tol)


def test_spec_objective_values():
    mu, pi, adv = vectors()
    _, out = run("drpo", mu, pi, adv)
    # V1: 5 - 1/0.3 * 0.01 * 16 = 4.466667; V2: 0.808081*(-1) - 1/0.3 * 0.99 * 0.191919^2 = -0.929630
    assert (-out.loss_mat[0, :2]).tolist() == pytest.approx([4.466667, -0.929630], abs=1e-6)
    _, out = run("spo", mu, pi, adv)
    assert float(-out.loss_mat[0, 0].detach()) == pytest.approx(-35.0)  # 5 - 1/0.4 * 16
    _, out = run("drpo", mu, pi, adv, delta=12.5)
    assert float(-out.loss_mat[0, 2].detach()) == pytest.approx(0.3928, abs=1e-6)  # 0.4 - 1/25 * 0.5 * 0.36


def test_masked_method_loss_value_is_the_kept_surrogate():
    mu, pi, adv = vectors()
    c, out = run("dppo", mu, pi, adv)
    # For mask methods the value is M * min(r, C) * A, equal to c: loss curves share one scale.
    assert (-out.loss_mat[0]).tolist() == pytest.approx(c.tolist(), abs=1e-9)


def test_drpo_weight_changes_sign_exactly_where_dppo_flips():
    # V5a/V5b straddle delta = 0.15: DRPO's w goes 0.0667 -> -0.0667 exactly as DPPO-TV flips kept -> masked.
    mu, pi, adv = [0.3, 0.3], [0.44, 0.46], [1.0, 1.0]
    _, drpo = run("drpo", mu, pi, adv)
    assert drpo.metrics["objective/neg_weight_frac"].item() == pytest.approx(0.5)
    c_dppo, dppo = run("dppo", mu, pi, adv)
    assert c_dppo.tolist() == pytest.approx([1.466667, 0.0], abs=1e-6)
    assert dppo.metrics["objective/masked_frac_pos"].item() == pytest.approx(0.5)
    # With delta = 12.5 the weight never changes sign: the boundary is unreachable (objectives.md §2.5).
    _, drpo_big = run("drpo", [0.001, 0.999], [0.999, 0.001], [1.0, -1.0], delta=12.5)
    assert drpo_big.metrics["objective/neg_weight_frac"].item() == 0.0


@pytest.mark.parametrize("name", ["dppo", "dppo_recompute", "mask_neg"])
def test_dppo_boundary_is_kept(name):
    # 0.25 and 0.5 are exact in binary and their logs round-trip through exp: pi - mu == delta exactly.
    mu, pi = [0.25, 0.25], [0.5, 0.5 + 1e-6]
    kw = {"delta": 0.25}
    old = torch.tensor(mu, dtype=torch.float64).log().reshape(1, -1)
    logp = torch.tensor(pi, dtype=torch.float64).log().reshape(1, -1).requires_grad_(True)
    if name == "mask_neg":  # the negative side: mu - pi == delta with A < 0
        mu, pi, adv = [0.5, 0.5 + 1e-6], [0.25, 0.25], [-1.0, -1.0]
        old = torch.tensor(mu, dtype=torch.float64).log().reshape(1, -1)
        logp = torch.tensor(pi, dtype=torch.float64).log().reshape(1, -1).requires_grad_(True)
    else:
        adv = [1.0, 1.0]
    out = get_objective(name, **kw)(
        logp=logp,
        behavior_logp=old,
        old_logp=old,
        advantages=torch.tensor([adv], dtype=torch.float64),
        mask=torch.ones(1, 2, dtype=torch.float64),
    )
    out.loss_mat.sum().backward()
    c = -logp.grad[0]
    assert c[0] != 0, "a token exactly at the boundary is kept (strict >)"
    assert c[1] == 0, "a token just past the boundary is masked"


def test_dppo_is_directional_never_blocks_corrective_moves():
    # A > 0 with pi far below mu, A < 0 with pi far above mu: both move back toward mu -> always kept (P9).
    for name in ("dppo", "dppo_kl"):
        c, out = run(name, [0.9, 0.05], [0.05, 0.9], [1.0, -1.0])
        assert c.tolist() == pytest.approx([0.05 / 0.9, -0.9 / 0.05])
        assert out.metrics["objective/masked_frac"].item() == 0.0


def test_anchor_old_moves_the_mask_not_the_importance_weight():
    # mu = 0.5 (engine), pi_old = 0.2 (trainer recompute), pi = 0.4, A = +1.
    # behavior anchor: pi < mu -> corrective, kept. old anchor: pi - pi_old = 0.2 > 0.15 -> masked.
    logp = torch.tensor([[0.4]]).log().requires_grad_(True)
    kw = dict(behavior_logp=torch.tensor([[0.5]]).log(), advantages=torch.ones(1, 1), mask=torch.ones(1, 1))
    old = torch.tensor([[0.2]]).log()
    out = get_objective("dppo")(logp=logp, old_logp=old, **kw)
    out.loss_mat.sum().backward()
    assert -logp.grad.item() == pytest.approx(0.8)  # kept, weight r = pi/mu = 0.8
    logp.grad = None
    out = get_objective("dppo_recompute")(logp=logp, old_logp=old, **kw)
    out.loss_mat.sum().backward()
    assert logp.grad.item() == 0.0
    # MiniRL: the clip on pi/pi_old = 2 > 1.28 drops the token; GRPO on pi/mu = 0.8 keeps it.
    logp.grad = None
    get_objective("minirl")(logp=logp, old_logp=old, **kw).loss_mat.sum().backward()
    assert logp.grad.item() == 0.0
    with pytest.raises(ValueError, match="old_logp"):
        get_objective("minirl")(logp=logp, **kw)


def test_grpo_relax_only_frees_low_probability_tokens():
    # V1 (mu 0.01 < alpha) and V4 are clipped by GRPO but freed by Relax-both; V5a (mu 0.3) stays clipped.
    mu, pi, adv = vectors()
    c, _ = run("grpo_relax", mu, pi, adv)
    assert c.tolist() == pytest.approx([5.0, -0.808081, 0.4, 20.0, 0.0, 0.0, 0.0], abs=1e-6)
    c_low, _ = run("grpo_relax", mu, pi, adv, sides="low")  # only the A < 0 side is relaxed: V1, V4 stay clipped
    assert c_low.tolist() == pytest.approx(EXPECTED_C[("grpo", ())], abs=1e-6)
    c0, _ = run("grpo_relax", mu, pi, adv, alpha=0.0)  # alpha = 0 is plain GRPO
    assert c0.tolist() == pytest.approx(EXPECTED_C[("grpo", ())], abs=1e-6)


def test_top_k_vector_srl_and_paper_conventions():
    from harness import divergence

    # mu: a=0.6, b=0.3, c=0.05 (sampled); pi: a=0.5, b=0.35, c=0.08.
    def lg(*p):
        return torch.tensor(p, dtype=torch.float64).log()

    srl_mu, srl_pi = lg(0.6, 0.05), lg(0.5, 0.08)  # K=2, c overwrites b: rest 0.35 / 0.42
    assert divergence.topk_tv(srl_pi, srl_mu).item() == pytest.approx(0.10)
    assert divergence.topk_kl(srl_pi, srl_mu).item() == pytest.approx(0.0220802, abs=1e-7)
    paper_mu, paper_pi = lg(0.6, 0.3, 0.05), lg(0.5, 0.35, 0.08)
    assert divergence.topk_tv(paper_pi, paper_mu).item() == pytest.approx(0.10)
    assert divergence.topk_kl(paper_pi, paper_mu).item() == pytest.approx(0.0228239, abs=1e-7)
    assert divergence.binary_tv(lg(0.08), lg(0.05)).item() == pytest.approx(0.03)
    assert divergence.binary_kl(lg(0.08), lg(0.05)).item() == pytest.approx(0.0069837, abs=1e-7)
    # Binary <= Top-K: a lower bound, as P-DPPO §4.4 says.
    assert divergence.binary_kl(lg(0.08), lg(0.05)) < divergence.topk_kl(srl_pi, srl_mu)


def test_top_k_objective_uses_top_k_divergence():
    # Sampled token c: pi 0.08 > mu 0.05, A > 0. Binary-TV 0.03 and Top-K TV 0.10 straddle delta = 0.05.
    topk_mu = torch.tensor([[[0.6, 0.05]]]).log()
    topk_pi = torch.tensor([[[0.5, 0.08]]]).log()
    kw = dict(
        behavior_logp=torch.tensor([[0.05]]).log(),
        advantages=torch.ones(1, 1),
        mask=torch.ones(1, 1),
        topk_logp=topk_pi,
        topk_behavior_logp=topk_mu,
    )
    for name, masked in (("dppo", False), ("dppo_topk_tv", True)):
        logp = torch.tensor([[0.08]]).log().requires_grad_(True)
        get_objective(name, delta=0.05)(logp=logp, **kw).loss_mat.sum().backward()
        assert (logp.grad.item() == 0.0) == masked
    with pytest.raises(ValueError, match="topk"):
        get_objective("dppo_topk_kl")(logp=logp, **{k: v for k, v in kw.items() if not k.startswith("topk")})


AGG_CASE = (
    torch.tensor([[1.0, 1.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0], [9.0, 9.0, 9.0, 9.0]]),
    torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]),
)


@pytest.mark.parametrize(
    "mode,expected",
    [
        ("token-mean", 10 / 6),  # (1+1+2*4)/6 = 1.666667
        ("seq-mean-token-mean", 1.5),  # (1 + 2)/2; the fully masked third row is ignored
        ("seq-mean-token-sum", 5.0),  # (2 + 8)/2
        ("seq-mean-token-sum-norm", 0.625),  # 5/8 (verl HEAD; SRL-era without seq-mean would give 1.25)
        ("token-sum", 10.0),
    ],
)
def test_aggregation_vectors(mode, expected):
    loss, mask = AGG_CASE
    assert aggregate(loss, mask, mode=mode, horizon=8).item() == pytest.approx(expected)


def test_aggregation_errors_and_empty_batch():
    loss, mask = AGG_CASE
    with pytest.raises(ValueError, match="horizon"):
        aggregate(loss, mask, mode="seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(loss, mask, mode="mean")
    assert aggregate(loss, torch.zeros_like(mask), mode="seq-mean-token-mean").item() == 0.0


# GSPO's recipe bounds (3e-4 / 4e-4) clip every sequence of the batch below (s = 1.19 for A > 0, 0.87 for A < 0):
# widened so that its row 0 keeps a gradient to check.
WIDE = {"gspo": {"eps_low": 0.5, "eps_high": 0.5}}


@pytest.mark.parametrize("name", OBJECTIVE_NAMES)
def test_every_objective_zero_advantage_padding_and_metrics(name):
    b, t, k = 3, 5, 4
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(b, t, k, generator=g)
    lp_all = torch.log_softmax(logits, -1)
    mu_all = torch.log_softmax(logits + 0.3 * torch.randn(b, t, k, generator=g), -1)
    logp = lp_all[..., 0].clone()
    behavior = mu_all[..., 0].clone()
    mask = torch.ones(b, t)
    mask[0, 3:] = 0
    adv = torch.tensor([[1.0] * t, [0.0] * t, [-0.5] * t])
    # Poison the padding: NaN / inf there must reach neither the loss nor the gradient.
    logp[0, 3], behavior[0, 4], adv[0, 4] = float("nan"), float("inf"), float("nan")
    logp = logp.requires_grad_(True)
    out = get_objective(name, **WIDE.get(name, {}))(
        logp=logp,
        behavior_logp=behavior,
        advantages=adv,
        mask=mask,
        old_logp=behavior + 0.01,
        topk_logp=lp_all,
        topk_behavior_logp=mu_all,
    )
    assert out.loss_mat.shape == (b, t)
    assert torch.isfinite(out.loss_mat).all() and (out.loss_mat[0, 3:] == 0).all()
    out.loss_mat.sum().backward()
    assert torch.isfinite(logp.grad).all()
    assert (logp.grad[0, 3:] == 0).all(), "masked positions get zero gradient"
    assert (logp.grad[1] == 0).all(), "A = 0 gives zero gradient"
    assert (logp.grad[0, :3] != 0).any()
    for key in ("masked_frac_pos", "masked_frac_neg", "ratio_mean", "ratio_max", "approx_kl_k3"):
        v = out.metrics[f"objective/{key}"]
        assert v.dim() == 0 and not v.requires_grad and torch.isfinite(v)
    assert all(key.startswith("objective/") for key in out.metrics)


def test_metrics_values_by_hand():
    # r = [5, 0.808081], A = [+1, -1]; GRPO clips V1 (A > 0) only.
    mu, pi, adv = [0.01, 0.99], [0.05, 0.80], [1.0, -1.0]
    _, out = run("grpo", mu, pi, adv)
    m = {k.split("/")[1]: v.item() for k, v in out.metrics.items()}
    assert m["masked_frac_pos"] == pytest.approx(0.5) and m["masked_frac_neg"] == 0.0
    assert m["ratio_mean"] == pytest.approx((5 + 0.80 / 0.99) / 2)
    assert m["ratio_max"] == pytest.approx(5.0)
    k3 = [(r - 1) - math.log(r) for r in (5.0, 0.80 / 0.99)]
    assert m["approx_kl_k3"] == pytest.approx(sum(k3) / 2)
    _, out = run("drpo", *vectors())
    # w = 1 - sign(A)(pi - mu)/0.15 per vector: negative for V2, V5b, V6; > 1 for V3 only.
    assert out.metrics["objective/neg_weight_frac"].item() == pytest.approx(3 / 7)
    assert out.metrics["objective/weight_gt1_frac"].item() == pytest.approx(1 / 7)


def test_nan_in_response_position_raises_with_count():
    logp = torch.zeros(2, 3)
    logp[0, 1] = float("nan")
    logp[1, 2] = float("nan")
    adv = torch.ones(2, 3)
    adv[1, 0] = float("inf")
    with pytest.raises(ValueError, match=r"grpo: non-finite .* \(logp: 2, advantages: 1 tokens\)") as err:
        get_objective("grpo")(logp=logp, behavior_logp=torch.zeros(2, 3), advantages=adv, mask=torch.ones(2, 3))
    assert err.value.counts == {"logp": 2, "advantages": 1}  # what the training loop decides a skip by


def test_the_anchored_ratio_goes_through_the_one_log_ratio_clamp(monkeypatch):
    """Clip and CISPO test their anchored ratio through common.LOG_RATIO_CLAMP: moved to 5, a token with
    log(pi/mu) = 10 has ratio e^5, inside a 1 + 200 clip (a clamp of its own at 20 would give e^10, outside)."""
    from harness.objectives import common

    monkeypatch.setattr(common, "LOG_RATIO_CLAMP", 5.0)
    ones = torch.ones(1, 1)
    tensors = {"logp": torch.tensor([[-2.0]]), "behavior_logp": torch.tensor([[-12.0]]), "advantages": ones}
    clip = get_objective("grpo", eps_high=200.0, is_cap=1e6)(**tensors, mask=ones)
    assert clip.metrics["objective/masked_frac"].item() == 0.0
    assert clip.loss_mat.item() == pytest.approx(-math.exp(5.0))
    cispo = get_objective("cispo_minimax", eps_high=1e6, is_cap=1e6)(**tensors, mask=ones)
    assert cispo.loss_mat.item() == pytest.approx(-math.exp(5.0))


def test_shape_mismatch_names_the_tensors():
    with pytest.raises(ValueError, match=r"advantages has shape \(2,\) but logp has shape \(2, 3\)"):
        get_objective("dppo")(
            logp=torch.zeros(2, 3), behavior_logp=torch.zeros(2, 3), advantages=torch.ones(2), mask=torch.ones(2, 3)
        )
    with pytest.raises(ValueError, match="topk_behavior_logp"):
        get_objective("dppo_topk_tv")(
            logp=torch.zeros(2, 3),
            behavior_logp=torch.zeros(2, 3),
            advantages=torch.ones(2, 3),
            mask=torch.ones(2, 3),
            topk_logp=torch.zeros(2, 3, 4),
            topk_behavior_logp=torch.zeros(2, 3, 5),
        )


@pytest.mark.parametrize("name", ["drpo", "drpo_mask", "drpo_no_absadv"])
def test_drpo_family_gives_zero_gradient_beyond_the_log_ratio_clamp(name):
    """The released DRPO code differentiates through exp(clamp(log pi - log mu, -20, 20)) (papers.md, DRPO).

    Token 1: log mu = -25, log pi = -3, A = +1: log-ratio 22 > 20, so torch.clamp passes no gradient and c = 0
    (the detached-weight form would give A * min(e^20, C = 1e4) = 1e4 from the surrogate alone).
    Token 2: log mu = log 0.5, log pi = log 0.5 - 21.5, A = -1: log-ratio -21.5 < -20, c = 0 (not -e^-20).
    Token 3: V1 (mu 0.01, pi 0.05, A = +1), log-ratio log 5, inside: unchanged, c = A r w with r = 5 and
    drpo: w = 1 - (0.05 - 0.01)/0.15 = 0.733333 -> 3.666667; drpo_no_absadv: the same (A = 1);
    drpo_mask: pi - mu = 0.04 < 0.15, the mask does not fire -> plain A r = 5.
    """
    logp = torch.tensor([[-3.0, math.log(0.5) - 21.5, math.log(0.05)]], dtype=torch.float64).requires_grad_(True)
    behavior = torch.tensor([[-25.0, math.log(0.5), math.log(0.01)]], dtype=torch.float64)
    adv = torch.tensor([[1.0, -1.0, 1.0]], dtype=torch.float64)
    out = get_objective(name)(logp=logp, behavior_logp=behavior, advantages=adv, mask=torch.ones_like(adv))
    out.loss_mat.sum().backward()
    c = (-logp.grad[0]).tolist()
    assert c[0] == 0.0 and c[1] == 0.0
    assert c[2] == pytest.approx(5.0 if name == "drpo_mask" else 3.666667, abs=1e-6)
    assert torch.isfinite(out.loss_mat).all()
    # The other families keep their detached weight there: PG-IS gives A * min(r, C) = 1e4 and -e^-20.
    logp.grad = None
    get_objective("pg_is")(
        logp=logp, behavior_logp=behavior, advantages=adv, mask=torch.ones_like(adv)
    ).loss_mat.sum().backward()
    assert (-logp.grad[0, 0]).item() == pytest.approx(1e4) and (-logp.grad[0, 1]).item() == pytest.approx(
        -math.exp(-20)
    )


def test_drpo_gradient_at_the_clamp_bound_still_flows():
    # log-ratio exactly 20 (log pi = -5, log mu = -25): torch.clamp passes the gradient at its bound, as the released
    # code does. c = A min(r, C) - |A| (pi - mu) r / delta = 1e4 - (e^-5 - e^-25) e^20 / 0.15.
    logp = torch.tensor([[-5.0]], dtype=torch.float64).requires_grad_(True)
    out = get_objective("drpo")(
        logp=logp,
        behavior_logp=torch.tensor([[-25.0]], dtype=torch.float64),
        advantages=torch.ones(1, 1, dtype=torch.float64),
        mask=torch.ones(1, 1),
    )
    out.loss_mat.sum().backward()
    want = 1e4 - (math.exp(-5) - math.exp(-25)) * math.exp(20) / 0.15
    assert (-logp.grad).item() == pytest.approx(want, rel=1e-9)
