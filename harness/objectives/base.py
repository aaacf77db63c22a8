"""The fields every objective's config shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

AggMode = Literal["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


@dataclass(frozen=True)
class ObjectiveConfig:
    name: str = field(
        default="", metadata={"help": "preset name: a conf/objective/<name>.yaml stem (harness/objectives/presets/)"}
    )
    family: str = field(default="", metadata={"help": "implementation family (set by the preset YAML)"})
    anchor: Literal["behavior", "old"] = field(
        default="behavior",
        metadata={
            "help": "reference of the trust region: 'behavior' = the rollout engine's mu (the papers' choice, "
            "DPPO Takeaway 2), 'old' = the trainer's recompute pi_old (the 'recompute' ablations). The importance "
            "weight is always pi/mu."
        },
    )
    is_cap: float = field(
        default=1e4,
        metadata={"gt": 0, "help": "truncate the importance weight at C (TIS); 1e4 = none (objectives.md P3)"},
    )
    topk: int = field(
        default=1, metadata={"ge": 1, "help": "top-K log-probs per token the rollout must return (K; 1 = sampled only)"}
    )
    agg: AggMode = field(
        default="seq-mean-token-sum-norm",
        metadata={"help": "loss aggregation, applied once by the trainer (Dr.GRPO's mode is the papers' choice)"},
    )

    @property
    def needs_old(self) -> bool:
        return self.anchor == "old"

    @property
    def needs_topk(self) -> bool:
        return False
