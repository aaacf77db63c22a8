"""The config groups' schemas (model, precision, rollout, data, benchmark, logger): fields, defaults, ranges.

Each group's YAML (`conf/<group>/<option>.yaml`) holds values only; its fields and defaults live here and in
`harness.config.run`. Type and range checks are ours (`harness.schema.build`): one line naming the key and what is
allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


class SetupError(ValueError):
    """A run cannot start (missing model or data, an option this machine cannot honour): one line for the user."""


@dataclass(frozen=True)
class ModelConfig:
    name: str = field(default="tiny", metadata={"help": "model preset (conf/model/<name>.yaml)"})
    path: str | None = field(
        default=None, metadata={"help": "hub id or local directory of a causal LM; null = build the tiny model"}
    )
    build: str | None = field(
        default=None,
        metadata={
            "help": "the command that builds model.path on this machine (model=smollm2_135m: make real-model), "
            "named when the folder is missing"
        },
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
    num_experts: int = field(
        default=0, metadata={"help": "tiny model: 0 = dense; 2, 3 or 4 = a mixture of experts per layer (tiny_moe)"}
    )
    experts_per_token: int = field(
        default=0, metadata={"help": "tiny mixture of experts: top-k routing, 1 <= k < num_experts (0 when dense)"}
    )
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
        default="engine", metadata={"help": "who supplies mu; 'trainer': pi = mu at the first update (DPPO Fig. 3)"}
    )
    logit_noise: float = field(
        default=0.0,
        metadata={
            "ge": 0,
            "help": "HF engine: sample from (and report mu of) logits + N(0, sigma^2) per vocabulary entry; a "
            "weight-independent training-inference mismatch of known size (0 = off)",
        },
    )
    sync_every: int = field(
        default=1, metadata={"ge": 1, "help": "the engine takes the trainer's weights after every k-th step (stale)"}
    )
    scale_refresh: int = field(
        default=1,
        metadata={
            "ge": 0,
            "help": "quantised copies: weight scales set at the first sync, refreshed every k syncs (0 = never)",
        },
    )
    top_p: float = field(default=1.0, metadata={"gt": 0, "le": 1, "help": "training rollouts: nucleus sampling"})
    top_k: int = field(default=0, metadata={"ge": 0, "help": "training rollouts: sample among the k likeliest (0 off)"})
    min_p: float = field(
        default=0.0, metadata={"ge": 0, "lt": 1, "help": "training rollouts: drop tokens below min_p x the top one"}
    )
    mu: Literal["full", "truncated"] = field(
        default="full",
        metadata={
            "help": "under top_p/top_k/min_p: mu over the whole vocabulary (vLLM's and TRL's default) or "
            "renormalised over the kept tokens (the sampled distribution: the cure)"
        },
    )
    router_precision: Literal["fp32", "bf16", "fp8"] = field(
        default="fp32",
        metadata={
            "help": "MoE models, rollout=hf: the engine's routers compute their logits (gate weight and input) in "
            "this precision, the trainer's stay fp32, so some top-k routes differ (fp32 = off; docs/mismatch_moe.md)"
        },
    )
    router_replay: bool = field(
        default=False,
        metadata={
            "help": "MoE models, rollout=hf: the trainer's forwards use the experts the engine routed each token to "
            "(R3, rollout routing replay), gated by its own router renormalised over them"
        },
    )
    max_topk: int = field(
        default=20, metadata={"ge": 1, "help": "most top-K log-probs the engine can return per token"}
    )
    kv_cache_gb: float = field(default=1.0, metadata={"gt": 0, "help": "vLLM CPU KV cache"})
    threads: int = field(
        default=1,
        metadata={
            "free": True,
            "ge": 1,
            "help": "vLLM CPU threads while generating (it pins them; 1 is fastest on 2 cores)",
        },
    )
    enforce_eager: bool = field(default=True, metadata={"help": "vLLM without torch.compile (faster start on CPU)"})
    gpu_memory_utilization: float = field(default=0.4, metadata={"gt": 0, "le": 1, "help": "vLLM on GPU"})
    tensor_parallel_size: int = field(default=1, metadata={"ge": 1, "help": "vLLM on GPU: shard over this many GPUs"})
    sleep: bool = field(
        default=True,
        metadata={"help": "vLLM on GPU: free its memory (weights to CPU, KV cache dropped) while the trainer trains"},
    )

    @property
    def truncates(self) -> bool:
        """Training rollouts sample from a truncated distribution (top_p, top_k or min_p set)."""
        return self.top_p < 1 or self.top_k > 0 or self.min_p > 0


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
    template: Literal["chat", "plain", "qwen_math", "chat_boxed"] = field(
        default="chat",
        metadata={"help": "prompt template; chat_boxed: chat with 'Put your final answer within \\boxed{}.' appended"},
    )
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
    log_model: bool = field(
        default=True, metadata={"help": "policy/final as a W&B model artifact (offline: sent by wandb sync)"}
    )
