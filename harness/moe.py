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

All of it happens in one forward hook per router (`Routers`), so the model's own forward stays as transformers
wrote it:
- precision (the engine's, `rollout.router_precision`): the router's logits recomputed from its input and weight
  in bf16, or in e4m3 with per-token and per-expert scales (harness.quant), the product rounded to bf16 as a
  low-precision GEMM's output is;
- recording (the engine's, in every `generate`): the experts each token went to, per layer;
- given routes (the trainer's, in every forward of a batch that carries them): the share of decisions where the
  trainer's own router chose other experts, and with replay (`rollout.router_replay`) those experts used instead
  of its own, gated by its softmax renormalised over them (as Qwen3-MoE's norm_topk_prob gates its own top-k).

Routes are int16 tensors [..., L, k] (L = MoE layers, k = experts per token), the expert ids of each token in each
layer; -1 where none was recorded (padding, a sequence's last token, which no forward reads), where a router routes
by itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from harness.quant import quantize_dequantize

if TYPE_CHECKING:
    from transformers import PreTrainedModel, Qwen3Config

    from harness.config.groups import ModelConfig, RolloutConfig

ROUTER_PRECISIONS = ("fp32", "bf16", "fp8")
EXPERT_COUNTS = (2, 3, 4)
MOE_FIELDS = ("num_experts", "experts_per_token")  # the tiny model config's (harness.models.TinyModelConfig)
NONE = -1  # no route recorded for this token: its router routes by itself


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


# ---------------------------------------------------------------- the routers


def is_router(module: torch.nn.Module) -> bool:
    """A top-k router whose forward returns (logits, gates, expert ids): Qwen3-MoE's (the tiny MoE's)."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    return isinstance(module, Qwen3MoeTopKRouter)


class Routers:
    """A model's MoE routers, hooked once (`routers`): what they compute (precision), record and replay."""

    def __init__(self, model: torch.nn.Module, precision: str = "fp32") -> None:
        if precision not in ROUTER_PRECISIONS:
            allowed = ", ".join(ROUTER_PRECISIONS)
            raise ValueError(f"rollout.router_precision: unknown {precision!r}; allowed: {allowed}")
        self.modules = [m for m in model.modules() if is_router(m)]
        self.precision = precision
        self.top_k = self.modules[0].top_k if self.modules else 0
        self._recorded: list[list[Tensor]] | None = None
        self._given: Tensor | None = None  # [N, L, k] for the forward running now
        self._replay = False
        self._differ: list[Tensor] = []  # per layer, [N] bool: the own router chose other experts than given
        self.last: dict[str, float] = {}
        for layer, module in enumerate(self.modules):
            module.register_forward_hook(functools.partial(self._hook, layer))

    @property
    def layers(self) -> int:
        return len(self.modules)

    # --- engine side ---
    @contextlib.contextmanager
    def recording(self) -> Iterator[list[list[Tensor]]]:
        """Every router call inside appends its tokens' experts to its layer's list (a prefill: [B * P, k], then a
        decoding step: [B, k] per call)."""
        self._recorded = [[] for _ in self.modules]
        try:
            yield self._recorded
        finally:
            self._recorded = None

    # --- trainer side ---
    @contextlib.contextmanager
    def given(self, routes: Tensor, replay: bool) -> Iterator[None]:
        """One forward whose tokens (flattened as the MoE blocks flatten them: [N, L, k]) come with the engine's
        routes: their disagreement with the own router is measured (`last`), and with `replay` they are used."""
        if routes.shape[1:] != (self.layers, self.top_k):
            raise ValueError(
                f"router replay: routes of shape {tuple(routes.shape)} do not fit a model of {self.layers} MoE layers "
                f"with top-{self.top_k} routing"
            )
        self._given, self._replay, self._differ = routes, replay, []
        try:
            yield
        finally:
            self.last = self._metrics(routes)
            self._given, self._replay, self._differ = None, False, []

    def _metrics(self, routes: Tensor) -> dict[str, float]:
        has = routes[:, 0, 0] >= 0
        n = int(has.sum())
        if not n or len(self._differ) != self.layers:
            return {}
        differ = torch.stack(self._differ, dim=1)[has.to(self._differ[0].device)]  # [n, L]
        return {
            "mismatch/route_diff_frac": float(differ.float().mean()),
            "mismatch/route_diff_token_frac": float(differ.any(dim=1).float().mean()),
        }

    # --- the hook ---
    def _hook(self, layer: int, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        logits, gates, experts = output
        if self.precision != "fp32":
            x = args[0].reshape(-1, module.weight.shape[1])
            logits = rounded_logits(x, module.weight, self.precision).to(logits.dtype)
            gates, experts = top_k_gates(logits, module.top_k, module.norm_topk_prob)
        if self._given is not None:
            given = self._given[:, layer].to(experts.device)
            if given.shape[0] != experts.shape[0]:
                raise ValueError(
                    f"router replay: {given.shape[0]} routes given for a forward of {experts.shape[0]} tokens"
                )
            has = given[:, 0] >= 0
            own, used = experts.sort(dim=-1).values, given.to(experts.dtype).sort(dim=-1).values
            self._differ.append(((own != used).any(dim=-1) & has).detach())
            if self._replay:
                experts = torch.where(has[:, None], given.to(experts.dtype), experts)
                gates = gates_of(logits, experts, module.norm_topk_prob)
        if self._recorded is not None:
            self._recorded[layer].append(experts.detach().to(torch.int16))
        return logits, gates, experts


_ROUTERS: weakref.WeakKeyDictionary[torch.nn.Module, Routers] = weakref.WeakKeyDictionary()


def routers(model: torch.nn.Module, precision: str | None = None) -> Routers | None:
    """`model`'s routers, hooked on first use (None for a dense model). `precision` sets what they compute in
    (the engine's copy; the trainer's stay fp32); None keeps what they have."""
    if model not in _ROUTERS:
        hooked = Routers(model, precision or "fp32")
        if not hooked.layers:
            if precision not in (None, "fp32"):
                raise ValueError(f"rollout.router_precision: {precision} needs a mixture-of-experts model (tiny_moe)")
            return None
        _ROUTERS[model] = hooked
    found = _ROUTERS[model]
    if precision is not None:
        found.precision = precision
    return found


def route_metrics(model: torch.nn.Module) -> dict[str, float]:
    """The last forward given routes: the share of (token, layer) decisions, and of tokens in any layer, where the
    model's own router chose other experts than the engine ({} for a dense model or a forward given none)."""
    found = _ROUTERS.get(model)
    return dict(found.last) if found is not None else {}


# ---------------------------------------------------------------- the router's arithmetic


def rounded_logits(x: Tensor, weight: Tensor, precision: str) -> Tensor:
    """[N, E] router logits from input x [N, H] and weight [E, H] in `precision`; bf16 and fp8 products are
    rounded to bf16 (a bf16 GEMM's output, and the bf16 output of an fp8 one)."""
    if precision == "bf16":
        return F.linear(x.to(torch.bfloat16), weight.to(torch.bfloat16))
    if precision == "fp8":  # e4m3 with amax scales per token and per expert, the product in fp32
        xq, wq = quantize_dequantize(x.float(), "e4m3", dim=-1), quantize_dequantize(weight.float(), "e4m3", dim=-1)
        return F.linear(xq, wq).to(torch.bfloat16)
    return F.linear(x, weight)


def top_k_gates(logits: Tensor, k: int, renormalise: bool) -> tuple[Tensor, Tensor]:
    """(gates [N, k], experts [N, k]): the k most probable experts under softmax(logits) in fp32, their
    probabilities renormalised to sum to 1 when `renormalise`, in the logits' dtype (Qwen3-MoE's rule)."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    gates, experts = probs.topk(k, dim=-1)
    if renormalise:
        gates = gates / gates.sum(dim=-1, keepdim=True)
    return gates.to(logits.dtype), experts


def gates_of(logits: Tensor, experts: Tensor, renormalise: bool) -> Tensor:
    """The gates of given experts [N, k]: the router's own softmax at them, renormalised over them (R3): the
    router's gradient flows through them as through its own top-k."""
    gates = torch.softmax(logits, dim=-1, dtype=torch.float32).gather(-1, experts)
    if renormalise:
        gates = gates / gates.sum(dim=-1, keepdim=True)
    return gates.to(logits.dtype)


# ---------------------------------------------------------------- layouts


def recorded_routes(recorded: list[list[Tensor]], rows: int) -> Tensor:
    """An engine's `recording` of one generate -> [rows, S, L, k]: the prefill's S0 positions, then one per
    decoding step (a generate forwards every token but the last it samples)."""
    per_layer = [torch.cat([c.reshape(rows, -1, c.shape[-1]) for c in calls], dim=1) for calls in recorded]
    return torch.stack(per_layer, dim=2).cpu()


def rollout_routes(recorded: Tensor, real: Tensor) -> Tensor:
    """[B, S, L, k] recorded routes -> [B, W, L, k] on a rollout's layout of W = P + T columns (prompt left-padded
    to P, response right-padded to T): NONE at columns past the recording and wherever `real` [B, W] is False."""
    b, width = real.shape
    out = torch.full((b, width, *recorded.shape[2:]), NONE, dtype=torch.int16)
    n = min(width, recorded.shape[1])
    out[:, :n] = recorded[:, :n]
    return out.masked_fill(~real[:, :, None, None], NONE)


def forward_routes(routes: Tensor, origin: Tensor | None) -> Tensor:
    """A batch's routes [B, W, L, k] in the order a forward flattens its tokens, [N, L, k]: the batch's own
    (origin None) or a packed layout's, whose origin [R, C] gives each slot's flat index into B * W (-1: none)."""
    flat = routes.flatten(0, 1)
    if origin is None:
        return flat
    picked = flat[origin.flatten().clamp(min=0)]
    return picked.masked_fill((origin.flatten() < 0)[:, None, None], NONE)


@contextlib.contextmanager
def given_routes(model: torch.nn.Module, routes: Tensor | None, replay: bool) -> Iterator[None]:
    """`Routers.given` on `model` when there are routes (and routers), else nothing."""
    found = routers(model) if routes is not None else None
    if found is None:
        if replay and routes is None:
            raise ValueError("router replay: the batch carries no routes (a dense model, or an engine recording none)")
        yield
        return
    assert routes is not None
    with found.given(routes, replay):
        yield


# ---------------------------------------------------------------- configuration


def check_moe(m: ModelConfig, r: RolloutConfig) -> None:
    """The MoE keys where they mean something, in one line each, before any model is built."""
    if problem := moe_problem(m.num_experts, m.experts_per_token):
        raise ValueError(f"model.{problem}")
    if m.num_experts and m.path is not None:
        raise ValueError(
            f"model.num_experts: {m.num_experts} builds the tiny mixture of experts; model.path={m.path!r} is a "
            "checkpoint of its own: use model.num_experts=0 (and model.experts_per_token=0)"
        )
    if m.name == "tiny_moe" and not m.num_experts:
        raise ValueError("model.num_experts: model=tiny_moe needs 2, 3 or 4 experts per layer")
    doses = {"rollout.router_precision": r.router_precision, "rollout.router_replay": r.router_replay}
    for key, value in doses.items():
        if value in ("fp32", False):  # off
            continue
        if not m.num_experts:
            raise ValueError(
                f"{key}: {value} needs a mixture-of-experts model (model=tiny_moe, or model.num_experts 2-4); "
                f"model={m.name} is dense"
            )
        if r.engine != "hf":
            raise ValueError(f"{key}: {value} is emulated by rollout=hf only (vLLM records no routes); use rollout=hf")
    if r.router_replay and m.gradient_checkpointing:
        raise ValueError(
            "rollout.router_replay: model.gradient_checkpointing recomputes the forward in backward, outside the "
            "replayed routes; use model.gradient_checkpointing=false"
        )
