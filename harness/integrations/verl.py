"""verl adapter: importing this module registers our objectives as verl policy losses (verl 0.9), under `tr_` names.

Installed, this package's `verl.plugins` entry point (harness.integrations.verl_plugin) imports it in every process
that imports verl (driver and Ray workers), and makes verl's driver name the error if it fails;
`VERL_USE_EXTERNAL_MODULES=harness.integrations.verl` imports it directly. verl calls a policy loss as
    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights) -> (loss, metrics)
and this adapter maps old_log_prob -> behavior_logp (mu: the trust-region anchor and the importance weight's
denominator), log_prob -> logp, response_mask -> mask. Our objective gives the per-token loss; verl's own `agg_loss`
reduces it, so `actor.loss_agg_mode`, `actor.loss_scale_factor` and verl's global-batch normalisation apply
unchanged. With `algorithm.rollout_correction.rollout_rs` set, verl's rejection mask (verl's own function, on the
detached pi against mu, per micro-batch, as verl's bypass loss computes it) replaces response_mask for the objective
and `agg_loss`, so a rejected token trains nothing; decoupled-mode weights, were they passed, multiply the per-token
loss as in verl's built-in losses.

Names: each objective as `tr_<name>` only (`tr_dppo` is verl's `dppo_tv` objective), so verl's own names stay
verl's. Values come from verl's actor config, read as verl's built-in losses read them (harness.integrations.bounds
says which objective field each key sets); objectives with no such field (PG-IS, the penalties) keep their preset.
Every other setting that reaches the loss acts or is refused on the driver (harness.integrations.verl_checks).

mu must be the rollout engine's: verl's bypass mode (`algorithm.rollout_correction.bypass_mode=true` with
`actor_rollout_ref.rollout.calculate_log_probs=true`), checked in verl's validate_config, which main_ppo calls
before building anything. verl 0.9.1's legacy trainer rewrites loss_mode to `bypass_mode` in bypass mode on the
driver's config (verl-project/verl#4912), which this module undoes for our losses so a worker can never silently
train verl's instead. The first call logs the values used and runs the step-1 mismatch health check
(harness.health) on that micro-batch.

Not registered (SKIPPED says why for each):
- Top-K objectives: verl's loss call carries the sampled token's log-probs, not the top-K [B, T, K] ones.
- anchor=old objectives (the recompute ablations, MiniRL): they need mu and pi_old together, and verl passes one
  log-prob anchor (in its decoupled mode mu reaches the loss only folded into truncated IS weights).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import verl
from torch import Tensor
from verl.trainer.ppo import rollout_corr_helper
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, agg_loss, register_policy_loss
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_rejection_mask
from verl.utils import config as verl_config

from harness import health
from harness.integrations import verl_checks
from harness.integrations.versions import missing_parameters, require
from harness.objectives import OBJECTIVE_NAMES, Objective, get_objective
from harness.objectives.common import LOG_RATIO_CLAMP

log = logging.getLogger(__name__)

PREFIX = "tr_"
VERL_SUPPORTED = ((0, 9), (0, 9))  # tested with 0.9.1: the loss call, ppo_loss's config, the bypass rewrite
TESTED = "0.9.1"
# The calls this adapter makes, by the keywords it passes; a newer verl runs while they are all there.
LOSS_CALL = ("old_log_prob", "log_prob", "advantages", "response_mask", "loss_agg_mode", "config", "rollout_is_weights")
AGG_CALL = (
    "loss_mat",
    "loss_mask",
    "loss_agg_mode",
    "dp_size",
    "batch_num_tokens",
    "global_batch_size",
    "loss_scale_factor",
)
RS_CALL = ("log_ratio", "response_mask", "rollout_rs", "rollout_rs_threshold")
BYPASS_CALL = ("batch", "rollout_corr_config", "policy_loss_config")
# Our metrics under verl's names: k1 and k3 are verl's rollout_corr/kl and rollout_corr/k3_kl
# (rollout_corr_helper.compute_offpolicy_metrics: both of mu against the policy). actor/pg_clipfrac and
# actor/pg_clipfrac_lower are computed apart (verl counts over every response token, ours over those with A != 0).
VERL_NAMES = {"mismatch/k1": "rollout_corr/kl", "mismatch/k3": "rollout_corr/k3_kl"}
VERL_CAUSES = (
    "sampling settings that change what vLLM samples but not the log-probs it reports "
    "(actor_rollout_ref.rollout.top_p < 1 or top_k > 0)",
    "old_log_prob recomputed by the actor where the rollout's was meant (set "
    "algorithm.rollout_correction.bypass_mode=true and actor_rollout_ref.rollout.calculate_log_probs=true)",
    "a precision gap between the rollout engine and the actor (rollout dtype, FP8 rollout)",
)


def check_version(version: str) -> None:
    """One line when the installed verl is older than the tested range; one warning per process when newer."""
    why = "harness.integrations.verl relies on verl's policy-loss call and its bypass-mode rewrite"
    require("verl", version, VERL_SUPPORTED, TESTED, why, newer_runs=True)


def api_problems(
    loss_fn: Any = None, agg: Any = agg_loss, rejection: Any = compute_rollout_rejection_mask, bypass: Any = None
) -> list[str]:
    """What of the verl API this adapter calls is missing (loss_fn: verl's vanilla loss, whose parameters are
    the policy-loss call; bypass: rollout_corr_helper.apply_bypass_mode); [] for verl 0.9.1."""
    loss_fn = loss_fn or POLICY_LOSS_REGISTRY.get("vanilla")
    bypass = bypass or getattr(rollout_corr_helper, "apply_bypass_mode", None)
    calls = (
        ("the policy-loss call", loss_fn, LOSS_CALL),
        ("core_algos.agg_loss", agg, AGG_CALL),
        ("rollout_corr_helper.compute_rollout_rejection_mask", rejection, RS_CALL),
        ("rollout_corr_helper.apply_bypass_mode", bypass, BYPASS_CALL),
    )
    problems = []
    for what, fn, names in calls:
        if not callable(fn):
            problems.append(f"{what} is gone")
        elif missing := missing_parameters(fn, names):
            problems.append(f"{what} takes no {', '.join(missing)}")
    return problems


def check_api(version: str, problems: list[str]) -> None:
    if problems:
        raise ImportError(
            f"verl {version}: harness.integrations.verl cannot call it ({'; '.join(problems)}); "
            f"pip install 'verl=={TESTED}'"
        )


def unsupported_reason(objective: Objective) -> str | None:
    """Why verl's policy-loss call cannot feed `objective`, or None if it can."""
    if objective.cfg.needs_topk:
        return "it is a Top-K objective and verl's policy-loss call carries no top-K log-probs"
    if objective.needs_old:
        return "anchor=old needs mu and pi_old together and verl's policy-loss call carries one (old_log_prob)"
    return None


def rejection(config: Any, log_prob: Tensor, old_log_prob: Tensor, mask: Tensor) -> tuple[Tensor, dict[str, Any]]:
    """verl's rollout_rs rejection (rollout_correction handed to the actor config by verl_checks.check_job): the
    response mask with the rejected tokens off, and verl's rollout_corr/rollout_rs_* metrics; the mask unchanged
    when rollout_rs is unset."""
    policy_loss = getattr(config, "policy_loss", None)
    correction = getattr(policy_loss, "rollout_correction", None) if policy_loss is not None else None
    rs = correction.get("rollout_rs") if correction is not None else None
    if rs is None:
        return mask, {}
    with torch.no_grad():
        kept, metrics = compute_rollout_rejection_mask(
            log_ratio=log_prob.detach() - old_log_prob,
            response_mask=mask,
            rollout_rs=rs,
            rollout_rs_threshold=correction.get("rollout_rs_threshold"),
        )
    return kept, {f"rollout_corr/{k}": v for k, v in metrics.items()}


class VerlPolicyLoss:
    """One objective in verl's PolicyLossFn shape (verl calls it with keywords)."""

    def __init__(self, name: str, overrides: dict[str, Any], loss_name: str) -> None:
        self.objective = get_objective(name, **overrides)  # the preset and the registered overrides
        self.overrides, self.loss_name = overrides, loss_name
        self._resolved: dict[tuple, tuple[Objective, dict[str, Any]]] = {}
        self.first_call: dict[str, Any] | None = None  # what the first call used and saw (None until then)

    def resolve(self, config: Any) -> tuple[Objective, dict[str, Any]]:
        """The objective with verl's config values applied, and those values (built once per distinct set)."""
        values = {**self.overrides, **(verl_checks.values_from(self.objective, config) if config is not None else {})}
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
    ) -> tuple[Tensor, dict[str, Any]]:
        objective, values = self.resolve(config)
        mask, rs_metrics = rejection(config, log_prob, old_log_prob, response_mask)
        out = objective(logp=log_prob, behavior_logp=old_log_prob, advantages=advantages, mask=mask)
        loss_mat = out.loss_mat
        if rollout_is_weights is not None:
            # verl's decoupled-mode correction (pi_old / mu, detached); its built-in losses apply it the same way.
            loss_mat = loss_mat * rollout_is_weights
        # verl's ppo_loss fills global_batch_info (dp size, global token/sequence counts, loss_scale_factor) per step.
        batch_info = getattr(config, "global_batch_info", None) or {}
        loss = agg_loss(loss_mat=loss_mat, loss_mask=mask, loss_agg_mode=loss_agg_mode, **batch_info)
        metrics = self._metrics(objective, out.metrics, out.loss_mat, log_prob, old_log_prob, advantages, mask)
        metrics |= health.mismatch_estimates(log_prob, old_log_prob, response_mask)  # all the rollout's tokens
        metrics |= {verl_name: metrics[ours] for ours, verl_name in VERL_NAMES.items()} | rs_metrics
        if self.first_call is None:
            self._check_first_call(objective.name, values, old_log_prob, log_prob, response_mask, metrics)
        return loss, metrics

    @staticmethod
    def _metrics(
        objective: Objective,
        ours: dict[str, Tensor],
        loss_mat: Tensor,
        log_prob: Tensor,
        old_log_prob: Tensor,
        advantages: Tensor,
        mask: Tensor,
    ) -> dict[str, Tensor]:
        """The objective's metrics and verl's actor/* ones as 0-dim tensors (verl's Metric reads them, so no host
        sync here). verl's dppo_tv counts over every response token: pg_clipfrac the masked ones, pg_clipfrac_lower
        the kept ones whose ratio passed the cap. A kept token is one whose loss is not 0 (the masked surrogate's
        value is keep * min(r, C) * A), counted where A != 0."""
        with torch.no_grad():
            m = mask > 0
            signal = m & (advantages != 0)
            share = signal.sum() / m.sum().clamp(min=1)
            log_r = (log_prob.detach() - old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # as verl clamps it
            r = torch.exp(log_r)
            capped = signal & (loss_mat.detach() != 0) & (r > objective.cfg.is_cap)
            return ours | {
                "actor/pg_clipfrac": ours["objective/masked_frac"] * share,
                "actor/pg_clipfrac_lower": capped.sum() / m.sum().clamp(min=1),
                # verl's own key and definition (mean of mu - pi in log space), so its dashboards keep their curve.
                "actor/ppo_kl": torch.where(m, -log_r, 0.0).sum() / m.sum().clamp(min=1),
            }

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


def register(name: str, loss_name: str | None = None, **overrides: Any) -> str:
    """Register objective `name` (its preset, then `overrides`) as verl policy loss `loss_name` [tr_<name>], a
    `tr_` name. verl's config values still apply on top (harness.integrations.bounds); `overrides` set what verl
    has no key for (a penalty's beta)."""
    reason = unsupported_reason(get_objective(name, **overrides))
    if reason is not None:
        raise ValueError(f"objective '{name}' cannot run as a verl policy loss: {reason}")
    loss_name = loss_name or PREFIX + name
    if not loss_name.startswith(PREFIX):
        raise ValueError(f"verl policy loss '{loss_name}': our losses take '{PREFIX}' names; use '{PREFIX}{loss_name}'")
    existing = POLICY_LOSS_REGISTRY.get(loss_name)
    if existing is not None and not isinstance(existing, VerlPolicyLoss):
        raise ValueError(f"verl policy loss '{loss_name}' is one of verl's own; pick another name")
    register_policy_loss(loss_name)(VerlPolicyLoss(name, overrides, loss_name))
    return loss_name


def ours(loss_mode: str | None) -> VerlPolicyLoss | None:
    fn = POLICY_LOSS_REGISTRY.get(loss_mode) if loss_mode else None
    return fn if isinstance(fn, VerlPolicyLoss) else None


def check_config(config: Any) -> None:
    """verl's full job config (the driver's): refuse, in one line, what one of our losses cannot honour
    (harness.integrations.verl_checks); verl's own losses are not ours to judge."""
    loss_mode = config.actor_rollout_ref.actor.policy_loss.get("loss_mode")
    fn = ours(loss_mode)
    if fn is not None:
        verl_checks.check_job(config, loss_mode, fn.objective, fn.resolve)


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
        registered[register(name)] = name
    return registered, skipped


check_version(verl.__version__)
check_api(verl.__version__, api_problems())
# verl loss name -> objective name, and objective name -> why it is not registered.
REGISTERED, SKIPPED = _register_presets()
_install_driver_guards()
