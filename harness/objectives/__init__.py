"""Trust-region objectives for LLM RL as pure, registered functions (spec: the objectives page, docs/objectives.md).

from harness.objectives import get_objective, aggregate, OBJECTIVE_NAMES
obj = get_objective("dppo", delta=0.2)
out = obj(logp=..., behavior_logp=..., advantages=..., mask=...)
loss = aggregate(out.loss_mat, mask, mode="seq-mean-token-sum-norm", horizon=max_response_tokens)
"""

from harness.objectives.aggregate import AGG_MODES, aggregate, aggregate_denominator
from harness.objectives.base import ObjectiveConfig
from harness.objectives.common import ObjectiveOutput
from harness.objectives.correction import Correction, CorrectionConfig, rollout_correction
from harness.objectives.registry import (
    FAMILIES,
    OBJECTIVE_NAMES,
    Objective,
    get_objective,
    objective_config,
    objective_from_config,
)

__all__ = [
    "AGG_MODES",
    "Correction",
    "CorrectionConfig",
    "FAMILIES",
    "OBJECTIVE_NAMES",
    "Objective",
    "ObjectiveConfig",
    "ObjectiveOutput",
    "aggregate",
    "aggregate_denominator",
    "get_objective",
    "objective_config",
    "objective_from_config",
    "rollout_correction",
]
