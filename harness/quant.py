"""A lower-precision rollout copy, simulated on CPU: fake-quantised weights AND activations (W8A8-style).

Why: the bf16 / fp8-weight emulations of `harness.precision` move the tiny model's log-probs by only
~1e-4..5e-4 in mean |pi - mu| (max ~0.03), ten times below what the DPPO/DRPO papers measure at scale
(~0.003-0.02, max >= 0.5). Rounding the activations as well as the weights, as an int8 / fp8 inference kernel
does, adds an error that depends on the input (per token) and grows with the weights' and activations' range, so
it moves as the policy moves, unlike a fixed noise. The trainer stays fp32; only the engine's copy is rounded.

What is rounded, per `QuantSpec`:
- every Linear weight except the output head, per output channel (at each weight sync, once);
- the input of every Linear except the output head, per token (at each forward: the activation path);
- optionally (`head=True`) the output head too: its weight per vocabulary row and its input per token. On a
  tied-embedding model the head's weight is the embedding table, so the table is rounded where the head reads
  it (the module's forward), never in the state dict: the embedding lookup keeps full precision.

Formats: "int8" ... "int3" (symmetric, amax scaling: 2^(bits-1) - 1 levels each side) and "e4m3"
(`fp8_quantize_dequantize`, below; harness.precision uses it too). No straight-through gradients: the engine
never trains.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

_INT_LEVELS = {f"int{bits}": float(2 ** (bits - 1) - 1) for bits in range(8, 2, -1)}  # int8: 127 ... int3: 3
FORMATS = (*_INT_LEVELS, "e4m3")


@dataclass(frozen=True)
class QuantSpec:
    """What a quantised rollout copy rounds (module docstring)."""

    weights: str
    """format of Linear weights (per output channel)"""
    activations: str | None
    """format of Linear inputs (per token); None = activations stay in the copy's dtype"""
    head: bool = False
    """round the output head's weight and input too"""

    def __post_init__(self) -> None:
        for fmt in (self.weights, self.activations):
            if fmt is not None and fmt not in FORMATS:
                raise ValueError(f"quant format: unknown {fmt!r}; allowed: {', '.join(FORMATS)}")


E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448


def fp8_quantize_dequantize(x: torch.Tensor, dim: int | None = -1) -> torch.Tensor:
    """Round `x` to e4m3 with amax scaling and back, in `x`'s dtype.

    dim=-1: one scale per row (per output channel of a [out, in] weight, per token of an activation);
    dim=None: one scale for the whole tensor. The clamp matters: casting a value above 448 to
    float8_e4m3fn gives NaN (the format has no inf), and x * 448 / amax can round just past 448.
    """
    xf = x.float()
    amax = xf.abs().amax() if dim is None else xf.abs().amax(dim=dim, keepdim=True)
    scale = amax.clamp(min=1e-12) / E4M3_MAX
    q = (xf / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return (q.float() * scale).to(x.dtype)


def quantize_dequantize(x: torch.Tensor, fmt: str, dim: int | None = -1) -> torch.Tensor:
    """Round `x` to `fmt` with one amax scale per slice along `dim` (None: per tensor) and back, in x's dtype."""
    if fmt == "e4m3":
        return fp8_quantize_dequantize(x, dim=dim)
    return quantize_with_scale(x, fmt, amax_scale(x, fmt, dim))


def amax_scale(x: torch.Tensor, fmt: str, dim: int | None = -1) -> torch.Tensor:
    """The scale that maps each slice's largest magnitude onto `fmt`'s largest level (float32, keepdim)."""
    if fmt not in FORMATS:
        raise ValueError(f"quant format: unknown {fmt!r}; allowed: {', '.join(FORMATS)}")
    xf = x.float()
    amax = xf.abs().amax() if dim is None else xf.abs().amax(dim=dim, keepdim=True)
    return amax.clamp(min=1e-12) / (E4M3_MAX if fmt == "e4m3" else _INT_LEVELS[fmt])


def quantize_with_scale(x: torch.Tensor, fmt: str, scale: torch.Tensor) -> torch.Tensor:
    """Round `x` to `fmt` on a given scale and back, saturating at the format's largest level: with a scale set
    on other weights, values past the old range clip and the rest round on the old grid."""
    xf = x.float()
    if fmt == "e4m3":
        q = (xf / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        return (q.float() * scale).to(x.dtype)
    levels = _INT_LEVELS[fmt]
    return ((xf / scale).round().clamp(-levels, levels) * scale).to(x.dtype)


class QuantLinear(nn.Linear):
    """nn.Linear whose input is rounded per token before the matmul (`quant_act`), and, when `quant_weight` is
    set, whose weight is rounded per output channel at each forward (the output head, whose tied weight must stay
    exact for the embedding lookup). Other Linear weights are rounded once per sync by `quantize_state_dict`."""

    quant_act: str | None = None
    quant_weight: str | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.quant_act is not None:
            x = quantize_dequantize(x, self.quant_act, dim=-1)
        w = self.weight if self.quant_weight is None else quantize_dequantize(self.weight, self.quant_weight, dim=-1)
        return F.linear(x, w, self.bias)


def _head(model: nn.Module) -> nn.Module | None:
    return model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None


def quantize_model(model: nn.Module, spec: QuantSpec) -> int:
    """Make `model`'s Linear layers round their inputs (and the head its weight) per `spec`, in place.

    Only the class and two attributes change: parameters, state_dict names and weight syncs stay as they were.
    Returns how many layers were changed; calling it twice is harmless.
    """
    head = _head(model)
    changed = 0
    for module in model.modules():
        if not isinstance(module, nn.Linear):
            continue
        is_head = module is head
        if is_head and not spec.head:
            continue
        if type(module) is nn.Linear:
            module.__class__ = QuantLinear
        module.quant_act = spec.activations
        module.quant_weight = spec.weights if is_head else None
        changed += 1
    return changed


def is_body_weight(name: str, tensor: torch.Tensor) -> bool:
    # Linear weights of the body: 2-D ".weight" tensors other than the embedding and the head.
    return (
        tensor.ndim == 2
        and tensor.is_floating_point()
        and name.endswith(".weight")
        and "embed" not in name
        and "lm_head" not in name
    )


def quantize_state_dict(state_dict: dict[str, torch.Tensor], spec: QuantSpec) -> dict[str, torch.Tensor]:
    """The rollout copy's view of trainer weights: body Linear weights rounded per output channel.

    Returns a new dict; other tensors (embedding, norms, head) are passed through, not copied.
    """
    with torch.no_grad():
        return {
            name: quantize_dequantize(t.detach(), spec.weights, dim=-1) if is_body_weight(name, t) else t
            for name, t in state_dict.items()
        }


class ScaledCopy:
    """A quantised copy whose per-channel weight scales are set at the first sync and refreshed every
    `refresh` syncs (0 = never), as a deployed low-precision checkpoint keeps the scales it was calibrated with
    while the trainer's weights move on. Refresh 1 is `quantize_state_dict` exactly (scales from each sync's own
    weights). Between refreshes the copy's error grows with how far each channel moved: values past the old
    range saturate, the rest round on the old grid.

    Stateful (the scales, the sync count): `state` / `load_state` carry it through a checkpoint, so a resumed
    run's copy rounds as the uninterrupted run's would.
    """

    def __init__(self, fmt: str, refresh: int) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"quant format: unknown {fmt!r}; allowed: {', '.join(FORMATS)}")
        if refresh < 0:
            raise ValueError(f"rollout.scale_refresh: {refresh}; allowed: 0 (scales fixed at step 0) or k >= 1")
        self.fmt = fmt
        self.refresh = refresh
        self.syncs = 0
        self.scales: dict[str, torch.Tensor] = {}

    def __call__(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        fresh = self.syncs == 0 or (self.refresh > 0 and self.syncs % self.refresh == 0)
        self.syncs += 1
        out: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for name, t in state_dict.items():
                if not is_body_weight(name, t):
                    out[name] = t
                    continue
                if fresh or name not in self.scales:
                    self.scales[name] = amax_scale(t.detach(), self.fmt, dim=-1)
                out[name] = quantize_with_scale(t.detach(), self.fmt, self.scales[name])
        return out

    def state(self) -> dict[str, Any]:
        return {"syncs": self.syncs, "scales": {k: v.clone() for k, v in self.scales.items()}}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.syncs = int(state["syncs"])
        self.scales = {k: v.clone() for k, v in state["scales"].items()}
