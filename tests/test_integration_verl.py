"""The verl adapter (harness/integrations/verl.py), run through verl itself (the verl extra, or `make
test-integrations`, which runs this file in a verl 0.9.1 environment with the built wheel installed).

verl's own `get_policy_loss_fn("tr_<name>")`, called with verl's own actor config class the way verl's ppo_loss
calls it, must give our objective's loss and gradient under every aggregation mode, with the values verl's config
sets (read as verl's built-in losses read them); DPPO's gradient and clip fractions must equal verl's built-in
`dppo_tv` / `dppo_kl` under the same config (their loss *values* differ by form: verl's is -A w M log pi, ours
-A w M, objectives.md §1); the mismatch metrics must be verl's rollout_corr ones. Along the path verl's driver and
workers take, as far as it runs on CPU: verl's own Hydra config, its validate_config (each setting our loss cannot
honour refused in one line; rollout_rs handed to the workers and applied in the loss), its apply_bypass_mode on a
DataProto, omega_conf_to_dataclass to the worker's actor config, and the worker's
`verl.workers.utils.losses.ppo_loss` on a tiny Qwen3's log-probs of its own samples, through backward and an
optimizer step; and fresh interpreters that import verl alone (the entry point registers `tr_dppo`; a failed
registration is named by validate_config). It stops before verl's FSDP engine, Ray workers and vLLM rollout, which
need GPUs.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from harness.objectives import AGG_MODES, OBJECTIVE_NAMES, aggregate, get_objective

# find_spec, not importorskip: importing verl costs ~15 s of CPU, and every pytest-xdist worker collects every file;
# only the worker that runs these tests pays it (the `api` fixture).
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("verl") is None,
    reason="verl is not installed here: make test-integrations runs this file in a verl 0.9.1 venv",
)

H = 16  # seq-mean-token-sum-norm's constant horizon (verl: actor.loss_scale_factor)
LENGTHS = [12, 5, 9, 2, 0, 7, 10]  # uneven; the empty row must drop out of every seq-mean, in verl and in ours
ADV = [1.0, -0.7, 0.0, -1.3, 0.4, 0.6, -0.9]  # per sequence, both signs and A = 0
T = max(LENGTHS)
TIGHT = {"rtol": 1e-7, "atol": 1e-12}  # float64; verl's seq-mean-token-mean adds 1e-8 to each row's token count
# verl actor values unlike every preset's, and what each objective must then use (hand-derived from VERL_KEYS and
# verl's reading: clip_ratio_low/high, clip_ratio for one-radius objectives, clip_ratio_c as DPPO's IS cap).
VERL_VALUES = {"clip_ratio": 0.25, "clip_ratio_low": 0.1, "clip_ratio_high": 0.3, "clip_ratio_c": 50.0}
DPPO_FROM_VERL = {"delta_low": 0.1, "delta_high": 0.3, "is_cap": 50.0}
CLIP_FROM_VERL = {"eps_low": 0.1, "eps_high": 0.3}
EXPECTED = {
    "dppo": DPPO_FROM_VERL,
    "dppo_kl": DPPO_FROM_VERL,
    "mask_neg": {"delta_low": 0.1, "delta_high": math.inf, "is_cap": 50.0},  # its open upper side stays open
    "ppo": CLIP_FROM_VERL,
    "grpo": CLIP_FROM_VERL,
    "grpo_relax": CLIP_FROM_VERL,
    "cispo_minimax": {"eps_low": None, "eps_high": 0.3},  # MiniMax's CISPO clips one side only
    "spo": {"eps": 0.25},
    "drpo": {"delta": 0.25},
    "drpo_mask": {"delta": 0.25},
    "drpo_no_absadv": {"delta": 0.25},
    "gspo": CLIP_FROM_VERL,
    "cppo": {"delta": 0.25},
}  # the rest (cispo, pg_is, pg_tis, penalty_*) have no field verl sets: their presets stand


@pytest.fixture(scope="module")
def api() -> SimpleNamespace:
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.workers.config import FSDPActorConfig

    from harness.integrations import verl as adapter

    return SimpleNamespace(get_policy_loss_fn=get_policy_loss_fn, actor_config_class=FSDPActorConfig, adapter=adapter)


def actor_config(api: SimpleNamespace, **values):
    """The config verl's worker builds, with global_batch_info as verl's ppo_loss fills it on one rank."""
    cfg = api.actor_config_class(
        strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=2, loss_scale_factor=H, **values
    )
    cfg.global_batch_info.update(dp_size=1, batch_num_tokens=None, global_batch_size=None, loss_scale_factor=H)
    return cfg


def inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    """mu in (0.02, 0.98), pi = mu moved by up to +-0.35 (both DPPO masks fire), junk in the padding."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(T) < torch.tensor(LENGTHS)[:, None]
    mu = torch.empty(len(LENGTHS), T, dtype=torch.float64).uniform_(0.02, 0.98, generator=g)
    pi = (mu + torch.empty_like(mu).uniform_(-0.35, 0.35, generator=g)).clamp(0.005, 0.995)
    weights = torch.empty_like(mu).uniform_(0.5, 2.0, generator=g)
    return {
        "old_log_prob": torch.where(mask, mu.log(), -1.0),
        "log_prob": torch.where(mask, pi.log(), -25.0),
        "advantages": torch.tensor(ADV, dtype=torch.float64)[:, None].expand(-1, T).clone(),
        "response_mask": mask,
        "rollout_is_weights": weights,
    }


def loss_and_grad(fn, x: dict[str, torch.Tensor], **kw) -> tuple[torch.Tensor, torch.Tensor, dict]:
    log_prob = x["log_prob"].clone().requires_grad_(True)
    loss, metrics = fn(
        old_log_prob=x["old_log_prob"],
        log_prob=log_prob,
        advantages=x["advantages"],
        response_mask=x["response_mask"],
        **kw,
    )
    loss.backward()
    return loss.detach(), log_prob.grad, metrics


def ours(name: str, x: dict[str, torch.Tensor], mode: str, weights: torch.Tensor | None, **values):
    """The reference: our objective on the same tensors, mu = verl's old_log_prob, our own aggregate()."""
    log_prob = x["log_prob"].clone().requires_grad_(True)
    mask = x["response_mask"]
    out = get_objective(name, **values)(
        logp=log_prob, behavior_logp=x["old_log_prob"], advantages=x["advantages"], mask=mask.double()
    )
    loss_mat = out.loss_mat if weights is None else out.loss_mat * weights
    loss = aggregate(loss_mat, mask.double(), mode=mode, horizon=H)
    loss.backward()
    return loss.detach(), log_prob.grad, out.metrics


def test_registration_names_and_errors(api):
    adapter = api.adapter
    assert sorted({*adapter.REGISTERED.values(), *adapter.SKIPPED}) == sorted(OBJECTIVE_NAMES)
    assert {"dppo_topk_tv", "dppo_topk_kl", "dppo_recompute", "minirl"} <= set(adapter.SKIPPED)
    # tr_<name> only: verl's registry keeps its own names, ours never take a short one.
    assert sorted(adapter.REGISTERED) == sorted(f"tr_{n}" for n in adapter.REGISTERED.values())
    assert adapter.REGISTERED["tr_dppo"] == "dppo" and api.get_policy_loss_fn("tr_drpo").objective.name == "drpo"
    for short in ("dppo", "drpo", "grpo", "spo"):
        with pytest.raises(ValueError, match=f"Unsupported loss mode: {short}"):
            api.get_policy_loss_fn(short)
    for verls in ("dppo_kl", "cispo", "gspo"):
        assert not isinstance(api.get_policy_loss_fn(verls), adapter.VerlPolicyLoss), verls
        assert api.get_policy_loss_fn(f"tr_{verls}").objective.name == verls
    with pytest.raises(ValueError, match=r"^objective 'minirl' cannot run as a verl policy loss: anchor=old"):
        adapter.register("minirl")
    with pytest.raises(ValueError, match=r"^verl policy loss 'dppo_x': our losses take 'tr_' names; use 'tr_dppo_x'$"):
        adapter.register("dppo", "dppo_x")
    # Values verl has no key for are a variant under its own name (what a user registers for a sweep).
    assert adapter.register("penalty_kl", "tr_penalty_kl_b01", beta=0.1) == "tr_penalty_kl_b01"
    assert api.get_policy_loss_fn("tr_penalty_kl_b01").objective.cfg.beta == 0.1


def test_a_newer_verl_warns_once_and_runs_an_older_one_is_refused(api, caplog):
    api.adapter.check_version("0.9.1")
    with caplog.at_level(logging.WARNING, logger="harness.integrations.versions"):
        api.adapter.check_version("0.10.0")
        api.adapter.check_version("0.10.0")  # once per process
    assert [r.getMessage() for r in caplog.records] == [
        "verl 0.10.0 is newer than the tested 0.9.x: running, since the calls the adapter makes are there; if it "
        "fails, pip install 'verl==0.9.1'"
    ]
    with pytest.raises(ImportError, match=r"^verl 0\.8\.5: .*; supported: verl 0\.9\.x; pip install 'verl==0\.9\.1'$"):
        api.adapter.check_version("0.8.5")


def test_a_verl_whose_loss_call_moved_is_refused_in_one_line(api):
    """A newer verl is refused on the calls the adapter makes: verl 0.9.1 has them all; a policy-loss call shaped
    like verl's value loss (a real verl function with other parameters) is refused."""
    from verl.trainer.ppo.core_algos import compute_value_loss

    assert api.adapter.api_problems() == []
    problems = api.adapter.api_problems(loss_fn=compute_value_loss)
    assert problems == ["the policy-loss call takes no old_log_prob, log_prob, advantages, config, rollout_is_weights"]
    with pytest.raises(ImportError) as e:
        api.adapter.check_api("0.11.0", problems)
    assert str(e.value) == (
        "verl 0.11.0: harness.integrations.verl cannot call it (the policy-loss call takes no old_log_prob, log_prob, "
        "advantages, config, rollout_is_weights); pip install 'verl==0.9.1'"
    )


@pytest.mark.parametrize("name", OBJECTIVE_NAMES)
def test_verl_runs_our_objective_with_verls_values(api, name):
    """verl's <name> = our objective with the values verl's config sets (EXPECTED) + the same aggregation."""
    obj = get_objective(name)
    if obj.cfg.needs_topk or obj.needs_old:
        assert name in api.adapter.SKIPPED
        with pytest.raises(ValueError, match=f"Unsupported loss mode: tr_{name}"):
            api.get_policy_loss_fn(f"tr_{name}")
        return
    fn = api.get_policy_loss_fn(f"tr_{name}")
    x = inputs()
    cfg = actor_config(api, **VERL_VALUES)
    expected = EXPECTED.get(name, {})
    resolved, values = fn.resolve(cfg)
    open_sides = {k for k, v in expected.items() if v is None or v == math.inf}  # the preset's, kept
    assert values == {k: v for k, v in expected.items() if k not in open_sides}
    for field, value in expected.items():
        assert getattr(resolved.cfg, field) == value, field
    for mode in AGG_MODES:
        for weights in (None, x["rollout_is_weights"]) if mode == "token-mean" else (None,):
            loss, grad, metrics = loss_and_grad(fn, x, loss_agg_mode=mode, config=cfg, rollout_is_weights=weights)
            ref_loss, ref_grad, ref_metrics = ours(name, x, mode, weights, **expected)
            torch.testing.assert_close(loss, ref_loss, **TIGHT, msg=f"{name} {mode} loss")
            torch.testing.assert_close(grad, ref_grad, **TIGHT, msg=f"{name} {mode} grad")
            assert grad[~x["response_mask"]].abs().max() == 0  # padding gets no gradient
    verl_names = {
        "actor/pg_clipfrac",
        "actor/pg_clipfrac_lower",
        "actor/ppo_kl",
        "rollout_corr/kl",
        "rollout_corr/k3_kl",
    }
    assert verl_names | {"mismatch/abs_prob_diff_mean", "mismatch/k1", "mismatch/k3"} <= metrics.keys()
    # ours under our own prefixes (objective/, mismatch/): under verl's, only verl's own names
    assert {k for k in metrics if k.startswith(("actor/", "rollout_corr/"))} == verl_names
    for key, value in ref_metrics.items():
        torch.testing.assert_close(metrics[key], value, msg=key)
    # verl's denominator (every response token) for verl's name; ours counts over the tokens with A != 0
    m = x["response_mask"]
    share = (m & (x["advantages"] != 0)).sum() / m.sum()
    torch.testing.assert_close(metrics["actor/pg_clipfrac"], ref_metrics["objective/masked_frac"] * share)


@pytest.mark.parametrize(("name", "verl_name"), [("dppo", "dppo_tv"), ("dppo_kl", "dppo_kl")])
@pytest.mark.parametrize("delta", [0.05, 0.15])
def test_dppo_equals_verls_builtin_under_the_same_config(api, name, verl_name, delta):
    """One verl config, including its clip_ratio_c default of 3 (verl's dppo_tv reads it as the IS cap, and so
    does ours): the same gradient, the same clip fractions (pg_clipfrac, pg_clipfrac_lower), the same ppo_kl."""
    x = inputs(seed=1)
    # verl's clip fraction also counts A = 0 tokens its negative-side test fails (they carry no gradient): no
    # such tokens here, so the fractions must agree exactly.
    x["advantages"] = torch.where(x["advantages"] == 0, 0.3, x["advantages"])
    cfg = actor_config(api, clip_ratio=delta, clip_ratio_low=delta, clip_ratio_high=delta)
    assert cfg.clip_ratio_c == 3.0
    for mode in AGG_MODES:
        for weights in (None, x["rollout_is_weights"]):
            kw = {"loss_agg_mode": mode, "config": cfg, "rollout_is_weights": weights}
            _, grad, metrics = loss_and_grad(api.get_policy_loss_fn(f"tr_{name}"), x, **kw)
            _, verl_grad, verl_metrics = loss_and_grad(api.get_policy_loss_fn(verl_name), x, **kw)
            torch.testing.assert_close(grad, verl_grad, **TIGHT, msg=f"tr_{name} vs {verl_name}, {mode}")
    # The inputs exercise both directions of the mask and the IS cap; the metrics are verl's own.
    assert metrics["objective/masked_frac_pos"] > 0 and metrics["objective/masked_frac_neg"] > 0
    assert metrics["objective/is_capped_frac"] > 0
    assert metrics["actor/pg_clipfrac"].item() == pytest.approx(
        verl_metrics["actor/pg_clipfrac"], rel=1e-6
    )  # float32 counts
    assert metrics["actor/ppo_kl"].item() == pytest.approx(verl_metrics["actor/ppo_kl"], rel=1e-12)
    # kept tokens whose ratio passed the cap, over every response token, as verl's dppo losses count them
    assert metrics["actor/pg_clipfrac_lower"] > 0
    assert metrics["actor/pg_clipfrac_lower"].item() == pytest.approx(verl_metrics["actor/pg_clipfrac_lower"], rel=1e-6)


def test_mismatch_metrics_are_verls_rollout_corr_ones(api):
    from verl.trainer.ppo.rollout_corr_helper import compute_offpolicy_metrics

    x = inputs(seed=2)
    _, _, metrics = loss_and_grad(api.get_policy_loss_fn("tr_dppo"), x, config=actor_config(api))
    # verl computes them between its trainer log-probs and the rollout's: here pi (log_prob) and mu (old_log_prob).
    verl = compute_offpolicy_metrics(x["log_prob"], x["old_log_prob"], x["response_mask"])
    assert metrics["rollout_corr/kl"].item() == pytest.approx(verl["kl"], rel=1e-9)
    assert metrics["rollout_corr/k3_kl"].item() == pytest.approx(verl["k3_kl"], rel=1e-9)
    m = x["response_mask"]
    by_hand = (x["log_prob"].exp() - x["old_log_prob"].exp()).abs()[m].mean()
    assert metrics["mismatch/abs_prob_diff_mean"].item() == pytest.approx(float(by_hand), rel=1e-12)


def test_the_first_call_names_a_recompute_and_a_high_mismatch(api, caplog):
    adapter = api.adapter
    x = inputs(seed=3)
    recompute = dict(x, old_log_prob=x["log_prob"].clone())  # mu == pi bit for bit: what a recompute gives
    fn = adapter.VerlPolicyLoss("dppo", {}, "tr_dppo")
    with caplog.at_level(logging.WARNING, logger=adapter.__name__):
        loss_and_grad(fn, recompute, config=actor_config(api))
        loss_and_grad(fn, x, config=actor_config(api))  # not the first call: no second check
    assert fn.first_call["mu_is_recompute"] is True and fn.first_call["health"]["over"] == []
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["verl policy loss tr_dppo"]
    assert "is a recompute, not the rollout's mu; set algorithm.rollout_correction.bypass_mode=true" in caplog.text

    caplog.clear()
    fn = adapter.VerlPolicyLoss("dppo", {}, "tr_dppo")
    with caplog.at_level(logging.WARNING, logger=adapter.__name__):
        loss_and_grad(fn, x, config=actor_config(api))  # |pi - mu| up to 0.35: far past every limit
    assert fn.first_call["mu_is_recompute"] is False
    assert set(fn.first_call["health"]["over"]) == {"ratio_mean_gap", "k3", "abs_prob_diff_mean"}
    assert "health check after step 1: the training-inference mismatch is high" in caplog.text
    assert "actor_rollout_ref.rollout.top_p" in caplog.text  # the causes name verl's settings


def verl_job(**overrides: str):
    """verl's own job config (verl/trainer/config/ppo_trainer.yaml), composed by Hydra as main_ppo composes it."""
    import verl
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(os.path.join(os.path.dirname(verl.__file__), "trainer", "config"), version_base=None):
        return compose("ppo_trainer", overrides=[f"{k}={v}" for k, v in overrides.items()])


LOSS = "actor_rollout_ref.actor.policy_loss.loss_mode"
BYPASS = "algorithm.rollout_correction.bypass_mode"


def test_driver_refuses_a_recompute_anchor_in_one_line_before_anything_is_built(api):
    from verl.utils.config import validate_config  # what main_ppo imports: the adapter's guard wraps it

    job = verl_job(**{LOSS: "tr_drpo"})
    with pytest.raises(ValueError) as e:
        validate_config(job, use_reference_policy=False, use_critic=False)
    assert str(e.value) == (
        "actor_rollout_ref.actor.policy_loss.loss_mode=tr_drpo: this objective's trust region is anchored on the "
        "rollout's log-probs mu, which verl passes only in bypass mode; set algorithm.rollout_correction."
        "bypass_mode=true (otherwise old_log_prob is the actor's recompute)"
    )
    job = verl_job(**{LOSS: "tr_drpo", BYPASS: "true", "actor_rollout_ref.rollout.calculate_log_probs": "false"})
    with pytest.raises(ValueError, match=r"set actor_rollout_ref\.rollout\.calculate_log_probs=true \("):
        api.adapter.check_config(job)
    api.adapter.check_config(verl_job(**{LOSS: "tr_drpo", BYPASS: "true"}))
    api.adapter.check_config(verl_job(**{LOSS: "vanilla"}))  # verl's own losses: not ours to judge


RS = "algorithm.rollout_correction.rollout_rs"
RS_THRESHOLD = "algorithm.rollout_correction.rollout_rs_threshold"
ACTOR = "actor_rollout_ref.actor"
SIZES = {f"{ACTOR}.ppo_micro_batch_size_per_gpu": "2", "actor_rollout_ref.rollout.n": "2"}  # the worker's must-sets


def refusal(api, **overrides: str) -> str:
    """The one line the driver check gives for our tr_dppo (unless `overrides` names another) in bypass mode."""
    job = verl_job(**{LOSS: "tr_dppo", BYPASS: "true", **overrides})
    with pytest.raises(ValueError) as e:
        api.adapter.check_config(job)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_rollout_rs_drops_the_tokens_it_rejects_from_our_loss_as_verls_bypass_loss_does(api):
    """The driver check hands algorithm.rollout_correction to the workers' actor config; the loss rejects on the
    policy's log-probs against mu, per micro-batch. token_k1 with '0.5_2.0' keeps a token when
    log 0.5 <= log(mu/pi) <= log 2; a rejected token leaves the objective's mask and agg_loss's."""
    from verl.utils.config import omega_conf_to_dataclass

    job = verl_job(**{LOSS: "tr_dppo", BYPASS: "true", RS: "token_k1", RS_THRESHOLD: "'0.5_2.0'", **SIZES})
    api.adapter.check_config(job)
    actor = omega_conf_to_dataclass(job.actor_rollout_ref.actor)
    actor.global_batch_info.update(dp_size=1, batch_num_tokens=None, global_batch_size=None, loss_scale_factor=None)
    x = inputs(seed=4)
    m = x["response_mask"]
    k1 = x["old_log_prob"] - x["log_prob"]
    keep = m & (k1 >= math.log(0.5)) & (k1 <= math.log(2.0))
    assert 0 < keep.sum() < m.sum()
    loss, grad, metrics = loss_and_grad(api.get_policy_loss_fn("tr_dppo"), x, loss_agg_mode="token-mean", config=actor)
    verl_defaults = {"delta_low": 0.2, "delta_high": 0.2, "is_cap": 3.0}  # clip_ratio_low/high, clip_ratio_c
    ref_loss, ref_grad, _ = ours("dppo", dict(x, response_mask=keep), "token-mean", None, **verl_defaults)
    torch.testing.assert_close(loss, ref_loss, **TIGHT)
    torch.testing.assert_close(grad, ref_grad, **TIGHT)
    assert grad[m & ~keep].abs().max() == 0
    full_loss, _, _ = ours("dppo", x, "token-mean", None, **verl_defaults)
    assert abs(full_loss - loss) > 1e-3  # the rejection changed what trains
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(float(1 - keep.sum() / m.sum()))
    # verl's own parser judges the options on the driver: a threshold left out stops the job there.
    assert refusal(api, **{RS: "token_k1"}) == (
        "algorithm.rollout_correction.rollout_rs=token_k1 rollout_rs_threshold=None: verl refuses it: "
        "rollout_rs_threshold must be provided for rejection sampling."
    )


def test_rollout_is_is_refused_since_our_weight_already_is_pi_over_mu(api):
    assert refusal(api, **{"algorithm.rollout_correction.rollout_is": "token"}) == (
        "algorithm.rollout_correction.rollout_is=token: objective dppo already weights each token by pi/mu (bypass "
        "mode: mu is the rollout's), so verl's weight would count it twice (verl's bypass ppo_clip leaves it out "
        "too); set rollout_is=null"
    )


def test_a_bypass_loss_type_other_than_ppo_clip_is_refused(api):
    assert refusal(api, **{"algorithm.rollout_correction.loss_type": "reinforce"}) == (
        "algorithm.rollout_correction.loss_type=reinforce: it picks verl's own bypass loss, and "
        "actor_rollout_ref.actor.policy_loss.loss_mode=tr_dppo trains objective dppo instead; set loss_type=ppo_clip"
    )


def test_an_entropy_bonus_is_refused_unless_the_job_opts_in(api):
    assert refusal(api, **{f"{ACTOR}.entropy_coeff": "0.01"}) == (
        "actor_rollout_ref.actor.entropy_coeff=0.01: verl's ppo_loss would train loss = dppo - 0.01 * entropy "
        "(aggregated by loss_agg_mode), a term objective dppo does not have; set it to 0, or opt in with "
        "+trust_region.extra_terms=[entropy]"
    )
    api.adapter.check_config(verl_job(**{LOSS: "tr_dppo", BYPASS: "true", f"{ACTOR}.entropy_coeff": "0.01",
                                         "+trust_region.extra_terms": "[entropy]"}))  # fmt: skip
    assert refusal(api, **{"+trust_region.extra_terms": "[entropy,bonus]"}) == (
        "trust_region.extra_terms=['entropy', 'bonus']: 'bonus' is not one of entropy, kl"
    )


def test_a_kl_loss_is_refused_unless_the_job_opts_in(api):
    assert refusal(api, **{f"{ACTOR}.use_kl_loss": "true"}) == (
        "actor_rollout_ref.actor.use_kl_loss=true: verl's ppo_loss would train loss = dppo + 0.001 * "
        "KL_low_var_kl(pi, ref) (aggregated by loss_agg_mode), a term objective dppo does not have; set it to "
        "false, or opt in with +trust_region.extra_terms=[kl]"
    )
    api.adapter.check_config(verl_job(**{LOSS: "tr_dppo", BYPASS: "true", f"{ACTOR}.use_kl_loss": "true",
                                         "+trust_region.extra_terms": "[kl,entropy]"}))  # fmt: skip


def test_a_clip_key_the_objective_does_not_read_is_refused(api):
    """Changed from verl's default but read by nothing: PG-IS has no bound, DRPO one radius (clip_ratio), DPPO two
    (clip_ratio_low/high, set by default, so clip_ratio is unread) and a cap; keys of verl's other losses."""
    assert refusal(api, **{LOSS: "tr_pg_is", f"{ACTOR}.clip_ratio_high": "0.28"}) == (
        "actor_rollout_ref.actor.clip_ratio_high=0.28: objective pg_is does not read it (no bound verl sets); "
        "leave it at verl's default 0.2"
    )
    assert refusal(api, **{LOSS: "tr_drpo", f"{ACTOR}.clip_ratio_low": "0.1"}) == (
        "actor_rollout_ref.actor.clip_ratio_low=0.1: objective drpo does not read it (delta from clip_ratio); "
        "leave it at verl's default 0.2"
    )
    assert refusal(api, **{f"{ACTOR}.clip_ratio": "0.15"}) == (
        "actor_rollout_ref.actor.clip_ratio=0.15: objective dppo does not read it (delta_low from clip_ratio_low, "
        "delta_high from clip_ratio_high, is_cap from clip_ratio_c); leave it at verl's default 0.2"
    )
    assert refusal(api, **{LOSS: "tr_grpo", f"{ACTOR}.clip_ratio_c": "10"}).startswith(
        "actor_rollout_ref.actor.clip_ratio_c=10: objective grpo does not read it (eps_low from clip_ratio_low"
    )
    assert refusal(api, **{f"{ACTOR}.tau_pos": "2.0"}) == (
        "actor_rollout_ref.actor.tau_pos=2.0: only verl's own losses read it, not objective dppo; leave it at 1.0"
    )
    # null sides fall back to clip_ratio (read then), and the open side of mask_neg is read by nothing
    nulls = {f"{ACTOR}.clip_ratio_low": "null", f"{ACTOR}.clip_ratio_high": "null"}
    api.adapter.check_config(verl_job(**{LOSS: "tr_dppo", BYPASS: "true", f"{ACTOR}.clip_ratio": "0.15", **nulls}))
    assert refusal(api, **{LOSS: "tr_mask_neg", f"{ACTOR}.clip_ratio_high": "0.3"}).startswith(
        "actor_rollout_ref.actor.clip_ratio_high=0.3: objective mask_neg does not read it (delta_low from"
    )


def test_verl_values_the_objective_cannot_take_are_refused_on_the_driver(api):
    line = refusal(api, **{f"{ACTOR}.clip_ratio_low": "0.0"})
    assert line.startswith(
        "actor_rollout_ref.actor.clip_ratio_low=0.0, actor_rollout_ref.actor.clip_ratio_high=0.2, "
        "actor_rollout_ref.actor.clip_ratio_c=3.0: objective dppo cannot take them: objective.delta_low"
    ), line


def python_alone(code: str, cwd) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter of this venv that imports nothing of ours itself (no VERL_USE_EXTERNAL_*)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_USE_EXTERNAL")}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )


@pytest.mark.slow  # a fresh interpreter imports verl
def test_importing_verl_alone_registers_our_losses_through_the_entry_point(tmp_path):
    out = python_alone(
        "import sys, verl\n"
        "from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY as R\n"
        "print(sorted(k for k in R if k.startswith('tr_')))\n"
        "print('dppo' in R, 'drpo' in R, type(R['dppo_tv']).__module__)\n"
        "print(sorted(m for m in sys.modules if m.startswith('harness.integrations')))\n",
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    names, short, modules = out.stdout.splitlines()
    assert {"tr_dppo", "tr_drpo", "tr_dppo_kl", "tr_grpo"} <= set(eval(names)), names
    assert short == "False False builtins"  # no short names of ours; verl's dppo_tv is verl's own function
    assert "harness.integrations.verl_plugin" in eval(modules)


@pytest.mark.slow  # a fresh interpreter imports verl
def test_a_registration_failure_stops_verls_driver_naming_the_error(tmp_path):
    out = python_alone(
        "import sys, os\n"
        "sys.modules['harness.health'] = None  # an import the adapter needs fails\n"
        "import verl\n"
        "from hydra import compose, initialize_config_dir\n"
        "from verl.utils.config import validate_config\n"
        "config = os.path.join(os.path.dirname(verl.__file__), 'trainer', 'config')\n"
        "with initialize_config_dir(config, version_base=None):\n"
        f"    job = compose('ppo_trainer', overrides=['{LOSS}=tr_dppo', '{BYPASS}=true'])\n"
        "try:\n"
        "    validate_config(job, use_reference_policy=False, use_critic=False)\n"
        "except ImportError as e:\n"
        "    print(e)\n",
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "actor_rollout_ref.actor.policy_loss.loss_mode=tr_dppo: trust-region-harness could not register its verl "
        "losses (ModuleNotFoundError: import of harness.health halted; None in sys.modules); `python -c 'import "
        "harness.integrations.verl'` shows the traceback"
    ]
    assert "trust-region-harness: our verl losses (tr_*) are not registered: ModuleNotFoundError" in out.stderr


def test_a_worker_trains_our_loss_on_a_tiny_model_in_bypass_mode(api):
    """Driver: bypass mode sets old_log_probs = the rollout's log-probs, and loss_mode stays ours (verl 0.9.1 would
    rewrite it to bypass_mode; verl's own losses still are). Worker: the actor config as verl converts it, and
    verl's ppo_loss on a tiny Qwen3's log-probs of its own samples; the loss is our objective's, and it trains."""
    from tensordict import TensorDict
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from verl import DataProto
    from verl.trainer.ppo.rollout_corr_helper import apply_bypass_mode
    from verl.utils import tensordict_utils
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.utils.losses import ppo_loss

    job = verl_job(**{LOSS: "vanilla", BYPASS: "true"})
    apply_bypass_mode(DataProto.from_dict({"rollout_log_probs": torch.zeros(1, 1)}), job.algorithm.rollout_correction,
                      job.actor_rollout_ref.actor.policy_loss)  # fmt: skip
    assert job.actor_rollout_ref.actor.policy_loss.loss_mode == "bypass_mode"  # verl's behaviour for its own

    job = verl_job(**{
        LOSS: "tr_dppo", BYPASS: "true", "actor_rollout_ref.actor.clip_ratio_low": "0.15",
        "actor_rollout_ref.actor.clip_ratio_high": "0.15", "actor_rollout_ref.actor.clip_ratio_c": "10000",
        "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-sum-norm",
        "actor_rollout_ref.actor.loss_scale_factor": "6", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "4",
        "actor_rollout_ref.rollout.n": "2",
    })  # fmt: skip
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=64, tie_word_embeddings=True, bos_token_id=None,
        eos_token_id=1, pad_token_id=0,
    ))  # fmt: skip
    B, P, R = 4, 3, 6
    prompts = torch.randint(2, 64, (B, P))
    with torch.no_grad():
        gen = model.generate(
            prompts, attention_mask=torch.ones_like(prompts), do_sample=True, max_new_tokens=R, min_new_tokens=R,
            output_logits=True, return_dict_in_generate=True, pad_token_id=0, eos_token_id=None,
        )  # fmt: skip
    responses = gen.sequences[:, P:]
    rollout_logp = torch.stack(gen.logits, 1).float().log_softmax(-1).gather(-1, responses[..., None])[..., 0]
    rollout_logp = rollout_logp + 0.05 * torch.randn(B, R)  # the engine's mismatch: mu is not the trainer's pi

    batch = DataProto.from_dict({"rollout_log_probs": rollout_logp, "old_log_probs": torch.zeros(B, R)})
    apply_bypass_mode(batch, job.algorithm.rollout_correction, job.actor_rollout_ref.actor.policy_loss)
    assert job.actor_rollout_ref.actor.policy_loss.loss_mode == "tr_dppo"
    assert torch.equal(batch.batch["old_log_probs"], rollout_logp)

    actor = omega_conf_to_dataclass(job.actor_rollout_ref.actor)
    assert (actor.policy_loss.loss_mode, actor.clip_ratio_low, actor.clip_ratio_c) == ("tr_dppo", 0.15, 10000.0)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None].expand(B, R).clone()
    mask = torch.ones(B, R)
    data = TensorDict({
        "prompts": prompts, "responses": responses, "attention_mask": torch.ones(B, P + R, dtype=torch.long),
        "response_mask": mask, "old_log_probs": batch.batch["old_log_probs"], "advantages": adv,
    }, batch_size=[B])  # fmt: skip
    for key, value in {"dp_size": 1, "batch_num_tokens": None, "global_batch_size": None}.items():
        tensordict_utils.assign_non_tensor_data(data, key, value)

    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    seq = torch.cat([prompts, responses], 1)
    logp_all = model(seq).logits.float()[:, :-1].log_softmax(-1).gather(-1, seq[:, 1:, None])[..., 0]
    # verl's engine output: the sequences unpadded and concatenated, position j holding log p(token j+1).
    flat = torch.cat([logp_all, torch.zeros(B, 1)], 1).reshape(-1)
    loss, metrics = ppo_loss(actor, {"log_probs": flat}, data)
    logp = logp_all[:, P - 1 :]
    ref = aggregate(
        get_objective("dppo")(logp=logp, behavior_logp=rollout_logp, advantages=adv, mask=mask).loss_mat,
        mask, "seq-mean-token-sum-norm", 6,
    )  # fmt: skip
    torch.testing.assert_close(loss, ref)
    assert {"actor/pg_clipfrac", "rollout_corr/k3_kl", "objective/masked_frac", "actor/pg_loss"} <= metrics.keys()
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    moved = [k for k, v in model.named_parameters() if not torch.equal(v, before[k])]
    assert "lm_head.weight" in moved or "model.embed_tokens.weight" in moved
    assert len(moved) >= len(before) // 2


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "verl" / "run_qwen3-1.7b_trust_region.sh"


@pytest.mark.parametrize("loss_mode", ["tr_dppo", "tr_drpo", "dppo_tv"])
def test_the_verl_example_job_passes_verls_validate_config(api, loss_mode):
    """examples/verl's overrides compose into verl's own config, which verl's validate_config (our checks first)
    accepts; our losses then train the values the example means (DPPO 0.15 both sides, uncapped; DRPO 0.15)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    env = dict(os.environ, PRINT_OVERRIDES="1", LOSS_MODE=loss_mode)
    out = subprocess.run(["bash", str(EXAMPLE)], env=env, capture_output=True, text=True, check=True, timeout=60)
    job = verl_job(**dict(line.split("=", 1) for line in out.stdout.splitlines()))
    validate_config(job, use_reference_policy=need_reference_policy(job), use_critic=need_critic(job))
    assert job.actor_rollout_ref.actor.policy_loss.loss_mode == loss_mode
    fn = api.adapter.ours(loss_mode)
    if fn is not None:
        expected = {"tr_dppo": {"delta_low": 0.15, "delta_high": 0.15, "is_cap": 10000.0}, "tr_drpo": {"delta": 0.15}}
        assert fn.resolve(job.actor_rollout_ref.actor)[1] == expected[loss_mode]
