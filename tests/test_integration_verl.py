"""The verl adapter (harness/integrations/verl.py), run through verl itself.

verl's own `get_policy_loss_fn("tr_<name>")`, called with verl's own actor config class the way verl's ppo_loss
calls it, must give our objective's loss and gradient under every aggregation mode; and DPPO's gradient must equal
verl's built-in `dppo_tv` / `dppo_kl` set to the same delta and no IS truncation (their loss *values* differ by
form: verl's is -A w M log pi, ours -A w M, objectives.md §1).
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch

from harness.objectives import AGG_MODES, OBJECTIVE_NAMES, aggregate, get_objective

# find_spec, not importorskip: importing verl costs ~15 s of CPU, and every pytest-xdist worker collects every file;
# only the worker that runs these tests pays it (the `api` fixture).
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("verl") is None, reason="the verl extra is not installed: make verl-extra"
)

H = 16  # seq-mean-token-sum-norm's constant horizon (verl: actor.loss_scale_factor)
LENGTHS = [12, 5, 9, 2, 0, 7, 10]  # uneven; the empty row must drop out of every seq-mean, in verl and in ours
ADV = [1.0, -0.7, 0.0, -1.3, 0.4, 0.6, -0.9]  # per sequence, both signs and A = 0
T = max(LENGTHS)
TIGHT = {"rtol": 1e-7, "atol": 1e-12}  # float64; verl's seq-mean-token-mean adds 1e-8 to each row's token count


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


def ours(name: str, x: dict[str, torch.Tensor], mode: str, weights: torch.Tensor | None):
    """The reference: our objective on the same tensors, mu = verl's old_log_prob, our own aggregate()."""
    log_prob = x["log_prob"].clone().requires_grad_(True)
    mask = x["response_mask"]
    out = get_objective(name)(
        logp=log_prob, behavior_logp=x["old_log_prob"], advantages=x["advantages"], mask=mask.double()
    )
    loss_mat = out.loss_mat if weights is None else out.loss_mat * weights
    loss = aggregate(loss_mat, mask.double(), mode=mode, horizon=H)
    loss.backward()
    return loss.detach(), log_prob.grad, out.metrics


def test_registration_and_its_errors(api):
    adapter = api.adapter
    assert sorted([*adapter.REGISTERED.values(), *adapter.SKIPPED]) == sorted(OBJECTIVE_NAMES)
    assert {"dppo_topk_tv", "dppo_topk_kl", "dppo_recompute", "minirl"} <= set(adapter.SKIPPED)
    with pytest.raises(ValueError, match=r"^objective 'minirl' cannot run as a verl policy loss: anchor=old"):
        adapter.register("minirl")
    with pytest.raises(ValueError, match="'dppo_tv' is one of verl's own"):
        adapter.register("dppo", "dppo_tv")
    # Other values are a variant under its own name (what a user registers for a sweep).
    assert adapter.register("dppo", "tr_dppo_d02", delta=0.2) == "tr_dppo_d02"
    assert api.get_policy_loss_fn("tr_dppo_d02").objective.cfg.delta == 0.2


@pytest.mark.parametrize("name", OBJECTIVE_NAMES)
def test_verl_runs_our_objective(api, name):
    """verl's tr_<name> = our objective + the same aggregation; an objective verl cannot feed is not registered."""
    obj = get_objective(name)
    if obj.cfg.needs_topk or obj.needs_old:
        assert name in api.adapter.SKIPPED
        with pytest.raises(ValueError, match=f"Unsupported loss mode: tr_{name}"):
            api.get_policy_loss_fn(f"tr_{name}")
        return
    fn = api.get_policy_loss_fn(f"tr_{name}")
    x = inputs()
    cfg = actor_config(api)
    for mode in AGG_MODES:
        for weights in (None, x["rollout_is_weights"]) if mode == "token-mean" else (None,):
            loss, grad, metrics = loss_and_grad(fn, x, loss_agg_mode=mode, config=cfg, rollout_is_weights=weights)
            ref_loss, ref_grad, ref_metrics = ours(name, x, mode, weights)
            torch.testing.assert_close(loss, ref_loss, **TIGHT, msg=f"{name} {mode} loss")
            torch.testing.assert_close(grad, ref_grad, **TIGHT, msg=f"{name} {mode} grad")
            assert grad[~x["response_mask"]].abs().max() == 0  # padding gets no gradient
    assert metrics.keys() == {*ref_metrics, "actor/ppo_kl"}
    for key, value in ref_metrics.items():
        torch.testing.assert_close(metrics[key], value, msg=key)


@pytest.mark.parametrize(("name", "verl_name", "delta"), [("dppo", "dppo_tv", 0.15), ("dppo_kl", "dppo_kl", 0.05)])
def test_dppo_gradient_equals_verls_builtin(api, name, verl_name, delta):
    x = inputs(seed=1)
    # The same thresholds, and verl's TIS cap lifted to our is_cap (its config default of 3 would truncate, P3).
    cfg = actor_config(api, clip_ratio=delta, clip_ratio_low=delta, clip_ratio_high=delta, clip_ratio_c=1e4)
    assert get_objective(name).cfg.delta == delta and get_objective(name).cfg.is_cap == 1e4
    for mode in AGG_MODES:
        for weights in (None, x["rollout_is_weights"]):
            kw = {"loss_agg_mode": mode, "config": cfg, "rollout_is_weights": weights}
            _, grad, metrics = loss_and_grad(api.get_policy_loss_fn(f"tr_{name}"), x, **kw)
            _, verl_grad, verl_metrics = loss_and_grad(api.get_policy_loss_fn(verl_name), x, **kw)
            torch.testing.assert_close(grad, verl_grad, **TIGHT, msg=f"tr_{name} vs {verl_name}, {mode}")
    # The inputs exercise both directions of the mask, and the mismatch metric is verl's own.
    assert metrics["objective/masked_frac_pos"] > 0 and metrics["objective/masked_frac_neg"] > 0
    assert metrics["actor/ppo_kl"].item() == pytest.approx(verl_metrics["actor/ppo_kl"], rel=1e-12)
