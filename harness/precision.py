"""Precision policies (DESIGN.md precision table): what the rollout copy and the trainer compute in.

| name        | rollout copy                         | trainer                                   |
|-------------|--------------------------------------|-------------------------------------------|
| fp32        | fp32                                 | fp32                                      |
| bf16        | bf16 weights                         | bf16 autocast, fp32 master weights        |
| fp8_rollout | bf16 + e4m3 weights (fake-quant)     | bf16 autocast                             |
| fp8_e2e     | as fp8_rollout                       | bf16 autocast + fp8 linears (fake-quant)  |
| w8a8_rollout| int8 weights + int8 activations      | fp32                                      |
| w4a4_rollout| int4 weights + int4 activations      | fp32                                      |
| w3a8_rollout| int3 weights + int8 activations      | fp32                                      |
| w4a4_rollout_bf16 | int4 weights + int4 activations | bf16 autocast, fp32 master weights        |

The `w*a*_rollout` rows (harness.quant) round the rollout copy's Linear inputs per token as well as its weights,
so the engine's error depends on each input and grows with the policy's range, while training stays fp32 (cheap
on CPU). They exist to give the tiny model the training-inference mismatch the papers see at scale; HF engine
only (vLLM CPU has no activation-quantised path to mirror them).

On CPU fp8 is simulated: quantize to float8_e4m3fn with amax scaling, then dequantize. The rounding error is
the one a real fp8 kernel sees; the speed is not. On a GPU, vLLM's own `quantization="fp8"` replaces the
fake-quant of the rollout copy (`vllm_kwargs`), and fp8_e2e trains through torchao's float8 linears with the
rowwise recipe (`convert_float8_training`).

What gets quantized: every 2-D Linear weight (attention and MLP projections). Embeddings, norms and the output
head stay in the copy's dtype, tied or not; that is also what vLLM's fp8 method does (the LM head and the
embedding are not quantized), so the CPU simulation and the GPU path quantize the same tensors.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from harness.quant import QuantSpec, ScaledCopy, fp8_quantize_dequantize, is_body_weight, quantize_state_dict

StateDictTransform = Callable[[Mapping[str, torch.Tensor]], dict[str, torch.Tensor]]


@dataclass(frozen=True)
class Precision:
    """One row of the precision table."""

    name: str
    rollout_dtype: torch.dtype
    """dtype of the rollout engine's weight copy"""
    rollout_fp8: bool
    """quantize the rollout copy's linear weights to e4m3"""
    train_autocast: torch.dtype | None
    """autocast dtype for the trainer's forward/backward; None = plain fp32"""
    train_fp8: bool
    """fp8 quantize-dequantize of linear weights and inputs in the trainer (`wrap_fp8_linears`)"""
    rollout_quant: QuantSpec | None = None
    """weights and activations the rollout copy rounds (harness.quant); HF engine only"""


_TABLE = {
    "fp32": Precision("fp32", torch.float32, rollout_fp8=False, train_autocast=None, train_fp8=False),
    "bf16": Precision("bf16", torch.bfloat16, rollout_fp8=False, train_autocast=torch.bfloat16, train_fp8=False),
    "fp8_rollout": Precision(
        "fp8_rollout", torch.bfloat16, rollout_fp8=True, train_autocast=torch.bfloat16, train_fp8=False
    ),
    "fp8_e2e": Precision("fp8_e2e", torch.bfloat16, rollout_fp8=True, train_autocast=torch.bfloat16, train_fp8=True),
    # Quantised rollout copies (harness.quant), fp32 training: the calibrated mismatch sources.
    **{
        name: Precision(name, torch.float32, False, None, False, rollout_quant=QuantSpec(weights=w, activations=a))
        for name, w, a in (
            ("w8a8_rollout", "int8", "int8"),
            ("w4a4_rollout", "int4", "int4"),
            ("w3a8_rollout", "int3", "int8"),
        )
    },
    # The DPPO sanity test trains in BF16 "to expose numerical instabilities" (papers.md, section 5): the W4A4
    # mismatch source beside that training precision.
    "w4a4_rollout_bf16": Precision(
        "w4a4_rollout_bf16",
        torch.float32,
        False,
        torch.bfloat16,
        False,
        rollout_quant=QuantSpec(weights="int4", activations="int4"),
    ),
}
PRECISIONS = tuple(_TABLE)


def get(name: str) -> Precision:
    if name not in _TABLE:
        raise ValueError(f"precision: unknown {name!r}; allowed: {', '.join(PRECISIONS)}")
    return _TABLE[name]


def fp8_fake_quant_state_dict(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The rollout copy's view of trainer weights under fp8: per-output-channel e4m3 round trip of linear weights.

    Returns a new dict; other tensors are passed through (not copied).
    """
    with torch.no_grad():
        return {
            name: fp8_quantize_dequantize(t.detach(), dim=-1) if is_body_weight(name, t) else t
            for name, t in state_dict.items()
        }


def rollout_weight_format(precision: str) -> str | None:
    """The format the rollout copy rounds its Linear weights to, or None when it keeps them in its dtype."""
    spec = get(precision)
    if spec.rollout_quant is not None:
        return spec.rollout_quant.weights
    return "e4m3" if spec.rollout_fp8 else None


def rollout_weight_transform(precision: str, scale_refresh: int = 1) -> StateDictTransform | None:
    """What `sync_weights` applies to trainer weights before copying them into a CPU rollout engine.

    `scale_refresh` (rollout.scale_refresh): 1 sets each sync's scales from its own weights; k > 1 keeps them for
    k syncs and 0 for the whole run (harness.quant.ScaledCopy, a stateful transform)."""
    spec = get(precision)
    if scale_refresh != 1:
        fmt = rollout_weight_format(precision)
        if fmt is None:
            raise ValueError(
                f"rollout.scale_refresh: {scale_refresh} needs a precision that quantises the rollout copy's weights "
                f"(fp8_rollout, fp8_e2e, w*a*_rollout); {precision} keeps them in its dtype. Use 1"
            )
        return ScaledCopy(fmt, scale_refresh)
    if spec.rollout_quant is not None:
        return functools.partial(quantize_state_dict, spec=spec.rollout_quant)
    return fp8_fake_quant_state_dict if spec.rollout_fp8 else None


def vllm_kwargs(precision: str, device: str) -> dict[str, str]:
    """`vllm.LLM` keyword arguments for a precision: dtype, and vLLM's native fp8 on CUDA.

    With `quantization` present the engine quantizes itself and must not also get the fake-quant transform.
    """
    spec = get(precision)
    kw = {"dtype": "float32" if spec.rollout_dtype == torch.float32 else "bfloat16"}
    if spec.rollout_fp8 and device.startswith("cuda"):
        kw["quantization"] = "fp8"
    return kw


def autocast(precision: str, device_type: str = "cpu") -> contextlib.AbstractContextManager[None]:
    """The trainer's autocast context for a precision (a no-op for fp32)."""
    dtype = get(precision).train_autocast
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=dtype)


def _fake_quant_ste(x: torch.Tensor) -> torch.Tensor:
    # Straight-through estimator: the forward sees the quantized value, the backward sees the identity.
    return x + (fp8_quantize_dequantize(x.detach(), dim=-1) - x).detach()


class Fp8Linear(nn.Linear):
    """nn.Linear whose forward multiplies e4m3-rounded inputs (per token) by e4m3-rounded weights (per output
    channel), with straight-through gradients: the rowwise fp8 recipe, simulated. Parameters and state_dict
    names are those of the nn.Linear it replaces."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(_fake_quant_ste(x), _fake_quant_ste(self.weight), self.bias)


def _linears(model: nn.Module) -> Iterator[nn.Linear]:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    for module in model.modules():
        # The LM head stays in high precision, as in the rollout copy.
        if isinstance(module, nn.Linear) and module is not head:
            yield module


def wrap_fp8_linears(model: nn.Module) -> int:
    """Turn every nn.Linear except the output head into an Fp8Linear, in place; returns how many changed.

    The module keeps its parameters (an optimizer built before or after sees the same tensors); only the class,
    hence the forward, changes. Calling it twice is harmless.
    """
    changed = 0
    for module in _linears(model):
        if type(module) is nn.Linear:
            module.__class__ = Fp8Linear
            changed += 1
    return changed


# Model types whose projections are transformers' Conv1D rather than nn.Linear, so fp8_e2e has nothing to wrap.
# Read from config.json at config time (building even a meta-device model takes seconds of imports).
CONV1D_MODEL_TYPES = frozenset({"gpt2", "openai-gpt", "imagegpt", "decision_transformer"})


def fp8_unwrappable_reason(model_dir: str | Path) -> str | None:
    """Why `precision=fp8_e2e` cannot wrap the model at `model_dir` (from its config.json), or None."""
    try:
        model_type = json.loads((Path(model_dir) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return None  # not a readable local config: the setup-time check in the trainer decides
    if model_type in CONV1D_MODEL_TYPES:
        return f"model_type '{model_type}' uses Conv1D projections, not nn.Linear"
    return None


def convert_float8_training(model: nn.Module) -> None:
    """fp8_e2e on a GPU: torchao swaps every nn.Linear except the output head for its Float8Linear (rowwise
    scaling: one e4m3 scale per row of activations and weights, the recipe the CPU simulation mirrors). Call it
    before FSDP2 shards the model. Needs torchao and an sm_89+ GPU (harness.machine checks both)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    convert_to_float8_training(
        model,
        config=Float8LinearConfig.from_recipe_name("rowwise"),
        module_filter_fn=lambda module, fqn: isinstance(module, nn.Linear) and module is not head,
    )
