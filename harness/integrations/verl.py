"""verl adapter: importing this module registers our objectives as verl policy losses (verl 0.9).

Installed as this package's `verl.plugins` entry point, `import verl` loads it in every process (driver and Ray
workers); `VERL_USE_EXTERNAL_MODULES=harness.integrations.verl` does the same and shows an import error that verl's
plugin loader would log at debug level only. verl calls a policy loss as
    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights) -> (loss, metrics)
and this adapter maps old_log_prob -> behavior_logp (mu: the trust-region anchor and the importance weight's
denominator), log_prob -> logp, response_mask -> mask. Our objective gives the per-token loss; verl's rollout-
correction weights, when it passes them, multiply it as in verl's built-in losses; verl's own `agg_loss` reduces it,
so `actor.loss_agg_mode`, `actor.loss_scale_factor` and verl's global-batch normalisation apply unchanged.

Names: each objective under its harness name (`loss_mode=dppo`: verl's `dppo_tv` objective; `drpo`, `grpo`, ...)
and as `tr_<name>`; where verl has a loss of that name (`dppo_kl`, `cispo`) only `tr_<name>`: verl's own stays.

Values come from verl's actor config, read as verl's built-in losses read them (`core_algos.compute_policy_loss_*`):
a bound is `clip_ratio_low`/`clip_ratio_high`, each falling back to `clip_ratio` when null (VERL_KEYS says which
objective field each feeds; DPPO also takes `clip_ratio_c` as its importance-weight cap, as verl's dppo_tv does).
A bound the preset leaves open (None or inf: mask_neg's upper side, cispo_minimax's lower) stays open, since that
side being open is the objective. Objectives with no such field (PG-IS, the penalties) keep their preset.

mu must be the rollout engine's: verl's bypass mode (`algorithm.rollout_correction.bypass_mode=true` with
`actor_rollout_ref.rollout.calculate_log_probs=true`). Otherwise old_log_prob is verl's recompute pi_old, which is
refused before training (validate_config, in the driver); verl 0.9.1's legacy trainer rewrites loss_mode to
`bypass_mode` in bypass mode on the driver's config (verl-project/verl#4912), which this module undoes for our
losses so a worker can never silently train verl's instead. The first call logs the values used and runs the
step-1 mismatch health check (harness.health) on that micro-batch.

Not registered (SKIPPED says why for each):
- Top-K objectives: verl's loss call carries the sampled token's log-probs, not the top-K [B, T, K] ones.
- anchor=old objectives (the recompute ablations, MiniRL): they need mu and pi_old together, and verl passes one
  log-prob anchor (in its decoupled mode mu reaches the loss only folded into truncated IS weights).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
import verl
from torch import Tensor
from verl.trainer.ppo import rollout_corr_helper
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, agg_loss, register_policy_loss
from verl.utils import config as verl_config

from harness import health
from harness.integrations.versions import require
from harness.objectives import OBJECTIVE_NAMES, Objective, get_objective

log = logging.getLogger(__name__)

PREFIX = "tr_"
VERL_SUPPORTED = ((0, 9), (0, 9))  # tested with 0.9.1: the loss call, ppo_loss's config, the bypass rewrite
# objective family -> {objective field: verl actor key}; "low"/"high" are clip_ratio_low/high, null -> clip_ratio.
# A preset's None in delta_low/delta_high means "delta" (DPPO's own fallback), not an open side.
VERL_KEYS: dict[str, dict[str, str]] = {
    "dppo": {"delta_low": "low", "delta_high": "high", "is_cap": "clip_ratio_c"},
    "clip": {"eps_low": "low", "eps_high": "high"},
    "clip_relax": {"eps_low": "low", "eps_high": "high"},
    "cispo": {"eps_low": "low", "eps_high": "high"},
    "spo": {"eps": "clip_ratio"},
    "drpo": {"delta": "clip_ratio"},
}
_FALLS_BACK = {"delta_low", "delta_high"}
# Our metrics under verl's names. k1 and k3 are verl's rollout_corr/kl and rollout_corr/k3_kl
# (rollout_corr_helper.compute_offpolicy_metrics: both of mu against the policy); verl has no |pi - mu|, so it gets
# our name under verl's prefix. actor/pg_clipfrac (verl's dppo_tv: masked tokens over all response tokens) is
# computed apart: objective/masked_frac counts over the tokens with A != 0.
VERL_NAMES = {
    "mismatch/k1": "rollout_corr/kl",
    "mismatch/k3": "rollout_corr/k3_kl",
    "mismatch/abs_prob_diff_mean": "rollout_corr/abs_prob_diff_mean",
}
VERL_CAUSES = (
    "sampling settings that change what vLLM samples but not the log-probs it reports "
    "(actor_rollout_ref.rollout.top_p < 1 or top_k > 0)",
    "old_log_prob recomputed by the actor where the rollout's was meant (set "
    "algorithm.rollout_correction.bypass_mode=true and actor_rollout_ref.rollout.calculate_log_probs=true)",
    "a precision gap between the rollout engine and the actor (rollout dtype, FP8 rollout)",
)


def check_version(version: str) -> None:
    """One line when the installed verl is outside the range this adapter is tested with."""
    why = "harness.integrations.verl relies on verl's policy-loss call and its bypass-mode rewrite"
    require("verl", version, VERL_SUPPORTED, "0.9.1", why)


def unsupported_reason(objective: Objective) -> str | None:
    """Why verl's policy-loss call cannot feed `objective`, or None if it can."""
    if objective.cfg.needs_topk:
        return "it is a Top-K objective and verl's policy-loss call carries no top-K log-probs"
    if objective.needs_old:
        return "anchor=old needs mu and pi_old together and verl's policy-loss call carries one (old_log_prob)"
    return None


def overrides_from(objective: Objective, config: Any) -> dict[str, float]:
    """The objective's fields that verl's actor `config` sets (VERL_KEYS), read as verl's own losses read them."""
    if config is None:
        return {}

    def bound(side: str) -> float:
        value = getattr(config, f"clip_ratio_{side}", None)
        return float(config.clip_ratio if value is None else value)

    out = {}
    for name, key in VERL_KEYS.get(objective.cfg.family, {}).items():
        preset = getattr(objective.cfg, name)
        if (preset is None and name not in _FALLS_BACK) or (isinstance(preset, float) and math.isinf(preset)):
            continue  # an open side is the objective itself (mask_neg, cispo_minimax)
        out[name] = bound(key) if key in ("low", "high") else float(getattr(config, key))
    return out


class VerlPolicyLoss:
    """One objective in verl's PolicyLossFn shape (verl calls it with keywords)."""

    def __init__(self, name: str, overrides: dict[str, Any], loss_name: str) -> None:
        self.objective = get_objective(name, **overrides)  # the preset and the registered overrides
        self.overrides, self.loss_name = overrides, loss_name
        self._resolved: dict[tuple, tuple[Objective, dict[str, Any]]] = {}
        self.first_call: dict[str, Any] | None = None  # what the first call used and saw (None until then)

    def resolve(self, config: Any) -> tuple[Objective, dict[str, Any]]:
        """The objective with verl's config values applied, and those values (built once per distinct set)."""
        values = {**self.overrides, **overrides_from(self.objective, config)}
        key = tuple(sorted(values.items()))
        if key not in self._resolved:
            self._resolved[key] = get_objective(self.objective.name, **values), values
        return self._resolved[key]

    def __call__(
        self,
        old_log_prob: Tensor,
        log_prob: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        objective, values = self.resolve(config)
        out = objective(logp=log_prob, behavior_logp=old_log_prob, advantages=advantages, mask=response_mask)
        loss_mat = out.loss_mat
        if rollout_is_weights is not None:
            # verl's decoupled-mode correction (pi_old / mu, detached); its built-in losses apply it the same way.
            loss_mat = loss_mat * rollout_is_weights
        # verl's ppo_loss fills global_batch_info (dp size, global token/sequence counts, loss_scale_factor) per step.
        batch_info = getattr(config, "global_batch_info", None) or {}
        loss = agg_loss(loss_mat=loss_mat, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **batch_info)
        # 0-dim tensors: verl's Metric reads them, so no host sync here except on the first call.
        with torch.no_grad():
            metrics = {**out.metrics, **health.mismatch_estimates(log_prob, old_log_prob, response_mask)}
            metrics |= {verl_name: metrics[ours] for ours, verl_name in VERL_NAMES.items()}
            m = response_mask > 0
            signal = (m & (advantages != 0)).sum()
            metrics["actor/pg_clipfrac"] = metrics["objective/masked_frac"] * signal / m.sum().clamp(min=1)
            # verl's own key and definition (mean of mu - pi in log space), so its dashboards keep their curve.
            metrics["actor/ppo_kl"] = metrics["mismatch/k1"]
        if self.first_call is None:
            self._check_first_call(objective.name, values, old_log_prob, log_prob, response_mask, metrics)
        return loss, metrics

    def _check_first_call(
        self, name: str, values: dict[str, Any], mu: Tensor, logp: Tensor, mask: Tensor, metrics: dict[str, Tensor]
    ) -> None:
        """Log the values in use; warn when mu is the trainer's own log-prob bit for bit (a recompute, since an
        engine's rarely is) or when the step-1 health check finds the mismatch high."""
        m = mask > 0
        identical = bool(m.any()) and bool(torch.equal(mu[m], logp.detach()[m]))
        record, line = health.check({k: float(v) for k, v in metrics.items()}, causes=VERL_CAUSES)
        self.first_call = {"objective": name, "values": values, "mu_is_recompute": identical, "health": record}
        log.info("verl policy loss %s trains objective %s with %s", self.loss_name, name, values)
        if identical:
            log.warning(
                "verl policy loss %s: old_log_prob equals the actor's log-probs bit for bit at the first call, so it "
                "is a recompute, not the rollout's mu; set algorithm.rollout_correction.bypass_mode=true and "
                "actor_rollout_ref.rollout.calculate_log_probs=true",
                self.loss_name,
            )
        if line:
            log.warning("verl policy loss %s: %s", self.loss_name, line)


def loss_names(name: str) -> tuple[str, ...]:
    """The verl loss names objective `name` is registered under: its own unless verl has one, and tr_<name>."""
    own = POLICY_LOSS_REGISTRY.get(name)
    if own is not None and not isinstance(own, VerlPolicyLoss):
        return (PREFIX + name,)
    return (name, PREFIX + name)


def register(name: str, loss_name: str | None = None, **overrides: Any) -> str:
    """Register objective `name` (its preset, then `overrides`) as verl policy loss `loss_name` [tr_<name>]. verl's
    config values still apply on top (VERL_KEYS); `overrides` set what verl has no key for (a penalty's beta)."""
    reason = unsupported_reason(get_objective(name, **overrides))
    if reason is not None:
        raise ValueError(f"objective '{name}' cannot run as a verl policy loss: {reason}")
    loss_name = loss_name or PREFIX + name
    existing = POLICY_LOSS_REGISTRY.get(loss_name)
    if existing is not None and not isinstance(existing, VerlPolicyLoss):
        raise ValueError(f"verl policy loss '{loss_name}' is one of verl's own; pick another name")
    register_policy_loss(loss_name)(VerlPolicyLoss(name, overrides, loss_name))
    return loss_name


def ours(loss_mode: str | None) -> VerlPolicyLoss | None:
    fn = POLICY_LOSS_REGISTRY.get(loss_mode) if loss_mode else None
    return fn if isinstance(fn, VerlPolicyLoss) else None


def check_config(config: Any) -> None:
    """verl's full job config (the driver's): refuse, in one line, one of our losses anchored on a recompute."""
    actor_rollout_ref = config.actor_rollout_ref
    loss_mode = actor_rollout_ref.actor.policy_loss.get("loss_mode")
    if ours(loss_mode) is None:
        return
    correction = config.algorithm.get("rollout_correction") or {}
    missing = [
        key
        for key, on in (
            ("algorithm.rollout_correction.bypass_mode", correction.get("bypass_mode", False)),
            ("actor_rollout_ref.rollout.calculate_log_probs", actor_rollout_ref.rollout.get("calculate_log_probs")),
        )
        if not on
    ]
    if missing:
        raise ValueError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}: this objective's trust region is anchored "
            f"on the rollout's log-probs mu, which verl passes only in bypass mode; set {'=true and '.join(missing)}"
            "=true (otherwise old_log_prob is the actor's recompute)"
        )


def _install_driver_guards() -> None:
    """Wrap verl's validate_config (main_ppo calls it before building anything) with check_config, and its legacy
    trainer's apply_bypass_mode so that, for our losses, loss_mode stays ours (verl-project/verl#4912)."""
    validate = verl_config.validate_config
    apply_bypass = rollout_corr_helper.apply_bypass_mode
    if getattr(validate, "harness_guard", False):
        return

    def validate_config(config: Any, *args: Any, **kwargs: Any) -> None:
        check_config(config)
        validate(config, *args, **kwargs)

    def apply_bypass_mode(batch: Any, rollout_corr_config: Any = None, policy_loss_config: Any = None) -> None:
        loss_mode = policy_loss_config.get("loss_mode") if policy_loss_config is not None else None
        apply_bypass(batch=batch, rollout_corr_config=rollout_corr_config, policy_loss_config=policy_loss_config)
        if ours(loss_mode) is not None:
            policy_loss_config["loss_mode"] = loss_mode

    validate_config.harness_guard = True  # type: ignore[attr-defined]
    verl_config.validate_config = validate_config
    rollout_corr_helper.apply_bypass_mode = apply_bypass_mode


def _register_presets() -> tuple[dict[str, str], dict[str, str]]:
    registered, skipped = {}, {}
    for name in OBJECTIVE_NAMES:
        reason = unsupported_reason(get_objective(name))
        if reason is not None:
            skipped[name] = reason
            continue
        for loss_name in loss_names(name):
            registered[register(name, loss_name)] = name
    return registered, skipped


check_version(verl.__version__)
# verl loss name -> objective name, and objective name -> why it is not registered.
REGISTERED, SKIPPED = _register_presets()
_install_driver_guards()
