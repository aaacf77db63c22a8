"""Train with one of our objectives through TRL's GRPOTrainer, every setting on the command line (TRL's TrlParser):

    python examples/trl/train_trust_region.py --model Qwen/Qwen3-1.7B-Base --train_file data.jsonl \
        --objective dppo --epsilon 0.15 --output_dir out --per_device_train_batch_size 8 --num_generations 8 \
        --max_completion_length 1024 [--use_vllm true]

`data.jsonl` holds one {"prompt": ..., "answer": ...} per line; the reward is 1 when the answer appears in the
completion. TrustRegionGRPOConfig is GRPOConfig carrying the objective, with defaults for the papers' setting:
loss_type 'dr_grpo' (the objectives' seq-mean-token-sum-norm over max_completion_length), epsilon 0.15 (DPPO's and
DRPO's delta; epsilon_high the upper side, delta the importance-weight cap), no KL, Dr.GRPO advantages, and TRL's
vLLM importance-sampling correction off (the objective's own weight already is pi/mu). A setting the objective
cannot honour is refused in one line before the model is built (docs/integrations.md).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from datasets import load_dataset
from trl import GRPOConfig, TrlParser

from harness.integrations.trl import TrustRegionGRPOTrainer
from harness.objectives import OBJECTIVE_NAMES


@dataclass
class TrustRegionGRPOConfig(GRPOConfig):
    """GRPOConfig with the objective; its bounds are GRPOConfig's own keys (epsilon, epsilon_high, delta)."""

    objective: str = field(default="dppo", metadata={"help": f"one of: {', '.join(OBJECTIVE_NAMES)}"})
    loss_type: str = field(default="dr_grpo", metadata={"help": "dr_grpo, grpo or bnpo: the aggregation mode"})
    epsilon: float = field(default=0.15, metadata={"help": "the objective's (lower) radius"})
    beta: float = field(default=0.0, metadata={"help": "0: the objectives carry no KL term (other values refused)"})
    scale_rewards: str = field(default="none", metadata={"help": "none: Dr.GRPO advantages, the papers' choice"})
    vllm_importance_sampling_correction: bool = field(
        default=False, metadata={"help": "False: the objective's weight is pi/mu already (True is refused)"}
    )


@dataclass
class Data:
    model: str = field(metadata={"help": "a model name or folder"})
    train_file: str = field(metadata={"help": "JSON lines with 'prompt' and 'answer'"})


def contains_answer(completions: list[str], answer: list[str], **_: Any) -> list[float]:
    return [float(a in c) for c, a in zip(completions, answer, strict=True)]


def main(argv: list[str] | None = None) -> TrustRegionGRPOTrainer:
    data, args = TrlParser((Data, TrustRegionGRPOConfig)).parse_args_into_dataclasses(argv)
    trainer = TrustRegionGRPOTrainer(
        model=data.model,
        reward_funcs=[contains_answer],
        args=args,
        train_dataset=load_dataset("json", data_files=data.train_file, split="train"),
        objective=args.objective,
    )
    trainer.train()
    return trainer


if __name__ == "__main__":
    main(sys.argv[1:])
