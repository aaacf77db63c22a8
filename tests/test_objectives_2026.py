"""GSPO, CPPO and IcePop (objectives.md §2.7-2.9) against hand-derived vectors, one test per pitfall.

c_t = -d(loss_mat.sum())/d logp_t is the gradient coefficient (ascent direction), as in tests/test_objectives.py.
Every expected value is derived by hand in the comments; none is computed by the code under test. GSPO and CPPO
read a whole response (a row), so their vectors are rows of tokens.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.objectives import get_objective
from harness.objectives.common import NonFiniteInputError, masked_mean

E10 = 22026.465794806718  # e^10


def run(name, mu, pi, adv, mask=None, old=None, dtype=torch.float64, **kw):
    """Rows of probabilities ([B][T] lists; adv per row or per token) through objective `name`: (c [B, T], output)."""
    logp = torch.tensor(pi, dtype=dtype).log().requires_grad_(True)
    a = torch.tensor(adv, dtype=dtype)
    a = a[:, None].expand_as(logp).clone() if a.dim() == 1 else a
    m = torch.ones_like(a) if mask is None else torch.tensor(mask, dtype=dtype)
    extra = {} if old is None else {"old_logp": torch.tensor(old, dtype=dtype).log()}
    out = get_objective(name, **kw)(
        logp=logp, behavior_logp=torch.tensor(mu, dtype=dtype).log(), advantages=a, mask=m, **extra
    )
    out.loss_mat.sum().backward()
    return -logp.grad, out


def metric(out, key: str) -> float:
    return out.metrics[f"objective/{key}"].item()


# --- GSPO -------------------------------------------------------------------------------------------------------

# Four responses of up to 3 tokens (the third column is padding in rows 0, 2 and 3).
GSPO_MU = [[0.2, 0.4, 0.5], [0.5, 0.5, 0.5], [0.4, 0.4, 0.5], [0.1, 0.05, 0.5]]
GSPO_PI = [[0.4, 0.2, 0.05], [0.55, 0.55, 0.55], [0.2, 0.2, 0.5], [0.2, 0.4, 0.05]]
GSPO_ADV = [1.0, 1.0, -1.0, -1.0]
GSPO_MASK = [[1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 1, 0]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gspo_every_token_takes_its_sequence_ratio(dtype):
    # Row 0, A = +1: log(pi/mu) = log 2, log 0.5 -> L = 0, s = 1: both tokens c = A s = 1 (token-level PPO would
    #   clip the first, r = 2, and give the second 0.5). The padding's pi/mu = 0.1 is not in the mean.
    # Row 1, A = +1: pi/mu = 1.1 on all three tokens -> s = 1.1 > 1 + 4e-4: clipped, c = 0.
    # Row 2, A = -1: pi/mu = 0.5 -> s = 0.5 < 1 - 3e-4: clipped, c = 0.
    # Row 3, A = -1: L = (log 2 + log 8)/2 = log 4 over its two tokens (not /3) -> s = 4: above the window with
    #   A < 0 is never clipped (no dual clip): c = A s = -4 on both.
    c, out = run("gspo", GSPO_MU, GSPO_PI, GSPO_ADV, GSPO_MASK, dtype=dtype)
    want = [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [-4.0, -4.0, 0.0]]
    assert c.tolist() == [pytest.approx(row, abs=1e-5) for row in want]
    # The loss value is the kept surrogate -A s (objectives.md §1): 4 on row 3's tokens, -1 on row 0's.
    assert out.loss_mat[3, :2].tolist() == pytest.approx([4.0, 4.0], abs=1e-5)
    assert out.loss_mat[0, :2].tolist() == pytest.approx([-1.0, -1.0], abs=1e-6)
    # Responses clipped: rows 1 and 2, of the four with A != 0.
    assert metric(out, "seq_clipped_frac") == pytest.approx(2 / 4)
    # s per response: 1, 1.1, 0.5, 4 -> mean 1.65, max 4.
    assert metric(out, "seq_ratio_mean") == pytest.approx(1.65, abs=1e-5)
    assert metric(out, "seq_ratio_max") == pytest.approx(4.0, abs=1e-5)
    # A wider window keeps rows 1 and 2: c = 1.1 (s <= 1.28), and c = -0.5 (s = 0.5 >= 1 - 0.6).
    c, _ = run("gspo", GSPO_MU, GSPO_PI, GSPO_ADV, GSPO_MASK, dtype=dtype, eps_low=0.6, eps_high=0.28)
    want = [[1.0, 1.0, 0.0], [1.1, 1.1, 1.1], [-0.5, -0.5, 0.0], [-4.0, -4.0, 0.0]]
    assert c.tolist() == [pytest.approx(row, abs=1e-5) for row in want]


def test_gspo_clamps_the_sequence_log_ratio_from_above_only():
    """verl: s = exp(min(L, 10)); no lower clamp. One-token responses, log-probs given exactly, no cap in the way.

    Row 0: log pi - log mu = -1 - (-13) = 12 > 10, A = -1: s = e^10 (value -A s = 22026.47), gradient exactly 0.
    Row 1: -13 - (-1) = -12, A = +1: no lower clamp, s = e^-12 = 6.144212e-6, below the window with A > 0 is kept:
           c = 6.144212e-6 (a clamp at -10 would give no gradient, and a value e^-10 = 4.54e-5).
    Row 2: -5 - (-15) = 10 exactly, A = -1: torch.clamp passes the gradient at its bound: c = -e^10.
    """
    logp = torch.tensor([[-1.0], [-13.0], [-5.0]], dtype=torch.float64).requires_grad_(True)
    behavior = torch.tensor([[-13.0], [-1.0], [-15.0]], dtype=torch.float64)
    adv = torch.tensor([[-1.0], [1.0], [-1.0]], dtype=torch.float64)
    out = get_objective("gspo", is_cap=1e6)(logp=logp, behavior_logp=behavior, advantages=adv, mask=torch.ones(3, 1))
    out.loss_mat.sum().backward()
    c = (-logp.grad[:, 0]).tolist()
    assert c[0] == 0.0
    assert c[1] == pytest.approx(math.exp(-12), rel=1e-12) and c[1] > 0
    assert c[2] == pytest.approx(-E10, rel=1e-12)
    assert out.loss_mat[:, 0].tolist() == pytest.approx([E10, -math.exp(-12), E10], rel=1e-12)
    # The default cap C = 1e4 truncates s (not in verl, which has none; objectives.md §2.7): row 2 gets c = -1e4.
    logp.grad = None
    get_objective("gspo")(
        logp=logp, behavior_logp=behavior, advantages=adv, mask=torch.ones(3, 1)
    ).loss_mat.sum().backward()
    assert (-logp.grad[2, 0]).item() == pytest.approx(-1e4)


def test_gspo_fully_masked_row_and_nan_padding_leave_the_other_rows_alone():
    # Row 0 = GSPO row 3 above: s = 4, c = -4 on both tokens.
    # Row 1: fully masked, NaN/inf in its log-probs, A = +1: verl gives it s = 1 (the mean's max(count, 1)); here it
    #   has no loss, no gradient and no NaN, and it is not a response for the sequence metrics.
    # Row 2: one token (pi/mu = 2, A = -1: s = 2, c = -2) and a masked NaN position; verl multiplies masked log-probs
    #   by 0, so a NaN there would make the whole row NaN; the harness zeroes padding before the mean.
    nan = float("nan")
    logp = torch.tensor([[0.2, 0.4], [nan, nan], [0.2, nan]], dtype=torch.float64).log().requires_grad_(True)
    behavior = torch.tensor([[0.1, 0.05], [0.5, 0.5], [0.1, 0.3]], dtype=torch.float64).log()
    behavior[1, 0] = float("inf")
    adv = torch.tensor([[-1.0, -1.0], [1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
    out = get_objective("gspo")(logp=logp, behavior_logp=behavior, advantages=adv, mask=mask)
    out.loss_mat.sum().backward()
    assert torch.isfinite(out.loss_mat).all() and torch.isfinite(logp.grad).all()
    assert (-logp.grad).tolist() == [pytest.approx([-4.0, -4.0]), [0.0, 0.0], pytest.approx([-2.0, 0.0])]
    assert (out.loss_mat[1] == 0).all()
    # s over the two responses: (4 + 2)/2 = 3, not (4 + 1 + 2)/3 with the empty row's s = 1.
    assert metric(out, "seq_ratio_mean") == pytest.approx(3.0)
    assert metric(out, "seq_ratio_max") == pytest.approx(4.0)


def test_gspo_anchor_old_takes_the_sequence_ratio_against_pi_old():
    # mu 0.1, pi_old 0.2, pi 0.4, A = -1 (one token): anchored on mu s = 4, c = -4; on pi_old s = 2, c = -2
    # (verl's decoupled mode: its old_log_prob is the recompute).
    c, _ = run("gspo", [[0.1]], [[0.4]], [-1.0])
    assert c.item() == pytest.approx(-4.0)
    c, _ = run("gspo", [[0.1]], [[0.4]], [-1.0], old=[[0.2]], anchor="old")
    assert c.item() == pytest.approx(-2.0)


def test_gspo_a_tie_at_the_bound_is_unclipped():
    # log 0.5 - log 0.25 = 0.6931471805599453 exactly, whose exp is 2.0 exactly: s = 1 + eps_high with eps_high 1,
    # A = +1: verl's max(-A s, -A clip(s)) is a tie, the gradient of both branches is A s, so c = 2 (kept). Its
    # mirror: s = 0.5 = 1 - eps_low with eps_low 0.5, A = -1: c = -0.5. One step past each bound: clipped, c = 0.
    assert torch.exp(torch.tensor(0.5, dtype=torch.float64).log() - torch.tensor(0.25, dtype=torch.float64).log()) == 2
    mu, pi = [[0.25], [0.25], [0.5], [0.5]], [[0.5], [0.5000001], [0.25], [0.2499999]]
    c, _ = run("gspo", mu, pi, [1.0, 1.0, -1.0, -1.0], eps_low=0.5, eps_high=1.0)
    assert c[:, 0].tolist() == [2.0, 0.0, -0.5, 0.0]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(min_value=1e-4, max_value=1.0),
            st.floats(min_value=1e-4, max_value=1.0),
            st.sampled_from([-1.0, -0.5, 0.0, 0.5, 1.0]),
        ),
        min_size=1,
        max_size=10,
    )
)
def test_gspo_on_one_token_responses_is_ppo_clip(rows):
    # A response of one token has s = pi/mu: GSPO is then PPO-clip on r with the same window (|log r| < 10 here).
    mu, pi, adv = (torch.tensor(col, dtype=torch.float64)[:, None] for col in zip(*rows, strict=True))
    grads = []
    for name in ("gspo", "ppo"):
        logp = pi.log().requires_grad_(True)
        obj = get_objective(name, eps_low=0.2, eps_high=0.28)
        obj(logp=logp, behavior_logp=mu.log(), advantages=adv, mask=torch.ones_like(adv)).loss_mat.sum().backward()
        grads.append(logp.grad)
    assert torch.equal(grads[0], grads[1])


# --- IcePop -----------------------------------------------------------------------------------------------------

# (mu, pi_old, pi, A): k = pi_old/mu, r = pi/pi_old. Defaults: clip 0.2 / 0.2 on r, keep 0.5 <= k <= 5.
ICEPOP = [
    (0.2, 0.4, 0.44, 1.0),  # k 2, r 1.1 <= 1.2: kept, c = A pi/mu = 2.2 (slime: w r = 2 * 1.1)
    (0.1, 0.6, 0.6, 1.0),  # k 6 > 5: masked, 0
    (0.5, 0.2, 0.2, 1.0),  # k 0.4 < 0.5: masked, 0
    (0.4, 0.5, 0.7, 1.0),  # k 1.25, r 1.4 > 1.2 with A > 0: clipped, 0
    (0.4, 0.5, 0.3, -1.0),  # k 1.25, r 0.6 < 0.8 with A < 0: clipped, 0
    (0.4, 0.5, 0.9, -1.0),  # k 1.25, r 1.8 with A < 0: no dual clip, c = -0.9/0.4 = -2.25
    (0.4, 0.5, 0.3, 1.0),  # k 1.25, r 0.6 with A > 0: kept, c = 0.3/0.4 = 0.75
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_icepop_vectors(dtype):
    mu, old, pi, adv = ([list(col)] for col in zip(*ICEPOP, strict=True))
    c, out = run("icepop", mu, pi, adv, old=old, dtype=dtype)
    assert c[0].tolist() == pytest.approx([2.2, 0.0, 0.0, 0.0, 0.0, -2.25, 0.75], abs=1e-5)
    assert (-out.loss_mat[0]).tolist() == pytest.approx(c[0].tolist(), abs=1e-6)  # the kept surrogate's value
    # k outside the bounds: tokens 2 and 3 of 7; mean k = (2 + 6 + 0.4 + 4 * 1.25)/7 = 13.4/7.
    assert metric(out, "mismatch_masked_frac") == pytest.approx(2 / 7)
    assert metric(out, "mismatch_weight_mean") == pytest.approx(13.4 / 7, rel=1e-6)
    # Dropped for any reason, over the 7 tokens with A != 0: A > 0 tokens 2, 3, 4; A < 0 token 5.
    assert metric(out, "masked_frac_pos") == pytest.approx(3 / 7)
    assert metric(out, "masked_frac_neg") == pytest.approx(1 / 7)


def test_icepop_bounds_are_inclusive():
    """slime keeps mask_low <= k <= mask_high. In float32 log 0.1 - log 0.02 and log 0.005 - log 0.01 exponentiate to
    exactly 5.0 and 0.5 (checked first): both tokens are kept, c = A pi/mu = 0.1/0.02 = 5 and 0.005/0.01 = 0.5
    (pi = pi_old, r = 1). A step outside (k = 5.005, 0.499) drops them."""

    def k(old: float, mu: float, dtype: torch.dtype) -> float:
        return torch.exp(torch.tensor(old, dtype=dtype).log() - torch.tensor(mu, dtype=dtype).log()).item()

    assert k(0.1, 0.02, torch.float32) == 5.0 and k(0.005, 0.01, torch.float32) == 0.5
    mu, old = [[0.02, 0.01, 0.02, 0.01]], [[0.1, 0.005, 0.1001, 0.00499]]
    c, _ = run("icepop", mu, old, [1.0], old=old, dtype=torch.float32)
    assert c[0].tolist() == pytest.approx([5.0, 0.5, 0.0, 0.0], rel=1e-6)
    # The same probabilities in float64 give k = 5.000000000000001 and 0.49999999999999994, just outside: the
    # tokens are dropped. The harness keeps the inputs' precision, as slime does (objectives.md §2.8).
    assert k(0.1, 0.02, torch.float64) > 5.0 and k(0.005, 0.01, torch.float64) < 0.5
    c, _ = run("icepop", [mu[0][:2]], [old[0][:2]], [1.0], old=[old[0][:2]])
    assert c[0].tolist() == [0.0, 0.0]


def test_icepop_needs_pi_old():
    with pytest.raises(ValueError, match="old_logp"):
        run("icepop", [[0.5]], [[0.5]], [1.0])


# --- CPPO -------------------------------------------------------------------------------------------------------
# Defaults delta 0.2, w_min 0.8, delta_b 0.02. For a response of T tokens: w_t = 1 - 0.2 (t - 1)/(T - 1),
# Z_t = w_t |pi - mu|, c_t = min(0.2, 0.2 + b W_{t-1} - S_{t-1}) with b = clamp(P90(D), 0.02, 0.04).

# Row 0, A = +1, T = 4 (w = 1, 0.933333, 0.866667, 0.8); D = 0.18, 0.1, 0.05, 0;
#   P90 of [0, 0.05, 0.1, 0.18]: rank 0.9 * 3 = 2.7 -> 0.1 + 0.7 * 0.08 = 0.156 -> b = 0.04.
#   t1: Z 0.18 <= c 0.2: kept, c = 0.38/0.2 = 1.9.
#   t2: Z 0.093333 > c = 0.2 + 0.04 * 1 - 0.18 = 0.06: masked (DPPO-TV at 0.2 keeps it, D = 0.1).
#   t3: Z 0.043333 > c = 0.2 + 0.04 * 1.933333 - (0.18 + 0.093333) = 0.004: masked.
#   t4: pi = mu, r = 1: c_4 = 0.2 + 0.04 * 2.8 - 0.316667 = -0.004667 < Z = 0, but A (r - 1) = 0 <= 0: kept, c = 1.
# Row 1, A = -1, T = 3 (w = 1, 0.9, 0.8); D = 0.3, 0.001, 0.2; P90 of [0.001, 0.2, 0.3]: 0.2 + 0.8 * 0.1 = 0.28 -> 0.04.
#   t1: pi < mu with A < 0 (away), Z 0.3 > 0.2: masked.
#   t2: away, Z 0.0009 > c = 0.2 + 0.04 - 0.3 = -0.06: masked (a negative c masks every away token with D > 0).
#   t3: pi > mu with A < 0 (toward mu): kept, c = A r = -2 (its c_3 = 0.2 + 0.04 * 1.9 - 0.3009 = -0.0249).
# Row 2, A = 0, T = 1: pi 0.3 < mu 0.6 by 0.3 > delta: kept (A (r - 1) = 0); c = 0.
CPPO_MU = [[0.2, 0.3, 0.5, 0.4], [0.6, 0.5, 0.2, 0.5], [0.6, 0.5, 0.5, 0.5]]
CPPO_PI = [[0.38, 0.4, 0.55, 0.4], [0.3, 0.499, 0.4, 0.5], [0.3, 0.5, 0.5, 0.5]]
CPPO_ADV = [1.0, -1.0, 0.0]
CPPO_MASK = [[1, 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cppo_vectors(dtype):
    c, out = run("cppo", CPPO_MU, CPPO_PI, CPPO_ADV, CPPO_MASK, dtype=dtype)
    want = [[1.9, 0.0, 0.0, 1.0], [0.0, 0.0, -2.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    assert c.tolist() == [pytest.approx(row, abs=1e-5) for row in want]
    # Masked over all 8 response tokens (UniRL's masked_fraction, A = 0 included): row 0 t2, t3; row 1 t1, t2.
    assert metric(out, "budget_masked_frac") == pytest.approx(4 / 8)
    # c_t < 0: row 0 t4 (-0.004667), row 1 t2 (-0.06) and t3 (-0.0249); row 2's c_1 = 0.2.
    assert metric(out, "negative_threshold_frac") == pytest.approx(3 / 8)
    # Over the 7 tokens with A != 0 (the shared metrics' denominator): 2 with A > 0, 2 with A < 0.
    assert metric(out, "masked_frac_pos") == pytest.approx(2 / 7)
    assert metric(out, "masked_frac_neg") == pytest.approx(2 / 7)
    # D: (0.18 + 0.1 + 0.05 + 0 + 0.3 + 0.001 + 0.2 + 0.3)/8 = 0.141375.
    assert metric(out, "divergence_mean") == pytest.approx(0.141375, abs=1e-6)


def test_cppo_prefix_budget_is_the_clamped_linear_p90_of_each_response():
    # Budget per unit weight b = clamp(P90(D), 0.02, 0.04), P90 by linear interpolation at rank 0.9 (T - 1):
    # Row 0: D = 0.01, 0.02, 0.03 (pi - mu), rank 1.8: 0.02 + 0.8 * 0.01 = 0.028, inside the clamp.
    # Row 1: D = 0, 0.005, rank 0.9: 0.0045 -> 0.02.   Row 2: D = 0.3 (T = 1): 0.3 -> 0.04.
    # Row 3: padding only, not a response. Mean over the three responses: (0.028 + 0.02 + 0.04)/3 = 0.0293333.
    # (The nearest rank would give row 0 0.03.) No token is masked: every c_t stays 0.2 here but row 2's, Z 0.3 > 0.2.
    mu = [[0.5, 0.5, 0.5], [0.5, 0.5, 0.5], [0.2, 0.5, 0.5], [0.5, 0.5, 0.5]]
    pi = [[0.51, 0.52, 0.53], [0.5, 0.505, 0.5], [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]
    _, out = run("cppo", mu, pi, [1.0, 1.0, 1.0, 1.0], [[1, 1, 1], [1, 1, 0], [1, 0, 0], [0, 0, 0]])
    assert metric(out, "prefix_budget_mean") == pytest.approx(0.088 / 3, abs=1e-9)
    assert metric(out, "budget_masked_frac") == pytest.approx(1 / 6)


def test_cppo_zero_advantage_and_unmoved_tokens_are_always_kept():
    """keep = [A (r - 1) <= 0] or [Z <= c]: an A = 0 token and an r = 1 token pass the first clause whatever the
    budget (DPPO instead routes A = 0 through its negative rule).

    Row 0, A = +1, T = 2 (w = 1, 0.8), D = 0.3, 0: P90 of [0, 0.3] = 0.9 * 0.3 = 0.27 -> b = 0.04.
      t1: pi 0.9 > mu 0.6 by 0.3 > 0.2: masked.  t2: pi = mu = 0.4 under c_2 = 0.2 + 0.04 - 0.3 = -0.06 < 0 = Z:
      kept by r = 1, c = A r = 1.
    Row 1, A = 0: pi 0.3 < mu 0.6 by 0.3 > delta: kept (DPPO's rule for A <= 0 would mask it). c = 0 either way, so
      the budget's masked share shows it: 1 of the 3 response tokens (row 0 t1), not 2.
    """
    c, out = run("cppo", [[0.6, 0.4], [0.6, 0.5]], [[0.9, 0.4], [0.3, 0.5]], [1.0, 0.0], [[1, 1], [1, 0]])
    assert c.tolist() == [[0.0, 1.0], [0.0, 0.0]]
    assert metric(out, "budget_masked_frac") == pytest.approx(1 / 3)
    assert metric(out, "negative_threshold_frac") == pytest.approx(1 / 3)


def test_cppo_masked_tokens_spend_the_budget():
    """Every earlier token spends the budget, the ones the mask already dropped too.

    A = +1, T = 3 (w = 1, 0.9, 0.8); D = 0.25, 0.06, 0; P90 of [0, 0.06, 0.25] = 0.06 + 0.8 * 0.19 = 0.212 -> 0.04.
    t1: Z 0.25 > 0.2: masked.  t2: Z = 0.9 * 0.06 = 0.054 > c_2 = 0.2 + 0.04 - 0.25 = -0.01: masked (had the masked t1
    not spent, c_2 = min(0.2, 0.24) = 0.2 and t2 would be kept with c = 0.36/0.3 = 1.2, as DPPO-TV keeps it).
    t3: pi = mu: kept, c = 1.
    """
    c, _ = run("cppo", [[0.2, 0.3, 0.5]], [[0.45, 0.36, 0.5]], [1.0])
    assert c[0].tolist() == pytest.approx([0.0, 0.0, 1.0])
    c_dppo, _ = run("dppo", [[0.2, 0.3, 0.5]], [[0.45, 0.36, 0.5]], [1.0], delta=0.2)
    assert c_dppo[0].tolist() == pytest.approx([0.0, 1.2, 1.0])


def test_cppo_loss_masked_tokens_spend_the_budget_and_padding_does_not():
    """A mask-0 token inside a response (tool output) is loss-masked: it has a position, and its |pi - mu| spends
    the budget, as in UniRL's packed rows; the positions after the last unmasked token are padding (NaN here).

    A = +1; response t1, t2 (loss-masked), t3, so T = 3 (w = 1, 0.9, 0.8); D = 0.18, 0.15, 0.06;
    P90 of [0.06, 0.15, 0.18] = 0.15 + 0.8 * 0.03 = 0.174 -> b = 0.04.
    t1: Z 0.18 <= 0.2: kept, c = 0.38/0.2 = 1.9.  t2: no loss (Z = 0.135 spent).
    t3: Z = 0.8 * 0.06 = 0.048 > c_3 = 0.2 + 0.04 * 1.9 - (0.18 + 0.135) = -0.039: masked, c = 0.
    Without the tool token (T = 2, w = 1, 0.8): c_3 = 0.2 + 0.04 - 0.18 = 0.06 >= 0.048, kept with c = 1.2; with its
    position but not its divergence: c_3 = 0.2 + 0.076 - 0.18 = 0.096, kept too.
    """
    nan = float("nan")
    mu = [[0.2, 0.1, 0.3, nan, nan]]
    pi = [[0.38, 0.25, 0.36, nan, nan]]
    mask = [[1, 0, 1, 0, 0]]
    c, out = run("cppo", mu, pi, [1.0], mask)
    assert torch.isfinite(c).all() and torch.isfinite(out.loss_mat).all()
    assert c[0].tolist() == pytest.approx([1.9, 0.0, 0.0, 0.0, 0.0])
    assert out.loss_mat[0, 1].item() == 0.0
    # A loss-masked token's log-probs are read, so they must be finite: one line naming the input and the count.
    with pytest.raises(NonFiniteInputError, match=r"cppo: non-finite .* \(logp: 1 tokens\)"):
        run("cppo", mu, [[0.38, nan, 0.36, nan, nan]], [1.0], mask)


def test_cppo_negative_threshold_masks_every_away_token():
    """Once the prefix overspends, c_t < 0 and every token moving away from mu with D > 0 is masked, however small
    its move; tokens moving toward mu are still kept. CPPO row 1 above: A = -1, D = 0.3, 0.001, 0.2.
    t1: masked (Z 0.3 > 0.2). t2: pi 0.499 < mu 0.5, D = 0.001, c_2 = -0.06: masked (DPPO-TV keeps it, c = -0.998).
    t3: pi 0.4 > mu 0.2 with A < 0 (toward): kept, c = -2, under c_3 = -0.0249."""
    c, out = run("cppo", [[0.6, 0.5, 0.2]], [[0.3, 0.499, 0.4]], [-1.0])
    assert c[0].tolist() == pytest.approx([0.0, 0.0, -2.0])
    assert metric(out, "negative_threshold_frac") == pytest.approx(2 / 3)
    c_dppo, _ = run("dppo", [[0.6, 0.5, 0.2]], [[0.3, 0.499, 0.4]], [-1.0], delta=0.2)
    assert c_dppo[0].tolist() == pytest.approx([0.0, -0.998, -2.0])


def test_cppo_keeps_a_token_exactly_at_its_threshold():
    # First token of a response: c_1 = delta. delta 0.25, mu 0.25, pi 0.5 (exact in binary, their logs round-trip
    # through exp): Z = D = 0.25 = c_1, kept (Z <= c), c = 0.5/0.25 = 2. pi = 0.5 + 1e-6: Z > c_1, masked.
    assert torch.tensor(0.5, dtype=torch.float64).log().exp() == 0.5
    assert torch.tensor(0.25, dtype=torch.float64).log().exp() == 0.25
    c, _ = run("cppo", [[0.25], [0.25]], [[0.5], [0.5 + 1e-6]], [1.0, 1.0], delta=0.25)
    assert c[:, 0].tolist() == [2.0, 0.0]


def test_cppo_gives_no_gradient_beyond_the_log_ratio_clamp():
    """UniRL differentiates through r = exp(clamp(log pi - log mu, -20, 20)).
    Row 0: log pi = -3, log mu = -25 (log r = 22), A = -1: moving toward mu, kept, but past the clamp: c = 0 (the
    value stays -A min(e^20, C) = 1e4). Row 1: log r = 20 exactly (-5, -25): torch.clamp passes the gradient at its
    bound: c = A min(e^20, C) = -1e4 (UniRL, with no cap: -e^20)."""
    logp = torch.tensor([[-3.0], [-5.0]], dtype=torch.float64).requires_grad_(True)
    behavior = torch.tensor([[-25.0], [-25.0]], dtype=torch.float64)
    adv = -torch.ones(2, 1, dtype=torch.float64)
    out = get_objective("cppo")(logp=logp, behavior_logp=behavior, advantages=adv, mask=torch.ones(2, 1))
    out.loss_mat.sum().backward()
    assert (-logp.grad[:, 0]).tolist() == [0.0, pytest.approx(-1e4)]
    assert out.loss_mat[:, 0].tolist() == pytest.approx([1e4, 1e4])


prob = st.floats(min_value=1e-6, max_value=1 - 1e-6)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(prob, prob, st.sampled_from([-1.0, -0.3, 0.0, 0.7, 1.0])), min_size=1, max_size=12),
    st.sampled_from([0.05, 0.15, 0.2]),
)
def test_cppo_with_flat_weights_and_a_large_budget_is_dppo_tv(rows, delta):
    # w_min = 1 makes every w_t = 1; delta_b = 10 makes b >= 10, so delta + b W_{t-1} - S_{t-1} >= delta + 9 (t - 1)
    # (S_{t-1} <= t - 1): c_t = delta for every t, and keep = toward or D <= delta, DPPO Binary-TV's rule for A != 0.
    mu, pi, adv = (torch.tensor(col, dtype=torch.float64)[None] for col in zip(*rows, strict=True))
    grads = []
    for name, kw in (("cppo", {"w_min": 1.0, "delta_b": 10.0}), ("dppo", {})):
        logp = pi.log().requires_grad_(True)
        obj = get_objective(name, delta=delta, **kw)
        obj(logp=logp, behavior_logp=mu.log(), advantages=adv, mask=torch.ones_like(adv)).loss_mat.sum().backward()
        grads.append(logp.grad)
    assert torch.equal(grads[0], grads[1])


def test_the_one_masked_mean_ignores_what_padding_holds() -> None:
    """The loop's entropy metric and the objectives share harness.objectives.common.masked_mean: a pad holding NaN
    or inf (whatever a forward leaves past a response's end) does not reach the mean; the loop's old copy multiplied
    by the mask, and 0 * NaN is NaN."""
    from pathlib import Path

    x = torch.tensor([[1.0, 3.0, float("nan")], [2.0, float("inf"), 0.0]])
    m = torch.tensor([[True, True, False], [True, False, False]])
    assert float(masked_mean(x, m)) == pytest.approx(2.0)
    harness = Path(__file__).resolve().parents[1] / "harness"
    defined = [p for p in harness.rglob("*.py") if "def masked_mean(" in p.read_text(encoding="utf-8")]
    assert [p.relative_to(harness).as_posix() for p in defined] == ["objectives/common.py"]
