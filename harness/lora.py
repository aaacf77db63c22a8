"""LoRA through `peft`: adapters injected into the policy in place, merged weights for the rollout engine.

DPPO Fig. 17 trains Qwen3-30B-A3B-Base with LoRA rank 32, alpha 64, lr 1e-5 (Table 1). Here any run can:
`model.lora_rank=32 model.lora_alpha=64`. What that changes, and where the loop calls in:

- `apply_lora(policy, cfg.model, seed)` after loading: peft's `inject_adapter_in_model` puts LoRA layers into the
  HF model itself (no PeftModel wrapper, so the trainer's forward, FSDP2's per-layer sharding and gradient
  checkpointing see the same module tree), and every base weight is frozen. The optimizer gets
  `trainable_parameters(policy)`: the adapters only.
- `engine_state_dict(policy, state)`: what the weight sync pushes. The engine holds the *base* model, so it gets
  W + (alpha / r) B A under the base model's own parameter names; `state` is the (possibly gathered) full state
  dict of the LoRA model, so the same function serves one process and FSDP2.
- `adapter_state_dict(state)` / `restore_adapter(policy, optimizer)`: checkpoints hold the adapters and the
  optimizer only (the frozen base is the model folder the run started from), and resume loads them back.

Targets (`model.lora_targets`, empty = all): every `nn.Linear` inside the decoder layers (attention q/k/v/o, the
dense MLP's gate/up/down), plus every fused 3-D expert stack of an MoE layer (transformers 5 keeps Qwen3-MoE's 128
experts as `mlp.experts.gate_up_proj` / `down_proj` parameters, not as Linear modules; peft adapts them through
`target_parameters` with rank r per expert). Routers, norms, embeddings and the output head are never adapted.
A name in `lora_targets` is a module suffix (`q_proj`, `self_attn.o_proj`) or a fused parameter
(`experts.gate_up_proj`); one that matches nothing is a config error naming the key.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

ADAPTER = "default"  # peft's adapter name; one adapter per run
# State-dict keys that belong to adapters (peft's LoRA layers), not to the base model.
_ADAPTER_KEY = re.compile(r"\.lora_(A|B|embedding_A|embedding_B|magnitude_vector)\.")
_BASE_LAYER = ".base_layer"
# Parameters of decoder-layer modules with this many dims are fused expert stacks ([experts, in|out, out|in]).
_EXPERT_NDIM = 3


@dataclass(frozen=True)
class LoraTargets:
    """What peft is asked to adapt: full module names (nn.Linear) and full parameter names (expert stacks)."""

    modules: tuple[str, ...]
    parameters: tuple[str, ...]


def lora_alpha(model_cfg: Any) -> float:
    """`model.lora_alpha`, null = 2 x rank (the paper's 64 at rank 32)."""
    return float(model_cfg.lora_alpha) if model_cfg.lora_alpha is not None else 2.0 * model_cfg.lora_rank


# ---------------------------------------------------------------- config-time checks


def check_lora_config(model_cfg: Any, precision: str = "fp32") -> None:
    """One-line ValueError naming the key for a LoRA option that cannot work, before any model is built.

    The targets are checked against the model's module tree on the meta device when its architecture is known
    without a download (the tiny model, a preset's `architecture`, a local folder's config.json); a bare hub id
    is checked when the run loads it (`apply_lora`)."""
    m = model_cfg
    if m.lora_rank == 0:
        for key, value, off in (
            ("lora_alpha", m.lora_alpha, None),
            ("lora_dropout", m.lora_dropout, 0.0),
            ("lora_targets", tuple(m.lora_targets), ()),
        ):
            if value != off:
                raise ValueError(
                    f"model.{key}: set to {value!r} but LoRA is off (model.lora_rank=0); set model.lora_rank=<r> "
                    f"to train LoRA adapters, or drop model.{key}"
                )
        return
    if precision == "fp8_e2e":
        raise ValueError(
            "model.lora_rank: LoRA with precision=fp8_e2e is not supported (its fp8 linears and peft's LoRA layers "
            "both wrap nn.Linear); allowed with LoRA: fp32, bf16, fp8_rollout"
        )
    fields = _known_fields(m)
    if fields is not None:
        resolve_targets(structure_from_fields(fields), tuple(m.lora_targets), m.lora_dropout)


def _known_fields(m: Any) -> dict[str, Any] | None:
    """config.json fields of `model` if they can be had offline; None for a hub id without `architecture`."""
    from pathlib import Path

    if m.path is None:  # the tiny model: a Qwen3 of these sizes
        return {"model_type": "qwen3", "num_hidden_layers": m.num_layers}
    if m.architecture:
        return dict(m.architecture)
    config = Path(m.path).expanduser() / "config.json"
    if config.is_file():
        try:
            return json.loads(config.read_text(encoding="utf-8"))
        except ValueError:
            return None  # not readable: the run's own load reports it
    return None


# The decoder-layer projections of the families the presets use, so that a config is checked without importing
# transformers' modeling code (seconds) or building the model; tests/test_scale.py checks the table against each
# preset's model on the meta device. Any other model type is instantiated on the meta device.
_ATTENTION = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
_DENSE_MLP = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
_DENSE_FAMILIES = ("qwen2", "qwen3", "llama", "mistral", "gemma", "gemma2")
_EXPERT_STACKS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")

Structure = tuple[tuple[tuple[str, str], ...], tuple[tuple[str, int], ...]]


def structure_from_fields(fields: dict[str, Any]) -> Structure:
    """((Linear module name, class), ...), ((parameter name, ndim), ...) of a causal LM with these config.json
    fields: from the table above for known families, else from the model built on the meta device."""
    kind, layers = fields.get("model_type"), fields.get("num_hidden_layers")
    if isinstance(layers, int) and kind in (*_DENSE_FAMILIES, "qwen3_moe"):
        linears, stacks = [], []
        sparse = set()
        experts = fields.get("num_experts", fields.get("num_local_experts", 0))  # config.json's name, to_dict()'s
        if kind == "qwen3_moe" and experts:  # transformers' Qwen3MoeDecoderLayer rule
            step, dense_only = fields.get("decoder_sparse_step", 1), set(fields.get("mlp_only_layers") or [])
            sparse = {i for i in range(layers) if i not in dense_only and (i + 1) % step == 0}
        for i in range(layers):
            prefix = f"model.layers.{i}."
            linears += [(prefix + n, "Linear") for n in _ATTENTION]
            if i in sparse:
                stacks += [(prefix + n, _EXPERT_NDIM) for n in _EXPERT_STACKS]
            else:
                linears += [(prefix + n, "Linear") for n in _DENSE_MLP]
        return tuple(linears), tuple(stacks)
    return _meta_structure(json.dumps(fields, sort_keys=True, default=str))


@functools.lru_cache(maxsize=8)
def _meta_structure(fields_json: str) -> Structure:
    from harness.models import meta_model

    return structure(meta_model(json.loads(fields_json)))


def structure(model: nn.Module) -> Structure:
    """The (Linear modules, parameters) of a built model, in `structure_from_fields`'s format."""
    linears = tuple((n, type(mod).__name__) for n, mod in model.named_modules() if isinstance(mod, nn.Linear))
    params = tuple((n, p.dim()) for n, p in model.named_parameters())
    return linears, params


def resolve_targets(layout: Structure, targets: tuple[str, ...], dropout: float) -> LoraTargets:
    """Full module / parameter names for `model.lora_targets` (module docstring); ValueError naming the key."""
    linears, params = layout
    in_layers = re.compile(r"(^|\.)layers\.\d+\.")
    layer_linears = [n for n, _ in linears if in_layers.search(n)]
    linear_set = set(n for n, _ in linears)
    # Fused expert stacks: 3-D parameters of decoder-layer modules that are not Linear layers.
    stacks = [
        n
        for n, ndim in params
        if ndim == _EXPERT_NDIM and in_layers.search(n) and n.rsplit(".", 1)[0] not in linear_set
    ]
    if not layer_linears and not stacks:
        raise ValueError(
            "model.lora_rank: this model has no decoder layers (model.layers.<i>) with linear projections to adapt"
        )
    if not targets:
        modules, parameters = layer_linears, stacks
    else:
        modules, parameters = [], []
        for target in targets:
            hit_m = [n for n in layer_linears if n == target or n.endswith("." + target)]
            hit_p = [n for n in stacks if n == target or n.endswith("." + target)]
            if not hit_m and not hit_p:
                leaves = sorted({n.rsplit(".", 1)[-1] for n in layer_linears})
                fused = sorted({".".join(n.split(".")[-2:]) for n in stacks})
                raise ValueError(
                    f"model.lora_targets: {target!r} matches no linear layer or expert stack of the decoder layers; "
                    f"allowed: {', '.join(leaves + fused)}"
                )
            modules += hit_m
            parameters += hit_p
        modules, parameters = sorted(set(modules)), sorted(set(parameters))
    if parameters and dropout > 0:
        raise ValueError(
            f"model.lora_dropout: must be 0 when LoRA adapts fused MoE expert stacks (peft cannot drop out inside "
            f"them), got {dropout}; or leave the experts out with model.lora_targets"
        )
    return LoraTargets(tuple(modules), tuple(parameters))


# ---------------------------------------------------------------- the model


def apply_lora(model: nn.Module, model_cfg: Any, seed: int = 0) -> nn.Module:
    """Inject LoRA adapters into `model` in place and freeze every base weight (no-op at `lora_rank` 0).

    The adapters' random A matrices come from a private RNG stream seeded by `seed` (B starts at zero, so the
    model's outputs are unchanged until the first update)."""
    if model_cfg.lora_rank == 0:
        return model
    from peft import LoraConfig, inject_adapter_in_model

    targets = resolve_targets(structure(model), tuple(model_cfg.lora_targets), model_cfg.lora_dropout)
    config = LoraConfig(
        r=model_cfg.lora_rank,
        lora_alpha=lora_alpha(model_cfg),
        lora_dropout=model_cfg.lora_dropout,
        target_modules=list(targets.modules) or None,
        target_parameters=list(targets.parameters) or None,
        bias="none",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    for name, p in model.named_parameters():
        p.requires_grad_(bool(_ADAPTER_KEY.search(name)))
    return model


def is_lora(model: nn.Module) -> bool:
    """Whether `model` carries LoRA adapters (read off its parameter names: no peft import for other runs)."""
    return any(_ADAPTER_KEY.search(name) for name, _ in model.named_parameters())


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """What the optimizer updates: every parameter that requires a gradient (only the adapters under LoRA)."""
    return [p for p in model.parameters() if p.requires_grad]


def engine_state_dict(model: nn.Module, state: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The weights the rollout engine loads: `state` (default `model.state_dict()`) with every LoRA adapter merged
    into its base weight, W + (alpha / r) B A, under the base model's parameter names. Without LoRA, `state` as is.

    `state` may be a gathered full state dict of a sharded model (harness.distributed): the
    modules are read only for their LoRA settings, the tensors all come from `state`. The trainer's own weights
    are never modified."""
    state = model.state_dict() if state is None else state
    if not is_lora(model):
        return dict(state)
    from peft.tuners.lora import LoraLayer, ParamWrapper

    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, LoraLayer)]
    merged = {_base_name(k): v for k, v in state.items() if not _ADAPTER_KEY.search(k)}
    with torch.no_grad():
        for name, layer in layers:
            a = state[f"{name}.lora_A.{ADAPTER}.weight"]
            b = state[f"{name}.lora_B.{ADAPTER}.weight"]
            scale = layer.scaling[ADAPTER]
            if isinstance(layer, ParamWrapper):
                key = f"{_base_name(name)}.{layer.parameter_name}"
                delta = expert_delta(a, b, layer.num_experts, layer._did_swap_in_out_features) * scale
            else:
                if getattr(layer, "fan_in_fan_out", False):
                    raise ValueError(f"LoRA layer {name}: fan_in_fan_out (Conv1D) layers are not supported")
                key = f"{_base_name(name)}.weight"
                delta = (b.float() @ a.float()) * scale
            base = merged[key]
            merged[key] = (base.float() + delta.float()).to(base.dtype)
    return merged


def expert_delta(a: torch.Tensor, b: torch.Tensor, experts: int, out_first: bool) -> torch.Tensor:
    """peft's ParamWrapper delta for a stack of `experts` matrices, without the scale: lora_A [r * E, in] and
    lora_B [out, r * E] -> [E, in, out] (or [E, out, in] when the stack stores out first)."""
    a, b = a.float(), b.float()
    if experts == 1:
        return b @ a
    a3 = a.reshape(experts, -1, a.shape[-1])  # [E, r, in]
    b3 = b.reshape(b.shape[0], -1, experts)  # [out, r, E]
    pattern = "o r e, e r i -> e o i" if out_first else "o r e, e r i -> e i o"
    return torch.einsum(pattern, b3, a3)


def _base_name(name: str) -> str:
    return name.replace(_BASE_LAYER, "")


# ---------------------------------------------------------------- checkpoints


def adapter_state_dict(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter tensors of a LoRA model's state dict: what a checkpoint stores (the base stays frozen)."""
    return {k: v for k, v in state.items() if _ADAPTER_KEY.search(k)}


def load_adapter_state(model: nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    """Load a checkpoint's adapter tensors into `model`: exactly its adapter keys, or a ValueError."""
    _check_adapter_keys(model, tensors)
    model.load_state_dict(dict(tensors), strict=False)


def _check_adapter_keys(model: nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    own = set(adapter_state_dict(model.state_dict()))
    missing, unexpected = sorted(own - set(tensors)), sorted(set(tensors) - own)
    if missing or unexpected:
        what = f"missing {missing[0]!r}" if missing else f"unexpected {unexpected[0]!r}"
        raise ValueError(
            f"LoRA checkpoint does not fit this model ({what}; {len(missing)} missing, {len(unexpected)} unexpected): "
            "same model.lora_rank and model.lora_targets as the run that wrote it?"
        )


def restore_adapter(
    model: nn.Module, optimizer: torch.optim.Optimizer, sharded: bool = False
) -> Callable[[dict, Any], None]:
    """`restore` for harness.loop.checkpoint.load_latest: a checkpoint's adapters into the model (exactly its adapter
    keys, else ValueError), then the optimizer's state. `sharded`: an FSDP2 model (every rank reads the full
    tensors and keeps its shard); not exercised by the tests, which run one process."""

    def restore(tensors: dict[str, torch.Tensor], optim_state: Any) -> None:
        if not sharded:
            load_adapter_state(model, tensors)
            optimizer.load_state_dict(optim_state)
            return
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        from harness.distributed import by_name

        _check_adapter_keys(model, tensors)
        options = StateDictOptions(full_state_dict=True, strict=False)  # the base is not in the checkpoint
        set_model_state_dict(model, dict(tensors), options=options)
        optim_state = by_name(model, optimizer, optim_state)  # a one-process checkpoint numbers its parameters
        set_optimizer_state_dict(model, optimizer, optim_state, options=StateDictOptions(full_state_dict=True))

    return restore


def merged_from_checkpoint(
    base: str, adapter: Mapping[str, torch.Tensor], model_cfg: Any, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """Base model folder + a LoRA checkpoint's adapters -> the merged weights (for evaluating a LoRA run)."""
    from harness.models import load_policy

    model, _ = load_policy(base, dtype=dtype)
    apply_lora(model, model_cfg)
    load_adapter_state(model, adapter)
    return engine_state_dict(model)
