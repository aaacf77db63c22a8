"""verl adapter: `import harness.integrations.verl` registers our objectives as verl policy losses `tr_<name>`.

verl (0.9, `verl.trainer.ppo.core_algos`) calls a policy loss as
    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights) -> (loss, metrics)
and this adapter maps old_log_prob -> behavior_logp (mu: the trust-region anchor and the importance weight's
denominator), log_prob -> logp, response_mask -> mask. Our objective gives the per-token loss; verl's rollout-
correction weights, when it passes them, multiply it as in verl's built-in losses; verl's own `agg_loss` reduces it,
so `actor.loss_agg_mode`, `actor.loss_scale_factor` and verl's global-batch normalisation apply unchanged.

old_log_prob is the rollout engine's mu only in verl's bypass mode (README, "Using our objectives in verl");
otherwise it is verl's recompute pi_old, and every tr_ loss is then anchored on pi_old.

Not registered (SKIPPED says why for each):
- Top-K objectives: verl's loss call carries the sampled token's log-probs, not the top-K [B, T, K] ones.
- anchor=old objectives (the recompute ablations, MiniRL): they need mu and pi_old together, and verl passes one
  log-prob anchor (in its decoupled mode mu reaches the loss only folded into truncated IS weights).

The preset's values are used; verl's actor.clip_ratio, clip_ratio_low/high and clip_ratio_c do not reach a tr_ loss
(clip_ratio_c defaults to 3 there, a silent IS truncation, objectives.md P3). Other values are a registered variant:
`register("dppo", "tr_dppo_d02", delta=0.2)` in the module verl imports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, agg_loss, register_policy_loss
from verl.utils.torch_functional import masked_mean

from harness.objectives import OBJECTIVE_NAMES, Objective, get_objective

PREFIX = "tr_"


def unsupported_reason(objective: Objective) -> str | None:
    """Why verl's policy-loss call cannot feed `objective`, or None if it can."""
    if objective.cfg.needs_topk:
        return "it is a Top-K objective and verl's policy-loss call carries no top-K log-probs"
    if objective.needs_old:
        return "anchor=old needs mu and pi_old together and verl's policy-loss call carries one (old_log_prob)"
    return None


@dataclass(frozen=True)
class VerlPolicyLoss:
    """One objective in verl's PolicyLossFn shape (verl calls it with keywords)."""

    objective: Objective

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
        out = self.objective(logp=log_prob, behavior_logp=old_log_prob, advantages=advantages, mask=response_mask)
        loss_mat = out.loss_mat
        if rollout_is_weights is not None:
            # verl's decoupled-mode correction (pi_old / mu, detached); its built-in losses apply it the same way.
            loss_mat = loss_mat * rollout_is_weights
        # verl's ppo_loss fills global_batch_info (dp size, global token/sequence counts, loss_scale_factor) per step.
        batch_info = getattr(config, "global_batch_info", None) or {}
        loss = agg_loss(loss_mat=loss_mat, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **batch_info)
        # Our metric keys (README glossary) as 0-dim tensors: verl's Metric reads them, so no host sync here.
        metrics = dict(out.metrics)
        with torch.no_grad():
            # verl's own key and definition, so its dashboards keep their k1 mismatch curve.
            k1 = (old_log_prob - log_prob.detach()).clamp(-20.0, 20.0)
            metrics["actor/ppo_kl"] = masked_mean(k1, response_mask)
        return loss, metrics


def register(name: str, loss_name: str | None = None, **overrides: Any) -> str:
    """Register objective `name` (its preset, then `overrides`) as verl policy loss `loss_name` [tr_<name>]."""
    objective = get_objective(name, **overrides)
    reason = unsupported_reason(objective)
    if reason is not None:
        raise ValueError(f"objective '{name}' cannot run as a verl policy loss: {reason}")
    loss_name = loss_name or PREFIX + name
    existing = POLICY_LOSS_REGISTRY.get(loss_name)
    if existing is not None and not isinstance(existing, VerlPolicyLoss):
        raise ValueError(f"verl policy loss '{loss_name}' is one of verl's own; pick another name")
    register_policy_loss(loss_name)(VerlPolicyLoss(objective))
    return loss_name


def _register_presets() -> tuple[dict[str, str], dict[str, str]]:
    registered, skipped = {}, {}
    for name in OBJECTIVE_NAMES:
        reason = unsupported_reason(get_objective(name))
        if reason is None:
            registered[register(name)] = name
        else:
            skipped[name] = reason
    return registered, skipped


# verl loss name -> objective name, and objective name -> why it is not registered.
REGISTERED, SKIPPED = _register_presets()
