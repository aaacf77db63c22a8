"""Our objectives as the loss of TRL's GRPOTrainer (the `trl` extra: `pip install -e '.[trl]'`, TRL 1.16.0).

    from trl import GRPOConfig
    from harness.integrations.trl import TrustRegionGRPOTrainer

    trainer = TrustRegionGRPOTrainer(model=path, reward_funcs=[reward], train_dataset=data, objective="dppo",
                                     args=GRPOConfig(..., loss_type="dr_grpo", epsilon=0.15))
    # objective: a name in OBJECTIVE_NAMES (its bounds from GRPOConfig), or get_objective(name, **overrides)
    trainer.train()

TRL still generates, scores, computes advantages and batches; only `_compute_loss` is replaced. How one TRL
micro-batch maps onto the objective's tensors:

- logp: TRL's per-token log-probs of the completion under the model being trained (its fused LM head, on
  logits / temperature), with grad.
- behavior_logp (mu, the trust-region anchor): the sampler's own log-probs when TRL has them
  (`sampling_per_token_logps`: vLLM, which TRL runs with processed logprobs, or a rollout_func's). With HF
  generation the sampler is the policy as it was at generation time, so mu is TRL's recompute right after
  generation (`old_per_token_logps`). TRL skips that forward when the weights cannot have moved since generation
  (num_iterations=1 and each generation batch used within one optimizer step); mu is then logp itself, detached.
- old_logp (the anchor of the `*_recompute`/MiniRL ablations): `old_per_token_logps`, or logp detached when
  TRL skipped it for the same reason.
- advantages: TRL's per-sequence advantages broadcast over the completion tokens; mask: completion_mask (times
  tool_mask in multi-turn tool use; a truncated completion is all 0 under mask_truncated_completions).

The loss is `aggregate(loss_mat, mask, objective.agg, horizon)`, horizon = max_completion_length unless given,
divided by the gradient-accumulation steps as TRL's bnpo/dr_grpo losses are (each micro-batch counts 1/GA).
TRL's loss settings act on the objective or are refused, before any model is built (harness.integrations.
trl_config): epsilon, epsilon_high and delta are its bounds, loss_type its aggregation mode, and the vLLM
importance-sampling correction is refused (the objective's weight already is pi/mu). Settings that would add a term
this loss leaves out are refused in one line, as are `use_liger_kernel=True` (TRL's Liger path never calls
`_compute_loss`), vLLM sampling settings that bias mu (top_p < 1, top_k, min_p, repetition_penalty;
`allow_biased_sampling=True` accepts them) and a TRL outside the tested range (TRL_SUPPORTED). The objective's
metrics (objective/masked_frac, ...) are logged beside TRL's, and under TRL's names where TRL has one
(clip_ratio/region_mean, _low_mean, _high_mean).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
import trl
from torch import Tensor
from trl import GRPOConfig, GRPOTrainer

from harness import health
from harness.integrations import trl_config
from harness.integrations.versions import require
from harness.objectives import Objective, aggregate, get_objective

log = logging.getLogger(__name__)

# The extra forward inputs of TRL's multimodal models, passed on to its log-prob helper as its own loss does.
_FORWARD_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)


def anchors(inputs: Mapping[str, Any], logp: Tensor) -> tuple[Tensor, Tensor]:
    """(behavior_logp, old_logp) of one TRL micro-batch, as the module docstring maps them."""
    # TRL leaves old_per_token_logps out only when the weights have not moved since generation: it equals logp.
    old = inputs.get("old_per_token_logps")
    old = logp.detach() if old is None else old
    mu = inputs.get("sampling_per_token_logps")
    if mu is None:
        return old, old
    # TRL stores NaN for a token vLLM could not score; the trainer's recompute of it stands in there.
    return torch.where(torch.isnan(mu), old, mu), old


# TRL's GRPOTrainer internals this trainer relies on: `args.entropy_coef` (1.8) and the three values of
# `_get_per_token_logps_and_entropies` (1.7); tested at 1.8 and at 1.16, the version the extra pins.
TRL_SUPPORTED = ((1, 8), (1, 16))
TRL_CAUSES = (
    "GRPOConfig.top_p/top_k/min_p/repetition_penalty with use_vllm (vLLM reports log-probs of the unmodified "
    "distribution; allowed here by allow_biased_sampling=True)",
    "mu taken from TRL's recompute (old_per_token_logps) where the sampler's was meant",
    "a precision gap between the vLLM engine and the trainer (vllm dtype, bf16 against fp32)",
)
# TRL's metric names for the objective's own, logged beside ours so TRL dashboards keep working.
TRL_NAMES = {
    "objective/masked_frac": "clip_ratio/region_mean",
    "objective/masked_frac_pos": "clip_ratio/high_mean",
    "objective/masked_frac_neg": "clip_ratio/low_mean",
}


def check_version(version: str) -> None:
    """One line when the installed TRL is outside the range this trainer is tested with."""
    require("trl", version, TRL_SUPPORTED, "1.16.0", "TrustRegionGRPOTrainer replaces GRPOTrainer._compute_loss")


def biased_sampling(args: GRPOConfig) -> str | None:
    """The first sampling setting under which vLLM's reported log-probs are not those of the distribution it
    sampled from (huggingface/trl#6789), so mu is biased; None when there is none or vLLM is off."""
    if not getattr(args, "use_vllm", False):
        return None
    checks = (
        ("top_p", getattr(args, "top_p", 1.0) not in (None, 1.0)),
        ("top_k", getattr(args, "top_k", None) not in (None, 0, -1)),
        ("min_p", getattr(args, "min_p", None) not in (None, 0.0)),
        ("repetition_penalty", getattr(args, "repetition_penalty", 1.0) not in (None, 1.0)),
    )
    return next((key for key, bad in checks if bad), None)


def _check_sampling(args: GRPOConfig, allow_biased_sampling: bool) -> None:
    if getattr(args, "use_liger_kernel", False):
        raise ValueError(
            "GRPOConfig.use_liger_kernel: TrustRegionGRPOTrainer supports only False (with Liger, TRL's compute_loss "
            "never calls _compute_loss: TRL's own loss would train), got True"
        )
    bias = biased_sampling(args)
    if bias and not allow_biased_sampling:
        raise ValueError(
            f"GRPOConfig.{bias}={getattr(args, bias)!r} with use_vllm: vLLM reports log-probs of the unmodified "
            "distribution, so mu (the trust region's anchor) is biased; use the default, or pass "
            "allow_biased_sampling=True to TrustRegionGRPOTrainer to accept it"
        )


def _refused(args: GRPOConfig, aux_loss: bool) -> str | None:
    """The first GRPOConfig setting that would change the loss in a way this trainer does not reproduce."""
    checks = (
        ("beta", args.beta != 0.0, "0.0 (the objectives carry no KL-to-reference term)"),
        ("top_entropy_quantile", args.top_entropy_quantile < 1.0, "1.0 (no entropy-based token mask)"),
        ("off_policy_mask_threshold", args.off_policy_mask_threshold is not None, "None (the trust region masks)"),
        ("entropy_coef", args.entropy_coef != 0.0 or args.use_adaptive_entropy, "0.0 with use_adaptive_entropy off"),
        ("importance_sampling_level", args.importance_sampling_level != "token", "'token' (ratios are per token)"),
        ("router_aux_loss_coef", aux_loss, "0.0 (no MoE load-balancing term)"),
    )
    for key, bad, allowed in checks:
        if bad:
            value = getattr(args, key)
            return f"GRPOConfig.{key}: TrustRegionGRPOTrainer supports only {allowed}, got {value!r}"
    return None


class TrustRegionGRPOTrainer(GRPOTrainer):
    """A GRPOTrainer whose loss is one of our objectives; every other argument is GRPOTrainer's."""

    def __init__(
        self,
        *args: Any,
        objective: str | Objective = "dppo",
        horizon: int | None = None,
        allow_biased_sampling: bool = False,
        **kwargs: Any,
    ) -> None:
        check_version(trl.__version__)
        named = get_objective(objective) if isinstance(objective, str) else objective
        cfg = named.cfg
        if cfg.needs_topk or cfg.topk > 1:
            raise ValueError(
                f"objective '{named.name}' needs the rollout's top-{cfg.topk} log-probs, which TRL's "
                "GRPOTrainer does not pass to its loss (it keeps only the sampled token's); use a binary objective "
                "such as dppo or dppo_kl"
            )
        if horizon is not None and horizon <= 0:
            raise ValueError(
                f"horizon: must be a positive token count (the constant of seq-mean-token-sum-norm), got {horizon}"
            )
        given = kwargs.get("args", args[2] if len(args) > 2 else None)
        if given is None:
            raise ValueError(
                f"args: TrustRegionGRPOTrainer needs a GRPOConfig; TRL's default one (loss_type='dapo') has no "
                f"aggregation mode of objective {named.name}: pass args=GRPOConfig(..., loss_type='dr_grpo')"
            )
        # Before GRPOTrainer builds the model, starts an engine or asks for Liger.
        _check_sampling(given, allow_biased_sampling)
        refused = _refused(given, aux_loss=False)
        if refused:
            raise ValueError(refused)
        # Not `self.objective`: transformers' Trainer writes that attribute during hyper-parameter search.
        self.trust_region = trl_config.resolve(objective, given)
        super().__init__(*args, **kwargs)
        refused = _refused(self.args, self.aux_loss_enabled)
        if refused:
            raise ValueError(refused)
        _check_sampling(self.args, allow_biased_sampling)
        self.horizon = horizon or self.args.max_completion_length
        # What a reader needs to judge the mismatch numbers, and the step-1 health check (set at the first update).
        self.behavior = {
            "anchor": self.trust_region.cfg.anchor,
            "mu_from": "vllm" if getattr(self.args, "use_vllm", False) else "trl recompute at generation",
            "sampling": {k: getattr(self.args, k, None) for k in ("temperature", "top_p", "top_k", "min_p")},
        }
        self.health: dict[str, Any] | None = None

    def _compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any]) -> Tensor:
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        logp, entropy, _ = self._get_per_token_logps_and_entropies(
            model,
            torch.cat([prompt_ids, completion_ids], dim=1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1),
            completion_ids.size(1),
            compute_entropy=True,
            **{key: inputs.get(key) for key in _FORWARD_KEYS},
        )
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        behavior_logp, old_logp = anchors(inputs, logp)
        adv = inputs["advantages"]
        adv = (adv.unsqueeze(1) if adv.dim() == 1 else adv).expand_as(logp)
        out = self.trust_region(logp=logp, behavior_logp=behavior_logp, advantages=adv, mask=mask, old_logp=old_logp)
        loss = aggregate(out.loss_mat, mask, self.trust_region.cfg.agg, self.horizon)
        mode = "train" if self.model.training else "eval"
        if mode == "train":  # TRL sums the micro-batches' gradients over an accumulation window
            loss = loss / self.current_gradient_accumulation_steps
        metrics = {**out.metrics, **health.mismatch_estimates(logp, behavior_logp, mask)}
        if mode == "train" and self.health is None:
            self.check_health(metrics)
        self._log_objective(mode, metrics, entropy, mask)
        return loss

    def check_health(self, metrics: Mapping[str, Tensor]) -> None:
        """The step-1 mismatch health check (harness.health) on the first training micro-batch's mu against pi:
        recorded in `self.health`, and one warning line naming TRL's likely causes when a value passes its limit."""
        self.health, line = health.check({k: float(v) for k, v in metrics.items()}, causes=TRL_CAUSES)
        if line:
            log.warning("TrustRegionGRPOTrainer: %s", line)

    def _log_objective(self, mode: str, metrics: dict[str, Tensor], entropy: Tensor, mask: Tensor) -> None:
        """The objective's metrics and TRL's `entropy`, averaged over processes with one gather and one sync."""
        m = mask > 0
        keys = [*metrics, "entropy"]
        values = torch.stack([*(v.float() for v in metrics.values()), (entropy * m).sum() / m.sum().clamp(min=1)])
        for key, value in zip(keys, self.accelerator.gather(values.detach()[None]).mean(0).tolist(), strict=True):
            self._metrics[mode][key].append(value)
            if key in TRL_NAMES:
                self._metrics[mode][TRL_NAMES[key]].append(value)
