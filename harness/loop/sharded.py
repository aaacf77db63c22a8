"""The sharded checkpoint format of multi-process runs: `torch.distributed.checkpoint` (DCP).

Every rank writes its own shard of the model and optimizer into the checkpoint folder at the same time (no rank
ever holds the whole model or optimizer); DCP's `.metadata` file records which slice of which tensor each file
holds, so loading reshards: a checkpoint written by N processes loads under M processes, or in one process with
no process group at all. Tensors are keyed by their parameter names (`get_state_dict` strips FSDP's wrapping), so
they do not depend on how the model was sharded.

    checkpoints/step_<k>/.metadata        DCP's index: every tensor's global shape and where its pieces are
    checkpoints/step_<k>/__<rank>_0.distcp  one file per writing rank: its shards of the model and the optimizer
    checkpoints/step_<k>/state.pt         counters and every rank's RNG streams (harness.loop.checkpoint)

Under LoRA the model part holds the adapters only, as the one-process format does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from harness.lora import adapter_state_dict

METADATA = ".metadata"  # DCP's index file: its presence marks a sharded checkpoint
KEY = "train"  # the Stateful's key: tensors are stored as train.model.<name>, train.optim.state.<name>.<slot>


class TrainState(Stateful):
    """Model + optimizer as DCP saves and loads them: `get_state_dict` gives each rank's shards under parameter
    names, `set_state_dict` puts loaded (resharded) values back into the live FSDP2 or plain modules."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, adapters_only: bool = False) -> None:
        self.model, self.optimizer, self.adapters_only = model, optimizer, adapters_only

    def state_dict(self) -> dict[str, Any]:
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        if self.adapters_only:  # the frozen base is the model folder the run started from
            model_state = adapter_state_dict(model_state)
        return {"model": model_state, "optim": optim_state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
            options=StateDictOptions(strict=not self.adapters_only),
        )


def is_sharded(folder: Path) -> bool:
    return (folder / METADATA).is_file()


def save_shards(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer, adapters_only: bool) -> bool:
    """This rank's shards into `folder` (an existing folder every rank names alike). A collective: every rank
    calls it; DCP fsyncs its files, and a failed write on any rank raises on every rank.

    Returns whether the optimizer had taken no step yet. `get_state_dict` gives such an optimizer a state by
    stepping it once with zero gradients and lr 0, which counts a step: Adam's next real update would then be
    bias-corrected as its second. That state is saved (so the checkpoint has every key) and dropped here again;
    `load_shards(fresh=True)` drops it after loading."""
    fresh = not optimizer.state
    dcp.save({KEY: TrainState(model, optimizer, adapters_only)}, checkpoint_id=folder)
    if fresh:
        optimizer.state.clear()
    return fresh


def load_shards(
    folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer, adapters_only: bool, fresh: bool = False
) -> None:
    """Model and optimizer from `folder`, resharded to this process group (or to one process without one). The
    loaded values go straight into the live tensors, so a failure may leave them partly loaded. `fresh`: the
    saved optimizer had taken no step (`save_shards`)."""
    dcp.load({KEY: TrainState(model, optimizer, adapters_only)}, checkpoint_id=folder)
    if fresh:
        optimizer.state.clear()


def read_model(folder: Path) -> dict[str, torch.Tensor]:
    """The model tensors of a sharded checkpoint as one full state dict, in this process alone (eval-only runs):
    shapes and dtypes come from the checkpoint's own metadata, so no model is needed to read it."""
    prefix = f"{KEY}.model."
    meta = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    tensors = {
        name[len(prefix) :]: torch.empty(m.size, dtype=m.properties.dtype)
        for name, m in meta.items()
        if name.startswith(prefix) and isinstance(m, TensorStorageMetadata)
    }
    if not tensors:
        raise ValueError(f"checkpoint {folder} holds no model tensors")
    dcp.load({KEY: {"model": tensors}}, checkpoint_id=folder, no_dist=True)
    return tensors
