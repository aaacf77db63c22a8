"""Checks of how the rollout side combines with the rest of a run: the mismatch models (docs/mismatch.md) and the
rollout correction (docs/objectives.md §2.10), each where it means something. Called by `validate`."""

from __future__ import annotations

from typing import Any

# `run` is a harness.config.run.RunConfig, which imports this module: typed Any to keep the import graph acyclic.


def check_mismatch_models(run: Any) -> None:
    """The rollout-side mismatch models (docs/mismatch.md) where they mean something."""
    from harness.moe import check_moe
    from harness.precision import rollout_weight_format

    r, t = run.rollout, run.trainer
    if r.scale_refresh != 1 and rollout_weight_format(run.precision.name) is None:
        raise ValueError(
            f"rollout.scale_refresh: {r.scale_refresh} needs a precision that quantises the rollout copy's weights "
            f"(fp8_rollout, fp8_e2e, w8a8_rollout, w4a4_rollout, w3a8_rollout, w4a4_rollout_bf16); "
            f"precision={run.precision.name} does not. Use 1"
        )
    if r.sync_every > 1 and r.sync == "step":
        raise ValueError(f"rollout.sync_every: {r.sync_every} cannot be combined with rollout.sync=step; use 1")
    for key, value in (("rollout.sync_every", r.sync_every), ("rollout.scale_refresh", r.scale_refresh)):
        if value != 1 and t.max_staleness:
            raise ValueError(
                f"{key}: {value} cannot be combined with trainer.max_staleness={t.max_staleness} (the engine's process "
                "keeps no such state across a checkpoint); use 1"
            )
    for key, value in (("rollout.sync_every", r.sync_every), ("rollout.scale_refresh", r.scale_refresh)):
        if value != 1 and t.resume:
            raise ValueError(
                f"{key}: {value} keeps engine state (stale weights, old scales) that checkpoints do not carry, so "
                f"trainer.resume={t.resume} could not continue it exactly; use trainer.resume=false or {key}=1"
            )
    if r.truncates and r.engine != "hf" and r.mu == "full":
        raise ValueError(
            "rollout.mu: full (mu over the whole vocabulary under top_p/top_k/min_p) is recorded by rollout=hf only; "
            "vLLM's log-probs here are renormalised: use rollout=hf or rollout.mu=truncated"
        )
    check_moe(run.model, run.rollout)
    if r.truncates and r.mu == "truncated" and run.objective.topk > 1:
        raise ValueError(
            f"rollout.mu: truncated gives -inf to top-K tokens outside the kept set, which {run.objective.name} "
            f"(objective.topk {run.objective.topk}) cannot take; use rollout.mu=full or a Binary objective"
        )


def check_correction(run: Any) -> None:
    """The rollout correction composes with objectives anchored on pi_old, as verl composes it (objectives.md §2.10)."""
    c, o = run.correction, run.objective
    if not c.active:
        return
    if o.anchor != "old":
        raise ValueError(
            f"correction: {c.name} needs an objective anchored on pi_old (objective.anchor=old: minirl, "
            f"dppo_recompute, icepop, ...); {o.name} has anchor=behavior, whose ratio already is pi/mu. "
            "Use correction=none or objective.anchor=old"
        )
    if c.bypass_mode and o.family == "icepop":
        raise ValueError(
            f"correction.bypass_mode: {o.name} masks on k = pi_old/mu, which bypass (mu in pi_old's place) makes 1; "
            "use bypass_mode=false, or correction=bypass_ppo_clip with objective=minirl"
        )
    if c.loss_type == "reinforce" and o.family != "pg":
        raise ValueError(
            f"correction.loss_type: reinforce is verl's -A w log pi, the surrogate of objective family pg (pg_is, "
            f"pg_tis); {o.name} is family {o.family}. Use loss_type=ppo_clip or objective=pg_is"
        )
