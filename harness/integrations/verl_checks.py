"""What verl's job config asks of one of our losses, judged on the driver before verl builds anything: every setting
that reaches the loss either acts or is refused here in one line naming the key, the objective and what to set.

verl's wrapped `validate_config` (harness.integrations.verl) calls `check_job`, which main_ppo runs before Ray
starts. Settings and what they do with our objectives (docs/integrations.md has the table):
- actor clip keys: read as the bounds of `harness.integrations.bounds`; a clip key the objective does not read
  (PG-IS has no bound, DRPO one radius, DPPO's clip_ratio while clip_ratio_low/high are set), changed from verl's
  default, is refused. So are the keys only verl's other losses read (policy_loss.clip_cov_*, kl_cov_ratio,
  ppo_kl_coef, dro_beta; tau_pos, tau_neg).
- algorithm.rollout_correction: bypass mode is required (mu is the rollout's); `rollout_rs` acts, in the loss, as
  in verl's bypass loss (its rejection mask drops tokens from the loss and its mask), so it is handed to the
  workers here; `rollout_is` is refused (the objective's weight already is pi/mu; verl's bypass PPO-clip also
  leaves its weight out); `loss_type` other than ppo_clip is refused (the objective is the loss).
- actor.entropy_coeff != 0 and actor.use_kl_loss add a term to the loss (verl's ppo_loss); refused unless the
  job opts in with `+trust_region.extra_terms=[entropy,kl]`, each message stating the loss that would train.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from harness.integrations.bounds import bound_sides
from harness.objectives import Objective

LOSS = "actor_rollout_ref.actor.policy_loss.loss_mode"
ACTOR = "actor_rollout_ref.actor"
CORRECTION = "algorithm.rollout_correction"
OPT_IN = "trust_region.extra_terms"
TERMS = ("entropy", "kl")
# Keys of verl's actor config that only verl's own losses read (clip-cov, kl-cov, DRO, SAPO).
OTHER_LOSSES = (
    "policy_loss.clip_cov_ratio",
    "policy_loss.clip_cov_lb",
    "policy_loss.clip_cov_ub",
    "policy_loss.kl_cov_ratio",
    "policy_loss.ppo_kl_coef",
    "policy_loss.dro_beta",
    "tau_pos",
    "tau_neg",
)
CLIP_KEYS = ("clip_ratio", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c")


@functools.cache
def verl_defaults() -> DictConfig:
    """verl's own actor defaults (verl/trainer/config/actor/actor.yaml), the reference for "changed"."""
    import verl

    return OmegaConf.load(os.path.join(os.path.dirname(verl.__file__), "trainer", "config", "actor", "actor.yaml"))


def _get(node: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict | DictConfig) else getattr(node, part, None)
        if node is None:
            return None
    return node


def values_from(objective: Objective, actor: Any) -> dict[str, float]:
    """The objective's fields that verl's actor config sets, read as verl's built-in losses read them."""

    def side_value(side: str) -> float:
        if side == "one":
            return float(actor.clip_ratio)
        if side == "cap":
            return float(actor.clip_ratio_c)
        value = getattr(actor, f"clip_ratio_{side}", None)
        return float(actor.clip_ratio if value is None else value)

    return {name: side_value(side) for name, side in bound_sides(objective).items()}


def read_keys(objective: Objective, actor: Any) -> set[str]:
    """The actor clip keys `values_from` reads for `objective` under this config."""
    keys = set()
    for side in bound_sides(objective).values():
        if side in ("low", "high"):
            keys.add(f"clip_ratio_{side}")
            keys |= {"clip_ratio"} if getattr(actor, f"clip_ratio_{side}", None) is None else set()
        else:
            keys.add("clip_ratio" if side == "one" else "clip_ratio_c")
    return keys


def _unread(objective: Objective, actor: Any) -> str | None:
    """The first clip key, or key of verl's other losses, that the job changed from verl's default and that
    nothing reads for `objective`, as the line that refuses it."""
    defaults = verl_defaults()
    read = read_keys(objective, actor)
    name = objective.name
    for key in CLIP_KEYS:
        value = getattr(actor, key, None)
        if key not in read and value != defaults.get(key):
            fields = ", ".join(f"{f} from {k}" for f, k in _sources(objective, actor).items()) or "no bound verl sets"
            return (
                f"{ACTOR}.{key}={value}: objective {name} does not read it ({fields}); leave it at verl's default "
                f"{defaults.get(key)}"
            )
    for key in OTHER_LOSSES:
        value, default = _get(actor, key), _get(defaults, key)
        if value != default:
            return f"{ACTOR}.{key}={value}: only verl's own losses read it, not objective {name}; leave it at {default}"
    return None


def _sources(objective: Objective, actor: Any) -> dict[str, str]:
    out = {}
    for field, side in bound_sides(objective).items():
        if side in ("low", "high"):
            key = f"clip_ratio_{side}"
            out[field] = key if getattr(actor, key, None) is not None else "clip_ratio"
        else:
            out[field] = "clip_ratio" if side == "one" else "clip_ratio_c"
    return out


def _correction(config: Any, loss_mode: str, name: str) -> str | None:
    correction = config.algorithm.get("rollout_correction") or {}
    rollout = config.actor_rollout_ref.rollout
    missing = [
        key
        for key, on in (
            (f"{CORRECTION}.bypass_mode", correction.get("bypass_mode", False)),
            ("actor_rollout_ref.rollout.calculate_log_probs", rollout.get("calculate_log_probs")),
        )
        if not on
    ]
    if missing:
        return (
            f"{LOSS}={loss_mode}: this objective's trust region is anchored on the rollout's log-probs mu, which "
            f"verl passes only in bypass mode; set {'=true and '.join(missing)}=true (otherwise old_log_prob is the "
            "actor's recompute)"
        )
    if correction.get("rollout_is") is not None:
        return (
            f"{CORRECTION}.rollout_is={correction.get('rollout_is')}: objective {name} already weights each token "
            "by pi/mu (bypass mode: mu is the rollout's), so verl's weight would count it twice (verl's bypass "
            "ppo_clip leaves it out too); set rollout_is=null"
        )
    if correction.get("loss_type", "ppo_clip") != "ppo_clip":
        return (
            f"{CORRECTION}.loss_type={correction.get('loss_type')}: it picks verl's own bypass loss, and {LOSS}="
            f"{loss_mode} trains objective {name} instead; set loss_type=ppo_clip"
        )
    if correction.get("rollout_rs") is not None:
        return _rejection(correction)
    return None


def _rejection(correction: Any) -> str | None:
    """verl's own parser on the rejection options, run here so a bad one stops the driver, not a worker."""
    import torch
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_rejection_mask

    rs, threshold = correction.get("rollout_rs"), correction.get("rollout_rs_threshold")
    try:
        compute_rollout_rejection_mask(
            log_ratio=torch.zeros(1, 1),
            response_mask=torch.ones(1, 1, dtype=torch.bool),
            rollout_rs=rs,
            rollout_rs_threshold=threshold,
        )
    except (ValueError, TypeError) as e:
        return f"{CORRECTION}.rollout_rs={rs} rollout_rs_threshold={threshold}: verl refuses it: {e}"
    return None


def _extra_terms(config: Any, name: str) -> str | None:
    actor = config.actor_rollout_ref.actor
    allowed = _get(config, OPT_IN) or []
    allowed = [allowed] if isinstance(allowed, str) else list(allowed)
    unknown = [t for t in allowed if t not in TERMS]
    if unknown:
        return f"{OPT_IN}={allowed}: {unknown[0]!r} is not one of {', '.join(TERMS)}"
    coeff = actor.get("entropy_coeff", 0) or 0
    if coeff != 0 and "entropy" not in allowed:
        return (
            f"{ACTOR}.entropy_coeff={coeff}: verl's ppo_loss would train loss = {name} - {coeff} * entropy "
            f"(aggregated by loss_agg_mode), a term objective {name} does not have; set it to 0, or opt in with "
            f"+{OPT_IN}=[entropy]"
        )
    if actor.get("use_kl_loss") and "kl" not in allowed:
        coef, kind = actor.get("kl_loss_coef"), actor.get("kl_loss_type")
        return (
            f"{ACTOR}.use_kl_loss=true: verl's ppo_loss would train loss = {name} + {coef} * KL_{kind}(pi, ref) "
            f"(aggregated by loss_agg_mode), a term objective {name} does not have; set it to false, or opt in "
            f"with +{OPT_IN}=[kl]"
        )
    return None


def check_job(
    config: Any, loss_mode: str, objective: Objective, resolve: Callable[[Any], tuple[Objective, dict[str, Any]]]
) -> None:
    """Refuse in one line what `objective` (registered as `loss_mode`, whose `resolve` applies an actor config's
    values) cannot honour under verl's job `config`; then hand algorithm.rollout_correction to the workers' actor
    config, where the loss reads rollout_rs."""
    actor = config.actor_rollout_ref.actor
    name = objective.name
    line = _correction(config, loss_mode, name) or _extra_terms(config, name) or _unread(objective, actor)
    if line is None:
        try:
            resolve(actor)
        except ValueError as e:
            sources = _sources(objective, actor)
            given = ", ".join(f"{ACTOR}.{key}={getattr(actor, key)}" for key in dict.fromkeys(sources.values()))
            line = f"{given}: objective {name} cannot take them: {e}"
    if line is not None:
        raise ValueError(line)
    with open_dict(config):
        actor.policy_loss.rollout_correction = config.algorithm.get("rollout_correction")
