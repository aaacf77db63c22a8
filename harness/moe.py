"""The tiny mixture-of-experts model, the router mismatch of such models, and router replay as its cure (issue 59,
model d; docs/mismatch_moe.md).

In an MoE layer a router picks each token's top-k experts. An inference engine and a trainer that compute the
router's logits with different kernels or precisions pick different experts for some tokens: ~10% of router
decisions differ between SGLang/vLLM and Megatron on Qwen3-30B-A3B, and 94% of tokens differ in at least one layer
(Megatron-LM #4168). A token routed differently gets a different probability, so this mismatch is a tail (few
tokens, large gaps) and depends on the state (how close the router's top-k and next expert are for this token),
not only on the weights' rounding. Rollout routing replay (R3: Ma et al. 2025, arXiv:2510.11370; trained with and
without in DPPO Fig. 8) removes it: the trainer routes every token to the experts the engine used, with gates from
its own router.

The model (`mixture`, `model=tiny_moe`) is the tiny Qwen3 of harness.models with every MLP a Qwen3-MoE block; the
tiny model's builder, tokenizer, warm start and cache serve both.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel, Qwen3Config

    from harness.config.groups import ModelConfig, RolloutConfig

EXPERT_COUNTS = (2, 3, 4)
MOE_FIELDS = ("num_experts", "experts_per_token")  # the tiny model config's (harness.models.TinyModelConfig)


class Experts(Protocol):
    """A tiny model's expert count and top-k (harness.models.TinyModelConfig)."""

    num_experts: int
    experts_per_token: int


# ---------------------------------------------------------------- the tiny mixture of experts


def mixture(dense: Qwen3Config, sizes: Experts) -> PreTrainedModel:
    """The tiny Qwen3 of `dense` with every MLP a mixture of `sizes.num_experts` experts (transformers'
    Qwen3-MoE), each intermediate_size / k wide so that a token's active MLP is the dense model's. Top-k routing
    (k = experts_per_token) gates the chosen experts by their router probabilities renormalised over them
    (Qwen3-MoE's norm_topk_prob); top-1 gates its expert by its probability as it is (Switch Transformer's rule):
    renormalised, it would always be 1 and the router would learn nothing."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    if problem := moe_problem(sizes.num_experts, sizes.experts_per_token):
        raise ValueError(f"tiny model: {problem}")
    k = sizes.experts_per_token
    shared = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "max_position_embeddings", "tie_word_embeddings", "bos_token_id",
              "eos_token_id", "pad_token_id")  # fmt: skip
    config = Qwen3MoeConfig(
        **{name: getattr(dense, name) for name in shared},
        moe_intermediate_size=max(1, dense.intermediate_size // k),
        num_experts=sizes.num_experts,
        num_experts_per_tok=k,
        norm_topk_prob=k > 1,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )
    return Qwen3MoeForCausalLM(config)


def warm_start_kwargs(model: torch.nn.Module) -> dict[str, Any]:
    """What a mixture of experts' supervised warm start adds to its forward: Qwen3-MoE's load-balancing loss (its
    default weight, 0.001), as real MoE models are trained. Without it the router may send every token to the same
    experts, and a router that never hesitates is one whose decisions no rounding can flip. Nothing for a dense
    model, whose warm start stays as it was."""
    return {"output_router_logits": True} if any(map(is_router, model.modules())) else {}


def recipe(cfg: Any) -> dict[str, Any]:
    """A tiny model config (a dataclass) as its cache key and build record hold it: a dense model's without
    MOE_FIELDS, as before they existed, so its folder and its build stay the same."""
    fields = dataclasses.asdict(cfg)
    if not fields.get("num_experts"):
        for name in MOE_FIELDS:
            fields.pop(name, None)
    return fields


def moe_problem(num_experts: int, experts_per_token: int) -> str | None:
    """What is wrong with a tiny model's expert count and top-k, as '<field>: <what is allowed>'; None if nothing."""
    counts = ", ".join(map(str, EXPERT_COUNTS))
    if num_experts not in (0, *EXPERT_COUNTS):
        return f"num_experts: {num_experts!r} is not allowed; use 0 (dense) or {counts} experts per layer"
    if num_experts == 0 and experts_per_token != 0:
        return f"experts_per_token: {experts_per_token} needs num_experts {counts} (a dense model has no router); use 0"
    if num_experts and not 1 <= experts_per_token < num_experts:
        return (
            f"experts_per_token: {experts_per_token} is not allowed with num_experts {num_experts}; "
            f"use 1 to {num_experts - 1} (top-k routing over fewer experts than there are)"
        )
    return None


def is_router(module: torch.nn.Module) -> bool:
    """A top-k router whose forward returns (logits, gates, expert ids): Qwen3-MoE's (the tiny MoE's)."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    return isinstance(module, Qwen3MoeTopKRouter)


# ---------------------------------------------------------------- configuration


def check_moe(m: ModelConfig, r: RolloutConfig) -> None:
    """The MoE keys where they mean something, in one line each, before any model is built (`r`: the rollout's)."""
    if problem := moe_problem(m.num_experts, m.experts_per_token):
        raise ValueError(f"model.{problem}")
    if m.num_experts and m.path is not None:
        raise ValueError(
            f"model.num_experts: {m.num_experts} builds the tiny mixture of experts; model.path={m.path!r} is a "
            "checkpoint of its own: use model.num_experts=0 (and model.experts_per_token=0)"
        )
    if m.name == "tiny_moe" and not m.num_experts:
        raise ValueError("model.num_experts: model=tiny_moe needs 2, 3 or 4 experts per layer")
