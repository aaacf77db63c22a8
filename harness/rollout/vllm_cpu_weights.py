"""A direct weight write into an in-process vLLM CPU model, for the per-step weight sync.

vLLM's `reload_weights` is the general path, but on CPU most of its cost is not the copy: it rebuilds every
layer's loader state (meta tensors, per-layer bookkeeping) around the model's `load_weights`, then re-packs each
linear layer's oneDNN weights. On the tiny model that is ~80 ms per sync for ~20 ms of packing. This writer keeps
only the necessary part: each trainer tensor goes into the vLLM parameter that holds it (the q/k/v and gate/up
projections are concatenated in the order of the model's `packed_modules_mapping`), and every linear layer is
re-packed by its own quantization method, so the packed weights are the ones `reload_weights` would build.

It plans once from the first state dict's names and shapes and refuses (`plan` returns a reason) whatever it does
not cover exactly: a name with no target, a target left unwritten, a shape that does not match, a layer that is
not a plain dense linear (MoE experts, quantized layers). The engine then keeps `reload_weights`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class _Fused:
    """A packed vLLM linear layer and where each trainer tensor goes in it."""

    module: nn.Module
    parts: dict[str, list[str]] = field(default_factory=dict)  # "weight" / "bias" -> trainer names, in order


class CPUWeightWriter:
    """Writes trainer weights (HF names, engine dtype) into a vLLM CPU model in place."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._copies: dict[str, nn.Parameter] = {}  # trainer name -> vLLM parameter written by copy_
        self._linears: dict[str, _Fused] = {}  # vLLM module name -> its (possibly concatenated) weight and bias
        self._skip: set[str] = set()  # trainer names that alias a written parameter (a tied output head)
        self._repack: list[nn.Module] = []

    def plan(self, weights: Mapping[str, torch.Tensor]) -> str | None:
        """Map every name to its target; None when the writer covers this model, else the reason it does not."""
        model = self.model
        modules = dict(model.named_modules())
        params = dict(model.named_parameters())
        packed = getattr(model, "packed_modules_mapping", {})
        shard = {sub: (fused, i) for fused, subs in packed.items() for i, sub in enumerate(subs)}
        gemm = {name for name, m in modules.items() if hasattr(m, "cpu_linear")}
        for name, m in modules.items():
            if name in gemm and type(m.quant_method).__name__ not in (
                "UnquantizedLinearMethod",
                "UnquantizedEmbeddingMethod",
            ):
                return f"{name} uses {type(m.quant_method).__name__}"
        for name, tensor in weights.items():
            owner, _, leaf = name.rpartition(".")
            parent, _, child = owner.rpartition(".")
            if name in params:
                param = params[name]
                if owner in gemm and param.numel() == 0:  # a linear whose packed copy replaced its weight
                    self._linears.setdefault(owner, _Fused(modules[owner])).parts[leaf] = [name]
                    continue
                # vLLM pads the vocabulary rows of the embedding and head (to a multiple of 64); the padding
                # rows are never sampled and stay as loaded
                vocab = getattr(modules[owner], "org_vocab_size", None)
                padded = vocab == tensor.shape[0] and param.shape[1:] == tensor.shape[1:]
                if param.shape != tensor.shape and not padded:
                    return f"{name}: trainer shape {tuple(tensor.shape)}, engine {tuple(param.shape)}"
                self._copies[name] = param
            elif child in shard:
                fused_name, index = f"{parent}.{shard[child][0]}", shard[child][1]
                if fused_name not in modules:
                    return f"{name}: no {fused_name} in the engine"
                parts = self._linears.setdefault(fused_name, _Fused(modules[fused_name])).parts
                names = parts.setdefault(leaf, [""] * len(packed[shard[child][0]]))
                names[index] = name
            elif owner in modules and isinstance(getattr(modules[owner], leaf, None), nn.Parameter):
                self._skip.add(name)  # deduplicated by named_parameters: shares a parameter written above
            else:
                return f"{name}: no target in the engine"
        missing = self._uncovered(weights, params, modules)
        if missing is not None:
            return missing
        self._repack = [modules[name] for name in sorted(gemm)]
        return None

    def _uncovered(
        self, weights: Mapping[str, torch.Tensor], params: dict[str, nn.Parameter], modules: dict[str, nn.Module]
    ) -> str | None:
        """None when the mapped parts fill every fused linear exactly and every engine parameter is written;
        else what is missing or misshapen."""
        for fused in self._linears.values():
            for leaf, names in fused.parts.items():
                if "" in names:
                    return f"a {leaf} of {self._name(fused.module)} is missing from the trainer's weights"
                rows, m = sum(weights[n].shape[0] for n in names), fused.module
                if leaf == "bias":
                    expected, got = tuple(getattr(m, leaf).shape), (rows,)
                else:
                    expected = (getattr(m, "output_size_per_partition", -1), getattr(m, "input_size_per_partition", -1))
                    got = (rows, *{weights[n].shape[-1] for n in names})
                if got != expected:
                    return f"{self._name(m)}.{leaf}: trainer parts make {got}, the engine holds {expected}"
        written = set(self._copies.values()) | {
            getattr(f.module, leaf) for f in self._linears.values() for leaf in f.parts
        }
        for name, param in params.items():
            if param not in written:
                return f"{name} is not among the trainer's weights"
        for name in self._skip:
            owner, _, leaf = name.rpartition(".")
            if getattr(modules[owner], leaf) not in written:
                return f"{name}: its engine parameter is not written"
        return None

    def write(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Copy the planned tensors in, then re-pack every linear layer (weights already in the engine dtype)."""
        with torch.no_grad():
            for name, param in self._copies.items():
                param[: weights[name].shape[0]].copy_(weights[name])
            for fused in self._linears.values():
                for leaf, names in fused.parts.items():
                    value = torch.cat([weights[n] for n in names]) if len(names) > 1 else weights[names[0]].clone()
                    if leaf == "weight":
                        # the packed layers dropped their plain weight; process_weights_after_loading packs this
                        # one and drops it again
                        fused.module.weight = nn.Parameter(value.contiguous(), requires_grad=False)
                    else:
                        getattr(fused.module, leaf).copy_(value)
            for module in self._repack:
                module.quant_method.process_weights_after_loading(module)

    def _name(self, module: nn.Module) -> str:
        return next(n for n, m in self.model.named_modules() if m is module)
