"""The rollout-correction axis (harness/objectives/correction.py, its use in harness/loop/step.py): hand-derived
vectors for each mode and each pitfall of verl 0.9.1's rollout_corr_helper.py (docs/objectives.md §2.10).

lambda = log pi_x - log mu. The pure-function tests pass lambda itself as pi_x's log-prob with mu's at 0. Values
are fp64 so the expected numbers are exact to the last digit the comments give.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from harness.batch import TrainBatch
from harness.distributed import SingleProcess
from harness.logprobs import LogProbOutput
from harness.loop.step import (
    MiniBatch,
    corrected,
    decoupled_correction,
    minibatch_denominator,
    minibatch_loss,
    objective_or_skip,
)
from harness.objectives import get_objective
from harness.objectives.correction import CorrectionConfig, parse_is_threshold, parse_rs, rollout_correction
from tests.conftest import compose

LN = math.log
F64 = torch.float64


def lam_of(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=F64)


def correct(cfg: CorrectionConfig, lam: torch.Tensor, mask: torch.Tensor | None = None):
    mask = torch.ones_like(lam) if mask is None else mask
    return rollout_correction(cfg, lam, torch.zeros_like(lam), mask)


# --- IS weights ---------------------------------------------------------------------------------------------------


def test_token_tis_caps_above_and_never_below():
    # pi_old/mu = 3, 0.25, 1 with C = 2: w = min(raw, 2) = 2, 0.25, 1 (no lower truncation at 1/C = 0.5); one of
    # three capped.
    out = correct(CorrectionConfig(rollout_is="token", rollout_is_threshold=2.0), lam_of([[LN(3), LN(0.25), 0.0]]))
    torch.testing.assert_close(out.weight, lam_of([[2.0, 0.25, 1.0]]))
    assert out.keep.all()  # a weight never rejects
    m = out.metrics
    assert m["correction/is_weight_mean"] == pytest.approx(3.25 / 3)
    assert (float(m["correction/is_weight_max"]), float(m["correction/is_weight_min"])) == (2.0, 0.25)
    assert m["correction/is_capped_frac"] == pytest.approx(1 / 3) and m["correction/is_capped_seq_frac"] == 1.0


def test_token_weight_clamps_the_log_ratio_at_20():
    # lambda = +-25 -> exp(+-20) (verl's SAFETY_BOUND), with no cap (threshold inf).
    out = correct(CorrectionConfig(rollout_is="token", rollout_is_threshold=math.inf), lam_of([[25.0, -25.0]]))
    torch.testing.assert_close(out.weight, lam_of([[math.exp(20), math.exp(-20)]]))


def test_sequence_weight_sums_unclamped_token_log_ratios():
    # lambda = [30, -15]: the sum 15 is clamped once -> w = e^15 on both tokens. Clamping each token first would
    # give 20 - 15 = 5 -> e^5.
    out = correct(CorrectionConfig(rollout_is="sequence", rollout_is_threshold=1e12), lam_of([[30.0, -15.0]]))
    torch.testing.assert_close(out.weight, lam_of([[math.exp(15), math.exp(15)]]))


def test_sequence_weight_clamps_the_sum_at_20():
    # lambda = [15, 10]: sum 25 -> clamp 20 -> e^20 (not e^25).
    out = correct(CorrectionConfig(rollout_is="sequence", rollout_is_threshold=1e12), lam_of([[15.0, 10.0]]))
    torch.testing.assert_close(out.weight, lam_of([[math.exp(20), math.exp(20)]]))


def test_sequence_weight_is_over_response_tokens_only_and_padding_never_poisons_it():
    # Row 0: token lambda 0.5, padding NaN -> w = e^0.5 on the token, 0 on the padding (verl multiplies by the
    # mask, so its NaN * 0 would be NaN; here padding is replaced before the sum).
    lam = lam_of([[0.5, math.nan]])
    out = correct(CorrectionConfig(rollout_is="sequence"), lam, torch.tensor([[1.0, 0.0]]))
    torch.testing.assert_close(out.weight, lam_of([[math.exp(0.5), 0.0]]))


@pytest.mark.parametrize(
    "spec,lam,weight",
    [
        ("1_2", 0.0, 1.0),  # raw = 1 = lower: kept (inclusive)
        ("0.5_1", 0.0, 1.0),  # raw = 1 = upper: kept (inclusive)
        ("0.75_2", LN(0.5), 0.0),  # raw 0.5 < 0.75: zeroed
        ("0.5_2", LN(3), 0.0),  # raw 3 > 2: zeroed, not capped at 2
        ("0.5_5.0", LN(3), 3.0),  # inside: the raw weight itself
    ],
)
def test_icepop_keeps_the_raw_weight_inside_inclusive_bounds_and_zeroes_it_outside(spec, lam, weight):
    out = correct(CorrectionConfig(rollout_is="token", rollout_is_threshold=spec), lam_of([[lam]]))
    torch.testing.assert_close(out.weight, lam_of([[weight]]))
    assert out.keep.all()  # zeroed, not rejected: the token stays in the loss mask
    assert float(out.metrics["correction/is_zeroed_frac"]) == (1.0 if weight == 0 else 0.0)


def test_batch_normalisation_divides_by_the_mean_weight_token_and_sequence():
    # token: w = [2, 0.5, 1], mean 7/6 -> [12/7, 3/7, 6/7]; the statistics stay those before normalising.
    cfg = CorrectionConfig(rollout_is="token", rollout_is_batch_normalize=True)
    out = correct(cfg, lam_of([[LN(3), LN(0.5), 0.0]]))
    torch.testing.assert_close(out.weight, lam_of([[12 / 7, 3 / 7, 6 / 7]]))
    assert out.metrics["correction/is_norm_factor"] == pytest.approx(7 / 6)
    assert out.metrics["correction/is_weight_mean"] == pytest.approx(7 / 6)
    # sequence: rows w = 1.5 (two tokens) and 0.9 (one token + padding): the mean over responses is 1.2, not the
    # token mean (1.5 + 1.5 + 0.9) / 3 = 1.3.
    cfg = CorrectionConfig(rollout_is="sequence", rollout_is_batch_normalize=True)
    out = correct(cfg, lam_of([[LN(1.5) / 2, LN(1.5) / 2], [LN(0.9), 0.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]]))
    torch.testing.assert_close(out.weight, lam_of([[1.25, 1.25], [0.75, 0.0]]))


# --- rejection sampling --------------------------------------------------------------------------------------------


def test_k1_bounds_apply_to_mu_over_pi_as_verl_not_to_pi_over_mu_as_skyrl():
    # "0.5_4" keeps log 0.5 <= -lambda <= log 4, i.e. pi/mu in [1/4, 2]: pi/mu = 3 is rejected, 0.3 kept. SkyRL's
    # direction (pi/mu in [0.5, 4]) would keep 3 and reject 0.3.
    out = correct(CorrectionConfig(rollout_rs="token_k1", rollout_rs_threshold="0.5_4"), lam_of([[LN(3), LN(0.3)]]))
    assert out.keep.tolist() == [[False, True]]


def test_k1_single_bound_u_means_lower_1_over_u():
    # 2.0 -> pi/mu in [0.5, 2]: 2.5 out, 1.9 in, 0.45 out, 0.55 in.
    cfg = CorrectionConfig(rollout_rs="token_k1", rollout_rs_threshold=2.0)
    assert correct(cfg, lam_of([[LN(2.5), LN(1.9), LN(0.45), LN(0.55)]])).keep.tolist() == [[False, True, False, True]]


def test_seq_sum_k1_clamps_each_token_before_summing():
    # Rejection (unlike the sequence IS weight) sums clamped tokens: lambda [30, -15] -> [20, -15], k1 sum = -5,
    # inside [-10, 10] (bounds e^-10_e^10): kept. Unclamped, -15 would be rejected.
    cfg = CorrectionConfig(rollout_rs="seq_sum_k1", rollout_rs_threshold=f"{math.exp(-10)!r}_{math.exp(10)!r}")
    assert correct(cfg, lam_of([[30.0, -15.0]])).keep.all()


def test_seq_mean_k1_geometric_divides_by_the_response_tokens_not_the_row_width():
    # "0.9_1": keep -lambda mean in [log 0.9, 0] = [-0.10536, 0]. Row 0: [0.12, 0.12, padding] -> mean 0.12 ->
    # -0.12: rejected (over the row width 3 it would be -0.08, kept). Row 1: [0.1, 0.1, 0.1] -> -0.1: kept.
    cfg = CorrectionConfig(rollout_rs="seq_mean_k1", rollout_rs_threshold="0.9_1")
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    out = correct(cfg, lam_of([[0.12, 0.12, 7.0], [0.1, 0.1, 0.1]]), mask)
    assert out.keep.tolist() == [[False, False, False], [True, True, True]]


@pytest.mark.parametrize(
    "option,spec,lam,kept",
    [
        ("token_k3", 0.3, [LN(2)], False),  # k3 = 2 - 1 - ln 2 = 0.30685 > 0.3
        ("token_k3", 0.31, [LN(2)], True),
        ("seq_max_k2", 0.1, [0.1, -0.5], False),  # max(0.005, 0.125) = 0.125 > 0.1: the whole row
        ("seq_max_k2", 0.13, [0.1, -0.5], True),
        ("seq_mean_k3", 0.01, [0.1, -0.1], True),  # (0.0051709 + 0.0048374) / 2 = 0.0050042 <= 0.01
        ("seq_sum_k2", 0.25, [0.5, -0.5], True),  # 0.125 + 0.125 = 0.25 <= 0.25 (the bound itself is kept)
        ("seq_sum_k2", 0.2499, [0.5, -0.5], False),
    ],
)
def test_k2_k3_keep_a_statistic_at_or_below_the_upper_bound(option, spec, lam, kept):
    out = correct(CorrectionConfig(rollout_rs=option, rollout_rs_threshold=spec), lam_of([lam]))
    assert bool(out.keep.all()) is kept and bool(out.keep.any()) is kept


def test_options_are_anded_and_rejection_is_counted_per_token_sequence_and_row():
    # "token_k1,seq_max_k2" with "0.5_2,1.0". Row 0: lambda [ln 3, 0]: token 0 out (3 > 2); seq max k2 = ln(3)^2/2
    # = 0.6035 <= 1 -> [F, T]. Row 1: [1.5, 0.2]: token 0 out (e^1.5 > 2), seq max k2 = 1.125 > 1 -> [F, F].
    cfg = CorrectionConfig(rollout_rs="token_k1,seq_max_k2", rollout_rs_threshold="0.5_2,1.0")
    out = correct(cfg, lam_of([[LN(3), 0.0], [1.5, 0.2]]))
    assert out.keep.tolist() == [[False, True], [False, False]]
    m = out.metrics
    assert m["correction/rejected_frac"] == pytest.approx(0.75)
    assert m["correction/rejected_seq_frac"] == 1.0  # both rows lost a token
    assert m["correction/rejected_row_frac"] == 0.5  # one lost all of them


# --- thresholds verl would not parse ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec,expected",
    [(2.0, (None, 2.0)), ("2.0", (None, 2.0)), ("0.5_5.0", (0.5, 5.0)), (" 1_1 ", (1.0, 1.0)), (3, (None, 3.0))],
)
def test_is_thresholds_verl_parses(spec, expected):
    assert parse_is_threshold(spec) == expected


@pytest.mark.parametrize(
    "spec,message",
    [
        ("abc", "is not a number"),
        ("5.0_0.5", "lower bound must be <= upper"),
        ("0_1", "must be > 0"),
        (-1.0, "must be > 0"),
        ("", "must not be empty"),
        ("0.5_x", "is not a number"),
        (True, "expected a number"),
        ("nan", "nan"),
    ],
)
def test_is_thresholds_verl_refuses_fail_in_one_line(spec, message):
    with pytest.raises(ValueError, match=message) as err:
        CorrectionConfig(rollout_is="token", rollout_is_threshold=spec)
    assert str(err.value).startswith("correction.rollout_is_threshold: ") and "\n" not in str(err.value)


def test_rs_thresholds_verl_parses():
    assert parse_rs("token_k1", "4") == (("token_k1", 0.25, 4.0),)
    assert parse_rs("token_k1, seq_mean_k3,token_k1", "0.5_2,0.01") == (
        ("token_k1", 0.5, 2.0),
        ("seq_mean_k3", None, 0.01),
    )  # duplicates dropped, one threshold per remaining option
    assert parse_rs("seq_max_k2,seq_sum_k3", 0.1) == (("seq_max_k2", None, 0.1), ("seq_sum_k3", None, 0.1))


@pytest.mark.parametrize(
    "rs,spec,message",
    [
        ("token_k4", "2", "correction.rollout_rs: 'token_k4' is not one of"),
        (" , ", "2", "correction.rollout_rs: no option"),
        ("token_k1", None, "correction.rollout_rs_threshold: rejection sampling"),
        ("token_k1", "2_0.5", "correction.rollout_rs_threshold: bounds for token_k1 must be lower <= upper"),
        ("token_k1", "0.5", "must be lower <= upper"),  # a single U < 1 makes lower = 1/U > U (verl refuses it)
        ("token_k1", "0_2", "must be > 0"),
        ("token_k3", "0.1_0.2", "token_k3 takes one upper bound without '_'"),
        ("seq_sum_k2", -1.0, "must be > 0"),
        ("token_k1,token_k2,token_k3", "2,0.1", "2 thresholds for 3 options"),
    ],
)
def test_rs_settings_verl_refuses_fail_in_one_line(rs, spec, message):
    with pytest.raises(ValueError, match=message) as err:
        CorrectionConfig(rollout_rs=rs, rollout_rs_threshold=spec)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["correction=decoupled_token_is"], r"^correction: decoupled_token_is needs an objective anchored on pi_old"),
        (["objective=cppo", "correction=decoupled_geo_rs"], r"^correction: .* cppo has anchor=behavior"),
        (["objective=icepop", "correction=bypass_ppo_clip_geo_rs"], r"^correction.bypass_mode: icepop masks on k"),
        (["objective=minirl", "correction=bypass_pg_is"], r"^correction.loss_type: reinforce .* minirl is family clip"),
        (["objective=minirl", "correction.rollout_rs_threshold=0.1"], r"^correction.rollout_rs_threshold: set to 0.1"),
        (["objective=minirl", "correction.rollout_is=tokens"], r"^correction.rollout_is: expected 'token'"),
        (["objective=minirl", "correction.loss_type=reinforce"], r"^correction.loss_type: reinforce is a bypass"),
        (["objective=minirl", "correction.rollout_is_batch_normalize=true"], r"^correction.rollout_is_batch_norm"),
        (["objective=minirl", "correction=decoupled_token_is", "correction.rollout_is_threshold='2_1'"], r"<= upper"),
    ],
)
def test_combinations_that_mean_nothing_are_refused_before_any_model(overrides, message):
    from harness.config import validate

    with pytest.raises(ValueError, match=message) as err:
        validate(compose(*overrides))
    assert "\n" not in str(err.value)


def test_every_preset_composes_with_an_objective_anchored_on_pi_old():
    from harness.config import validate
    from harness.config.compose import CONF_DIR

    for path in sorted((CONF_DIR / "correction").glob("*.yaml")):
        cfg = validate(compose(f"correction={path.stem}", "objective=pg_is", "objective.anchor=old")).correction
        assert cfg.name == path.stem
        if cfg.loss_type != "reinforce":
            assert validate(compose(f"correction={path.stem}", "objective=minirl")).correction.name == path.stem


def test_an_unquoted_lower_upper_on_the_command_line_is_refused(capsys):
    # Hydra (and YAML) read 0.5_2 as the number 0.52: one line asks for quotes.
    from harness.cli.checks import check_threshold_strings

    with pytest.raises(SystemExit):
        check_threshold_strings(["correction.rollout_rs_threshold=0.5_2"])
    assert "correction.rollout_rs_threshold='0.5_2'" in capsys.readouterr().err
    check_threshold_strings(["correction.rollout_rs_threshold='0.5_2'", "correction.rollout_is_threshold=0.5_5.0"])


# --- in the loop: the weight, the ratio, the denominators -----------------------------------------------------------


def train_batch(mu: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> TrainBatch:
    b, t = mu.shape
    ids = torch.ones((b, t), dtype=torch.long)
    return TrainBatch(
        input_ids=torch.ones((b, t + 1), dtype=torch.long),
        attention_mask=torch.ones((b, t + 1), dtype=torch.long),
        position_ids=torch.arange(t + 1).expand(b, t + 1),
        prompt_len=1,
        response_ids=ids,
        mask=mask,
        behavior_logp=mu,
        topk_ids=ids[..., None],
        topk_behavior_logp=mu[..., None],
        advantages=adv * mask,
    )


def fake_run(cfg: CorrectionConfig, agg: str) -> SimpleNamespace:
    return SimpleNamespace(
        cfg=SimpleNamespace(correction=cfg, objective=SimpleNamespace(agg=agg)), ranks=SingleProcess()
    )


def loss_and_coef(objective, cfg, agg, logp, mu, old, adv, mask):
    """The mini-batch loss the trainer backpropagates for one mini-batch of every row, and c = -dL_tok/dlog pi."""
    run = fake_run(cfg, agg)
    batch = train_batch(mu, adv, mask)
    batch, corr = decoupled_correction(run, batch, old)
    rows = torch.arange(len(batch))
    full = minibatch_denominator(batch, corr, rows, agg)
    logp = logp.clone().requires_grad_(True)
    lp = LogProbOutput(logp=logp, entropy=None, topk_logp=None)
    mb = MiniBatch(batch, old, full, True, True, corr)
    cmb = corrected(run, mb, lp)
    out = objective_or_skip(objective, lp, cmb.batch, old, cmb.mask, cmb.is_logp)
    loss_mat = out.loss_mat if cmb.weight is None else out.loss_mat * cmb.weight
    (coef,) = torch.autograd.grad(-loss_mat.sum(), logp, retain_graph=True)
    loss = minibatch_loss(loss_mat, cmb.mask, agg, horizon=4, full_denominator=cmb.full_denominator)
    return float(loss.detach()), coef, cmb


MINIRL = get_objective("minirl")
PG_OLD = get_objective("pg_is", anchor="old")


def test_decoupled_weight_stands_in_for_pi_old_over_mu():
    # mu 0.2, pi_old 0.6, pi 0.66, A = 1; MiniRL (clip on pi/pi_old = 1.1, inside 1.28). Without a correction
    # c = A pi/mu = 3.3; with token TIS C = 2: c = A (pi/pi_old) min(pi_old/mu, 2) = 1.1 * 2 = 2.2 (w on top of
    # pi/mu would give 6.6).
    mu, old, logp = (torch.tensor([[LN(p)]], dtype=F64) for p in (0.2, 0.6, 0.66))
    adv, mask = torch.ones((1, 1), dtype=F64), torch.ones((1, 1), dtype=F64)
    _, c_none, _ = loss_and_coef(MINIRL, CorrectionConfig(), "token-mean", logp, mu, old, adv, mask)
    _, c_tis, _ = loss_and_coef(MINIRL, CorrectionConfig(rollout_is="token"), "token-mean", logp, mu, old, adv, mask)
    assert float(c_none) == pytest.approx(3.3) and float(c_tis) == pytest.approx(2.2)
    # Rejection only (verl's decoupled_*_rs presets): no weight, the ratio is pi/pi_old: c = 1.1.
    cfg = CorrectionConfig(rollout_rs="token_k1", rollout_rs_threshold=4.0)
    assert float(loss_and_coef(MINIRL, cfg, "token-mean", logp, mu, old, adv, mask)[1]) == pytest.approx(1.1)


# Three rows of two tokens, pi = pi_old (ratio 1), A = 1, so every kept token's loss is -1. lambda = pi_x/mu:
# row 0 [1, 3] (token 1 rejected by token_k1 "0.5_2"), row 1 [3, 3] (the whole row rejected), row 2 [1, 1].
RS = CorrectionConfig(rollout_rs="token_k1", rollout_rs_threshold="0.5_2")
PI = torch.zeros((3, 2), dtype=F64)
MU = torch.tensor([[0.0, -LN(3)], [-LN(3), -LN(3)], [0.0, 0.0]], dtype=F64)
ONES = torch.ones((3, 2), dtype=F64)


@pytest.mark.parametrize(
    "agg,expected",
    [
        ("token-mean", -3 / 3),  # 3 kept tokens; with the rejected ones still counted: -3/6
        ("seq-mean-token-mean", -2 / 2),  # rows 0 and 2 (mean -1 each); row 1 counted: -2/3
        ("seq-mean-token-sum", -3 / 2),  # row sums -1 and -2 over 2 rows
    ],
)
def test_decoupled_rejection_leaves_the_loss_mask_and_every_denominator(agg, expected):
    loss, coef, cmb = loss_and_coef(PG_OLD, RS, agg, PI, MU, PI, ONES, ONES)
    assert loss == pytest.approx(expected)
    assert cmb.mask.tolist() == [[1, 0], [0, 0], [1, 1]] and coef.tolist() == cmb.mask.tolist()
    assert cmb.batch.advantages.tolist() == cmb.mask.tolist()  # A is 0 on rejected tokens, as verl's GRPO


@pytest.mark.parametrize(
    "agg,expected",
    [
        ("token-mean", -3 / 6),  # the engine counted the 6 tokens before the loss rejected 3
        ("seq-mean-token-mean", -2 / 2),  # the fully rejected row leaves the seq-mean denominator
        ("seq-mean-token-sum", -3 / 2),
    ],
)
def test_bypass_token_mean_keeps_rejected_tokens_and_seq_mean_drops_a_fully_rejected_row(agg, expected):
    # Bypass: lambda = log pi - log mu from this forward (pi_old is mu).
    cfg = CorrectionConfig(rollout_rs="token_k1", rollout_rs_threshold="0.5_2", bypass_mode=True)
    loss, coef, cmb = loss_and_coef(PG_OLD, cfg, agg, PI, MU, MU, ONES, ONES)
    assert loss == pytest.approx(expected)
    assert cmb.mask.tolist() == [[1, 0], [0, 0], [1, 1]]
    assert cmb.metrics["correction/rejected_row_frac"] == pytest.approx(1 / 3)


def test_a_zeroed_weight_keeps_its_token_in_the_denominators():
    # IcePop "0.5_2" on row 0 of the layout above: w = [1, 0] (3 > 2 zeroed), both tokens stay: token-mean
    # = (-1 + 0) / 2; a rejection would give -1 / 1.
    cfg = CorrectionConfig(rollout_is="token", rollout_is_threshold="0.5_2")
    loss, coef, cmb = loss_and_coef(PG_OLD, cfg, "token-mean", PI[:1], MU[:1], PI[:1], ONES[:1], ONES[:1])
    assert loss == pytest.approx(-0.5) and coef.tolist() == [[1.0, 0.0]] and cmb.mask.tolist() == [[1, 1]]


def test_bypass_ppo_clip_logs_the_weight_and_reinforce_applies_it():
    # pi/mu = 3, C = 2, A = 1, pg objective (c = A pi/mu on its own). ppo_clip: the objective's ratio already is
    # pi/mu, the weight is logged only: c = 3. reinforce: -A w log pi: c = min(3, 2) = 2 (not 3 * 2).
    logp, mu = torch.tensor([[0.0]], dtype=F64), torch.tensor([[-LN(3)]], dtype=F64)
    one = torch.ones((1, 1), dtype=F64)
    clip = CorrectionConfig(rollout_is="token", bypass_mode=True)
    _, c, cmb = loss_and_coef(PG_OLD, clip, "token-mean", logp, mu, mu, one, one)
    assert float(c) == pytest.approx(3.0) and cmb.weight is None
    assert cmb.metrics["correction/is_weight_mean"] == pytest.approx(2.0)
    reinforce = CorrectionConfig(rollout_is="token", bypass_mode=True, loss_type="reinforce")
    assert float(loss_and_coef(PG_OLD, reinforce, "token-mean", logp, mu, mu, one, one)[1]) == pytest.approx(2.0)


def test_correction_none_leaves_the_mini_batch_as_it_is():
    _, coef, cmb = loss_and_coef(PG_OLD, CorrectionConfig(), "token-mean", PI, MU, PI, ONES, ONES)
    assert cmb.weight is None and cmb.is_logp is None and cmb.metrics == {} and bool((cmb.mask == ONES).all())
    torch.testing.assert_close(coef, torch.exp(PI - MU))  # c = A pi/mu


def test_a_run_recorded_before_the_correction_group_matches_correction_none():
    # run_config.json of a run made before the group existed has no `correction`: it ran as `none`, so a resume
    # (or the findings suite's reuse) of it under `none` finds no difference, and under any other preset does.
    import dataclasses

    from harness.rundir.record import differences

    made = {"trainer": {"lr": 1e-4}}
    none = dataclasses.asdict(CorrectionConfig())
    assert differences(made, {"trainer": {"lr": 1e-4}, "correction": none}) == {}
    tis = {**none, "name": "decoupled_token_is", "rollout_is": "token"}
    changed = differences(made, {"trainer": {"lr": 1e-4}, "correction": tis})
    assert changed == {"correction.name": ("none", "decoupled_token_is"), "correction.rollout_is": (None, "token")}


# --- two steps of training per preset (slow) -----------------------------------------------------------------------


def _presets() -> list[str]:
    from harness.config.compose import CONF_DIR

    return sorted(p.stem for p in (CONF_DIR / "correction").glob("*.yaml"))


@pytest.mark.slow
@pytest.mark.parametrize("preset", _presets())
def test_two_steps_of_every_correction_preset(tmp_path, small_model, preset):
    from harness.config import validate
    from harness.loop.train import train
    from harness.rundir.files import read_jsonl
    from tests.conftest import FAST_TRAINER

    objective = ["objective=pg_is", "objective.anchor=old"] if preset.startswith("bypass_pg") else ["objective=minirl"]
    raw = compose(
        *small_model,
        *FAST_TRAINER,
        *objective,
        f"correction={preset}",
        "rollout=hf",
        "rollout.logit_noise=0.5",  # a mismatch, so that weights and rejections have something to act on
        "trainer.total_steps=2",
        "trainer.prompts_per_step=8",
    )
    summary = train(validate(raw), tmp_path / "run", raw)
    assert summary["status"] == "completed"
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and all(r["optim/skipped_steps"] == 0 for r in rows)
    cfg = validate(raw).correction
    if not cfg.active:  # correction=none: the loop as it always was, no correction/* metrics
        assert not any(k.startswith("correction/") for r in rows for k in r)
        return
    trained = [r for r in rows if r["optim/updates"] > 0]
    # Decoupled metrics are the step's; bypass ones come from the mini-batches that had a learning signal.
    for r in rows if not cfg.bypass_mode else trained:
        assert r["correction/log_ratio_mean"] == r["correction/log_ratio_mean"]  # present and not NaN
        if cfg.rollout_rs is not None:
            assert 0 <= r["correction/rejected_frac"] <= 1
        if cfg.rollout_is is not None:
            assert r["correction/is_weight_min"] <= r["correction/is_weight_mean"] <= r["correction/is_weight_max"]
