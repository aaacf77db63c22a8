"""Config schemas for every Hydra group, validated before any model is loaded.

Each group's YAML (`conf/<group>/<option>.yaml`) holds values only; its fields and defaults live here. The
schemas are also registered in Hydra's ConfigStore (as `<group>_schema/<name>`, plain dicts generated from the
dataclass defaults) so that every field exists in the composed config and `group.key=value` overrides work
without `+`. Type and range checks are ours (`harness.schema.build`): one line naming the key and what is allowed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness.objectives import FAMILIES, ObjectiveConfig, objective_config
from harness.schema import build


class SetupError(ValueError):
    """A run cannot start (missing model or data, an option this machine cannot honour): one line for the user."""


@dataclass(frozen=True)
class ModelConfig:
    name: str = field(default="tiny", metadata={"help": "model preset (conf/model/<name>.yaml)"})
    path: str | None = field(
        default=None, metadata={"help": "hub id or local directory of a causal LM; null = build the tiny model"}
    )
    max_model_len: int = field(default=512, metadata={"ge": 16, "help": "prompt + response tokens (vLLM cache)"})
    dtype: Literal["float32", "bfloat16"] = field(
        default="float32",
        metadata={"help": "the trainer's weights (and optimizer state); bf16 compute comes from `precision`"},
    )
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "recompute activations in backward (long responses on real checkpoints)"}
    )
    architecture: dict[str, Any] | None = field(
        default=None,
        metadata={
            "help": "the checkpoint's config.json fields (model_type, sizes): meta-device checks and planning "
            "without a download; a run uses the checkpoint's own config"
        },
    )
    # LoRA (harness/lora.py, through peft): only the adapters train; the rollout engine gets merged weights.
    lora_rank: int = field(
        default=0, metadata={"ge": 0, "help": "LoRA rank r; 0 = full fine-tuning (DPPO Fig. 17: 32)"}
    )
    lora_alpha: float | None = field(
        default=None,
        metadata={"gt": 0, "help": "LoRA alpha (the update is alpha / r * B A); null = 2 x rank (Fig. 17: 64)"},
    )
    lora_dropout: float = field(default=0.0, metadata={"ge": 0, "lt": 1, "help": "dropout on the LoRA input"})
    lora_targets: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "module suffixes (q_proj, self_attn.o_proj) or fused MoE expert stacks (experts.gate_up_proj) "
            "to adapt; empty = every linear layer and expert stack of the decoder layers"
        },
    )
    # The tiny model (used when path is null): tiny-learnability.md's measured recipe.
    vocab_size: int = field(default=1000, metadata={"ge": 64, "help": "BPE vocabulary to train"})
    hidden_size: int = field(default=256, metadata={"ge": 8})
    num_layers: int = field(default=4, metadata={"ge": 1})
    num_heads: int = field(default=4, metadata={"ge": 1})
    num_kv_heads: int = field(default=2, metadata={"ge": 1})
    head_dim: int = field(default=64, metadata={"ge": 4})
    intermediate_size: int = field(default=512, metadata={"ge": 8})
    sft_steps: int = field(default=300, metadata={"ge": 0, "help": "supervised warm start steps"})
    sft_lr: float = field(default=1e-3, metadata={"gt": 0})
    sft_batch: int = field(default=64, metadata={"ge": 1})
    corpus_size: int = field(default=60000, metadata={"ge": 100, "help": "tokenizer training lines"})
    unused_tokens: int = field(
        default=0, metadata={"ge": 0, "help": "tokens added to the vocabulary that the task never uses (a tail)"}
    )
    init_seed: int = field(default=0, metadata={"ge": 0, "help": "seed of the tiny model's build (not the run's)"})
    cache_dir: str | None = field(default=None, metadata={"help": "where built models are cached; null = default"})


@dataclass(frozen=True)
class PrecisionConfig:
    name: Literal[
        "fp32", "bf16", "fp8_rollout", "fp8_e2e", "w8a8_rollout", "w4a4_rollout", "w3a8_rollout", "w4a4_rollout_bf16"
    ] = field(default="fp32", metadata={"help": "rollout copy and training precision (DESIGN.md precision table)"})


@dataclass(frozen=True)
class RolloutConfig:
    engine: Literal["vllm", "hf"] = field(default="vllm", metadata={"help": "who samples: vLLM or HF generate"})
    sync: Literal["rollout", "step"] = field(
        default="rollout", metadata={"help": "push trainer weights after every rollout or every optimizer step"}
    )
    temperature: float = field(default=1.0, metadata={"gt": 0, "help": "sampling temperature (papers: 1.0)"})
    behavior: Literal["engine", "trainer"] = field(
        default="engine",
        metadata={
            "help": "who supplies the behaviour log-probs mu: the rollout engine (the papers' anchor), or, with "
            "'trainer', the step's mu are recomputed by the trainer before the first update, so pi = mu at the "
            "first mini-batch (DPPO Fig. 3's 'No mismatch' reference)"
        },
    )
    logit_noise: float = field(
        default=0.0,
        metadata={
            "ge": 0,
            "help": "HF engine: sample from (and report mu of) logits + N(0, sigma^2) per vocabulary entry; a "
            "weight-independent training-inference mismatch of known size (0 = off)",
        },
    )
    max_topk: int = field(
        default=20, metadata={"ge": 1, "help": "most top-K log-probs the engine can return per token"}
    )
    kv_cache_gb: float = field(default=1.0, metadata={"gt": 0, "help": "vLLM CPU KV cache"})
    threads: int = field(
        default=1,
        metadata={"ge": 1, "help": "vLLM CPU threads while generating (it pins them; 1 is fastest on 2 cores)"},
    )
    enforce_eager: bool = field(default=True, metadata={"help": "vLLM without torch.compile (faster start on CPU)"})
    gpu_memory_utilization: float = field(default=0.4, metadata={"gt": 0, "le": 1, "help": "vLLM on GPU"})
    tensor_parallel_size: int = field(default=1, metadata={"ge": 1, "help": "vLLM on GPU: shard over this many GPUs"})
    sleep: bool = field(
        default=True,
        metadata={"help": "vLLM on GPU: free its memory (weights to CPU, KV cache dropped) while the trainer trains"},
    )


@dataclass(frozen=True)
class DataConfig:
    name: Literal["arith", "dapo_math", "math_lvl3to5", "ultrafeedback", "hh_rlhf"] = field(
        default="arith",
        metadata={"help": "training set; ultrafeedback / hh_rlhf are prompts for reward.kind=reward_model (RLHF)"},
    )
    path: str | None = field(
        default=None, metadata={"help": "every set but arith: local .jsonl/.parquet file or hub dataset name"}
    )
    split: str = field(default="train", metadata={"help": "hub dataset split (ignored for local files)"})
    levels: tuple[int, ...] = field(
        default=(3, 4, 5), metadata={"help": "math_lvl3to5: MATH difficulty levels kept (1-5)"}
    )
    dapo_instruction: Literal["strip", "keep"] = field(
        default="strip",
        metadata={
            "help": "dapo_math: drop DAPO's own 'Answer:' instruction from each problem (the template asks for "
            "\\boxed{}), or keep it, as verl's DAPO recipe does (then set reward.fallback_pattern)"
        },
    )
    template: Literal["chat", "plain", "qwen_math"] = field(default="chat", metadata={"help": "prompt template"})
    max_prompt_tokens: int | None = field(
        default=None,
        metadata={
            "ge": 1,
            "help": "drop training problems whose templated prompt is longer than this many tokens (DPPO Table 1: "
            "1024); null = keep all (model.max_model_len - trainer.max_new_tokens still bounds them)",
        },
    )
    kinds: tuple[str, ...] = field(
        default=("add", "mul", "add_mul"),
        metadata={"help": "arith problem kinds (equal shares): add, mul, add_mul, chain"},
    )
    add_max: int = field(default=99, metadata={"ge": 10, "help": "arith: largest 2-digit addend"})
    mul_max: int = field(default=99, metadata={"ge": 2, "help": "arith: largest factor (products <= 999)"})
    n_eval: int = field(default=600, metadata={"ge": 3, "help": "arith: held-out problems (balanced by kind)"})
    seed: int = field(default=0, metadata={"help": "arith: problem split seed"})
    pool_path: str | None = field(
        default=None,
        metadata={
            "help": "arith: a pass-rate file (python -m harness.loop.pass_rates); train only on problems whose "
            "warm-start pass rate lies in [pool_min, pool_max] (DPPO's sanity-style pool); null = every problem"
        },
    )
    pool_min: float = field(default=0.0, metadata={"ge": 0, "le": 1, "help": "arith pool: lowest pass rate kept"})
    pool_max: float = field(default=1.0, metadata={"ge": 0, "le": 1, "help": "arith pool: highest pass rate kept"})


@dataclass(frozen=True)
class BenchmarkConfig:
    name: Literal["arith", "aime24", "aime25", "aime24_25", "ultrafeedback", "hh_rlhf"] = field(
        default="arith",
        metadata={"help": "ultrafeedback / hh_rlhf: held-out prompts scored by the reward model (rm_score)"},
    )
    path: str | tuple[str, ...] | None = field(
        default=None,
        metadata={
            "help": "AIME: local .jsonl/.parquet file or hub dataset name (id/problem/answer); aime24_25: a list "
            "of two, 2024 first ([a,b], or the quoted string 'a,b'); ultrafeedback / hh_rlhf: one file or hub "
            "name of prompts (harness/tasks/rlhf.py layouts); arith: null (data's held-out arith split)"
        },
    )
    split: str = field(default="train", metadata={"help": "hub dataset split (ignored for local files)"})
    max_problems: int | None = field(default=None, metadata={"ge": 1, "help": "evaluate on the first N problems"})


@dataclass(frozen=True)
class LoggerConfig:
    name: Literal["wandb", "none"] = field(default="wandb")
    project: str = field(default="trust-region-harness")
    entity: str | None = field(default=None)
    mode: Literal["offline", "online", "disabled"] | None = field(
        default=None, metadata={"help": "null = $WANDB_MODE, else offline"}
    )
    init_timeout_s: float = field(default=20.0, metadata={"gt": 0, "help": "give up on W&B after this long"})


@dataclass(frozen=True)
class TrainerConfig:
    total_steps: int = field(default=500, metadata={"ge": 0, "help": "RL steps (one rollout each)"})
    prompts_per_step: int = field(default=32, metadata={"ge": 1})
    group_size: int = field(default=8, metadata={"ge": 2, "help": "samples per prompt (the advantage's group)"})
    max_new_tokens: int = field(default=24, metadata={"ge": 1, "help": "response length limit"})
    minibatches: int = field(
        default=4,
        metadata={"ge": 1, "help": "optimizer steps per rollout (the off-policy steps)"},
    )
    lr: float = field(default=1e-4, metadata={"gt": 0})
    beta1: float = field(default=0.9, metadata={"ge": 0, "lt": 1})
    beta2: float = field(default=0.99, metadata={"ge": 0, "lt": 1})
    weight_decay: float = field(default=0.0, metadata={"ge": 0})
    grad_clip: float = field(default=1.0, metadata={"gt": 0})
    advantage: Literal["drgrpo", "grpo", "rloo"] = field(default="drgrpo", metadata={"help": "advantage estimator"})
    horizon: int | None = field(
        default=None, metadata={"ge": 1, "help": "H of seq-mean-token-sum-norm; null = max_new_tokens"}
    )
    eval_every: int = field(default=100, metadata={"ge": 1, "help": "evaluate every N steps (and at 0 and the end)"})
    checkpoint_every: int = field(
        default=100,
        metadata={"ge": 0, "help": "checkpoint every N steps and at the end; 0 = never (throw-away runs: no resume)"},
    )
    resume: bool | Literal["auto"] = field(
        default=False,
        metadata={
            "help": "continue from the run directory's last checkpoint (with the run's own config); auto = continue "
            "if there is one, else start fresh (requeued jobs)"
        },
    )
    resume_allow: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "keys (or groups) a resume may change deliberately, e.g. [trainer.total_steps]; recorded in "
            "resume_changes.jsonl"
        },
    )
    threads: int | None = field(
        default=None, metadata={"ge": 1, "help": "torch threads; null = OMP_NUM_THREADS if set, else all cores"}
    )
    samples_per_eval: int = field(default=8, metadata={"ge": 0, "help": "completions kept in samples.jsonl"})
    max_bad_steps: int = field(
        default=3,
        metadata={
            "ge": 1,
            "help": "steps in a row with a skipped update (NaN/inf log-probs, loss or gradient) after which the run "
            "stops, failed, with a checkpoint of the last good weights",
        },
    )
    checkpoint_pause_s: float = field(
        default=0.0,
        metadata={"ge": 0, "help": "fault drills: pause inside each checkpoint write, before its rename"},
    )
    nan_at_steps: tuple[int, ...] = field(
        default=(),
        metadata={"help": "fault injection (tests, drills): every update of these steps gets a NaN loss"},
    )
    nan_logits_at_steps: tuple[int, ...] = field(
        default=(),
        metadata={"help": "fault injection (tests, drills): the model's logits are NaN in every update of these steps"},
    )
    save_batches: tuple[int, ...] = field(
        default=(),
        metadata={
            "help": "steps whose mini-batch objective inputs (pi, mu, pi_old, A, mask, entropy) are saved to "
            "batches/step_<k>.pt, for replaying every objective on the same tokens (python -m analysis.replay)"
        },
    )
    tokens_per_eval: int = field(
        default=2000,
        metadata={
            "ge": 0,
            "help": "response tokens (A != 0) of each evaluation step's first mini-batch kept in tokens.parquet",
        },
    )
    bad_update_gap: float = field(
        default=0.5,
        metadata={
            "ge": 0,
            "lt": 1,
            "help": "mismatch/bad_update_frac counts the A < 0 tokens whose mu - pi exceeds this probability gap "
            "(DPPO Fig. 5: 0.5)",
        },
    )


@dataclass(frozen=True)
class EvalConfig:
    n: int = field(default=1, metadata={"ge": 1, "help": "samples per problem (avg@n, pass@n, maj@n)"})
    engine: Literal["rollout", "policy"] = field(
        default="rollout",
        metadata={
            "help": "who samples the held-out evaluation: the rollout engine, with its precision and logit noise "
            "(as the papers evaluate), or 'policy': an HF engine holding the trainer's exact weights in fp32, with "
            "no quantisation or noise, so a mismatch dose never enters the score it is judged by"
        },
    )
    temperature: float = field(default=1.0, metadata={"gt": 0})
    top_p: float = field(
        default=1.0,
        metadata={"gt": 0, "le": 1, "help": "nucleus sampling for evaluation only (DPPO App. E: 0.95); 1 = off"},
    )
    max_new_tokens: int | None = field(default=None, metadata={"ge": 1, "help": "null = trainer.max_new_tokens"})
    truncate_prompts: bool | None = field(
        default=None,
        metadata={
            "help": "cut prompts longer than model.max_model_len - max_new_tokens from the left (else an error); "
            "null = only for the tiny model, whose 512-token context cannot hold AIME problems"
        },
    )

    def cut_prompts(self, tiny_model: bool) -> bool:
        """Whether evaluation left-truncates over-long prompts (`truncate_prompts`, null = tiny model only)."""
        return tiny_model if self.truncate_prompts is None else self.truncate_prompts


@dataclass(frozen=True)
class RewardConfig:
    kind: Literal["verify", "reward_model"] = field(
        default="verify",
        metadata={
            "help": "verify: math-verify against the gold answer; reward_model: a learned sequence-classification "
            "reward model scores (prompt, completion) (RLHF, DPPO Fig. 10)"
        },
    )
    model_path: str | None = field(
        default=None,
        metadata={
            "help": "reward_model: hub id or local folder of an AutoModelForSequenceClassification with one label "
            "(the paper's: Skywork/Skywork-Reward-Llama-3.1-8B), or tiny (a hand-set model on the policy's "
            "tokenizer whose score rises with the share of digit tokens; tests and CPU minis)"
        },
    )
    batch_size: int = field(default=8, metadata={"ge": 1, "help": "reward_model: sequences per forward"})
    max_length: int | None = field(
        default=None,
        metadata={"ge": 2, "help": "reward_model: longer inputs keep their last tokens; null = no limit"},
    )
    dtype: Literal["float32", "bfloat16"] = field(default="float32", metadata={"help": "reward_model: its weights"})
    scheme: Literal["binary", "signed"] = field(
        default="binary", metadata={"help": "verify: binary 1 correct / 0 otherwise; signed +1 / -1"}
    )
    fallback_pattern: str | None = field(
        default=None,
        metadata={
            "help": "regex graded when a completion has no \\boxed{} (group 1, else the match), e.g. "
            "'Answer:\\s*(.+)'; null = boxed answers only"
        },
    )
    timeout_s: float = field(default=5.0, metadata={"gt": 0, "help": "hard limit on grading one completion"})
    workers: int = field(
        default=0,
        metadata={
            "ge": 0,
            "help": "grading processes: 0 = one per core, 1 = in-process; integer answers skip math-verify and "
            "never start one",
        },
    )

    def grade_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `harness.rewards.grade` for this config."""
        return {
            "correct": 1.0,
            "wrong": -1.0 if self.scheme == "signed" else 0.0,
            "fallback_pattern": self.fallback_pattern,
            "timeout_s": self.timeout_s,
            "workers": self.workers,
        }


@dataclass(frozen=True)
class _TopLevel:
    seed: int = field(default=0, metadata={"ge": 0})
    name: str = field(default="default", metadata={"help": "experiment name: outputs/<name>/..., W&B group"})
    mode: Literal["train", "eval", "plan"] = field(
        default="train",
        metadata={
            "help": "train | eval | plan: print one `PLAN <json>` line with the job's overrides and resolved config, "
            "build nothing (python run.py -m +experiment=NAME mode=plan lists a sweep's jobs)"
        },
    )
    device: Literal["cpu", "cuda"] = "cpu"


@dataclass(frozen=True, kw_only=True)
class RunConfig(_TopLevel):
    """The whole composed config, validated; `objective` is the objective family's own schema."""

    model: ModelConfig
    precision: PrecisionConfig
    objective: ObjectiveConfig
    rollout: RolloutConfig
    data: DataConfig
    benchmark: BenchmarkConfig
    logger: LoggerConfig
    trainer: TrainerConfig
    eval: EvalConfig
    reward: RewardConfig


GROUPS: dict[str, type] = {
    "model": ModelConfig,
    "precision": PrecisionConfig,
    "rollout": RolloutConfig,
    "data": DataConfig,
    "benchmark": BenchmarkConfig,
    "logger": LoggerConfig,
    "trainer": TrainerConfig,
    "eval": EvalConfig,
    "reward": RewardConfig,
}
TOP_LEVEL = {f.name for f in dataclasses.fields(_TopLevel)}


def validate(cfg: dict[str, Any]) -> RunConfig:
    """A composed config (plain dict) -> RunConfig, or a ValueError naming the first bad key."""
    unknown = sorted(set(cfg) - set(GROUPS) - TOP_LEVEL - {"objective", "hydra", "experiment"})
    if unknown:
        raise ValueError(f"unknown top-level key '{unknown[0]}'; allowed: {', '.join(sorted([*GROUPS, *TOP_LEVEL]))}")
    groups = {g: build(schema, cfg.get(g) or {}, where=g) for g, schema in GROUPS.items()}
    obj = dict(cfg.get("objective") or {})
    name = obj.pop("name", None)
    if name is None:
        raise ValueError("objective: missing 'name'; choose one with objective=<name>")
    objective = objective_config(name, obj)
    top = {k: cfg[k] for k in TOP_LEVEL if k in cfg}
    run = RunConfig(**groups, objective=objective, **dataclasses.asdict(build(_TopLevel, top, where="config")))
    _check_combinations(run)
    return run


def _check_combinations(run: RunConfig) -> None:
    t = run.trainer
    batch = t.prompts_per_step * t.group_size
    if batch % t.minibatches:
        raise ValueError(
            f"trainer.minibatches: {t.minibatches} does not divide the batch of prompts_per_step * group_size = {batch}"
        )
    if run.objective.topk > run.rollout.max_topk:
        raise ValueError(
            f"rollout.max_topk: {run.rollout.max_topk} is smaller than objective.topk = {run.objective.topk} "
            f"({run.objective.name} needs K = {run.objective.topk} log-probs per token)"
        )
    if run.rollout.engine != "hf" and run.precision.name.startswith(("w8a8_", "w4a4_", "w3a8_")):
        raise ValueError(
            f"precision.name: {run.precision.name} quantises the rollout copy's activations, which only rollout=hf "
            "simulates; use rollout=hf"
        )
    if run.rollout.engine != "hf" and run.rollout.logit_noise > 0:
        raise ValueError("rollout.logit_noise: only rollout=hf adds logit noise; use rollout=hf or logit_noise=0")
    path = run.model.path
    if path is not None and path.startswith(("/", ".", "~")) and not Path(path).expanduser().exists():
        raise ValueError(
            f"model.path: {path!r} does not exist (give a local model folder, a run directory or a hub id)"
        )
    if run.precision.name == "fp8_e2e" and path is not None:
        from harness.precision import fp8_unwrappable_reason

        reason = fp8_unwrappable_reason(Path(path).expanduser())
        if reason:
            raise ValueError(
                f"precision.name: fp8_e2e quantizes the trainer's nn.Linear layers and {path!r} has none ({reason}); "
                "allowed with this model: fp32, bf16, fp8_rollout"
            )
    from harness.lora import check_lora_config

    check_lora_config(run.model, run.precision.name)
    if run.model.path is None and run.model.name != "tiny":
        raise ValueError(f"model.path: model '{run.model.name}' needs a hub id or local directory")
    _check_lengths(run)
    p = run.data.max_prompt_tokens
    if p is not None and p + t.max_new_tokens > run.model.max_model_len:
        raise ValueError(
            f"data.max_prompt_tokens: {p} + trainer.max_new_tokens {t.max_new_tokens} exceeds model.max_model_len "
            f"{run.model.max_model_len}; raise model.max_model_len to at least {p + t.max_new_tokens}"
        )
    if run.data.name != "arith" and run.data.path is None:
        raise ValueError(f"data.path: data={run.data.name} needs a local file or hub name")
    _check_data(run)
    _check_reward(run)


def _check_lengths(run: RunConfig) -> None:
    """Response lengths against the rollout's context, and that context against the model's own, read from its
    config.json without loading weights."""
    m = run.model
    context = model_context(m)
    if context is not None and m.max_model_len > context:
        raise ValueError(
            f"model.max_model_len: {m.max_model_len} exceeds the model's context of {context} positions "
            f"(max_position_embeddings in {m.path}); use at most {context}"
        )
    room = f"; raise model.max_model_len (the model's context is {context})" if context else ""
    for key, n in (
        ("trainer.max_new_tokens", run.trainer.max_new_tokens),
        ("eval.max_new_tokens", run.eval.max_new_tokens),
    ):
        if n is not None and n >= m.max_model_len:
            raise ValueError(
                f"{key}: {n} leaves no room for a prompt in model.max_model_len {m.max_model_len}; "
                f"use at most {m.max_model_len - 1}{room if context and context > m.max_model_len else ''}"
            )


def model_context(m: ModelConfig) -> int | None:
    """The model's position limit: the tiny model is built with model.max_model_len; a local folder or a hub id
    in the local cache says it in config.json (read as JSON: no weights, not even transformers' import). None
    when it cannot be read here (a hub id not cached, a run directory: checked where it is loaded)."""
    if m.path is None:
        return m.max_model_len
    path: Path | str | None = Path(m.path).expanduser() / "config.json"
    if not Path(path).is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            path = try_to_load_from_cache(m.path, "config.json")
        except ValueError:  # not a repo id
            path = None
    if not isinstance(path, str | Path):
        return None
    try:
        config = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    config = config.get("text_config") or config  # multimodal configs nest the language model's
    limit = config.get("max_position_embeddings")
    return limit if isinstance(limit, int) else None


def _check_reward(run: RunConfig) -> None:
    from harness.reward_model import check_reward_model_path
    from harness.tasks import RLHF_SETS

    r = run.reward
    if r.kind == "reward_model":
        if r.model_path is None:
            raise ValueError(
                "reward.model_path: reward.kind=reward_model needs a reward model (a hub id, a local folder, or tiny)"
            )
        check_reward_model_path(r.model_path)
        return
    if r.model_path is not None:
        raise ValueError(
            f"reward.model_path: set to {r.model_path!r} but reward.kind=verify grades with math-verify; "
            "set reward.kind=reward_model to score with it"
        )
    for key, name in (("data", run.data.name), ("benchmark", run.benchmark.name)):
        if name in RLHF_SETS:
            raise ValueError(
                f"reward.kind: {key}={name} holds prompts without answers, which math-verify cannot grade; "
                "use reward.kind=reward_model with reward.model_path"
            )


def _check_data(run: RunConfig) -> None:
    from harness.tasks import benchmark_sources

    b = run.benchmark
    if b.name == "arith" and b.path is not None:
        raise ValueError(f"benchmark.path: benchmark=arith is generated from data's arith config; got {b.path!r}")
    from harness.tasks.loaders import check_source

    sources = [("benchmark.path", s) for s in benchmark_sources(b)]  # the right number for the benchmark
    if run.data.name != "arith" and run.data.path is not None:
        sources.append(("data.path", run.data.path))
    for key, source in sources:
        try:
            check_source(source, key, read=True)
        except FileNotFoundError as e:
            raise ValueError(str(e)) from None
    pool = run.data.pool_path
    if pool is not None and not Path(pool).expanduser().is_file():
        raise ValueError(f"data.pool_path: {pool!r} does not exist (make one with python -m harness.loop.pass_rates)")
    if not run.data.levels or any(not 1 <= level <= 5 for level in run.data.levels):
        raise ValueError(f"data.levels: MATH levels are 1..5, got {list(run.data.levels)}")
    if run.reward.fallback_pattern is not None:
        try:
            re.compile(run.reward.fallback_pattern)
        except re.error as e:
            raise ValueError(
                f"reward.fallback_pattern: {run.reward.fallback_pattern!r} is not a valid regex: {e}"
            ) from None


DIRNAME_FIRST = ("objective", "precision", "seed", "model", "rollout", "data", "benchmark")


def safe_dirname(overrides: str, job_num: int | str = 0, limit: int = 120) -> str:
    """A sweep job's folder name from its overrides: the axes a researcher sweeps first, no path separators,
    and short enough for any filesystem (a long list keeps its head plus a hash of the whole)."""

    def rank(item: str) -> int:
        head = item.split("=", 1)[0].split(".", 1)[0]
        return DIRNAME_FIRST.index(head) if head in DIRNAME_FIRST else len(DIRNAME_FIRST)

    items = sorted(filter(None, overrides.split(",")), key=rank)  # stable: Hydra's order within a rank
    name = ",".join(items).replace("/", "_").replace("\\", "_") or f"job{job_num}"
    if len(name) > limit:
        name = f"{name[: limit - 9]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"
    return name


STAMP_FORMAT = "%Y-%m-%d_%H-%M-%S"


def run_stamp(fmt: str = STAMP_FORMAT) -> str:
    """The time in a run directory's name: now, or the one rank 0 of a torchrun run shared
    (`harness.cli.share_run_stamp`)."""
    return os.environ.get("HARNESS_RUN_STAMP") or time.strftime(fmt)


def register_schemas() -> None:
    """Put each schema's defaults into Hydra's ConfigStore so YAML options can extend them."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("safe_dirname"):
        OmegaConf.register_new_resolver("safe_dirname", safe_dirname)
    if not OmegaConf.has_resolver("run_stamp"):
        # Cached, as Hydra's own `now`: a sweep's directory is read again for every job and at the end, and Hydra
        # hands each job the launching config's resolver cache. Uncached, every job got a new second, so a sweep
        # scattered its jobs over several folders and its report counted none of them (exit code 0 on failures).
        OmegaConf.register_new_resolver("run_stamp", run_stamp, use_cache=True)

    cs = ConfigStore.instance()
    for group, schema in GROUPS.items():
        cs.store(group=f"{group}_schema", name=group, node=_defaults(schema))
    for family, (_, schema) in FAMILIES.items():
        cs.store(group="objective_schema", name=family, node=_defaults(schema))


def _defaults(schema: type) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(schema):
        value = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
# Hydra's compose API initialises one process-wide GlobalHydra: two threads inside `initialize_config_dir` at
# once fail ("already initialized"). The findings suite checks its runs' settings from its worker threads.
_COMPOSE_LOCK = threading.Lock()


def compose(*overrides: str, hydra_config: bool = False) -> dict[str, Any]:
    """The project's config composed with Hydra overrides, unresolved, outside `run.py` (tests, benchmarks, the
    findings suite's check of a run's recorded config, run.py's check of the command line's keys); with
    `hydra_config`, Hydra's own node too. Thread-safe."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    register_schemas()
    with _COMPOSE_LOCK, initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=list(overrides), return_hydra_config=hydra_config)
    return OmegaConf.to_container(cfg, resolve=False)
