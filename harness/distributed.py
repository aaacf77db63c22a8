"""One run over several processes: `torchrun --nproc_per_node=N run.py ...`, or a SLURM job with N tasks.

Data parallel, with the policy sharded by PyTorch FSDP2 (`fully_shard` on every decoder layer, then the root):
- each rank rolls out its own share of the step's prompts with its own engine, grades them and computes their
  group advantages; a group never straddles ranks, so the advantages are the single-process ones;
- each rank trains on its rows of every mini-batch; the loss is normalised by the *global* mini-batch's
  denominator and FSDP2 sums the gradients (reduce-scatter), so the update equals one process's on the same
  global batch (tests/test_distributed.py checks loss and gradients to 1e-5 on CPU, gloo backend);
- rank 0 alone evaluates, logs and writes checkpoints (full, unsharded tensors: a checkpoint resumes under any
  number of processes); the others wait for it.

With one process (no torchrun) every function here is the identity or a no-op, so `train()` has one code path.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

# How long a collective may wait for the slowest rank: rank 0's evaluation and checkpoint writes happen while
# the others wait at a barrier, and an AIME evaluation of a large model takes far longer than torch's default.
COLLECTIVE_TIMEOUT = datetime.timedelta(hours=2)


@dataclass(frozen=True)
class Dist:
    """This process's place in the run."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1


def world_size_from_env() -> int:
    """WORLD_SIZE as torchrun (or `submitit_env`) sets it; 1 when the run is a single process."""
    value = os.environ.get("WORLD_SIZE", "1").strip()
    return int(value) if value.isdigit() and int(value) > 0 else 1


def submitit_env() -> None:
    """Inside a SLURM job with several tasks (hydra/launcher=submitit_slurm, tasks_per_node > 1): export the
    RANK / WORLD_SIZE / MASTER_ADDR variables torchrun would, from SLURM's, so `setup` sees one run."""
    if "WORLD_SIZE" in os.environ or int(os.environ.get("SLURM_NTASKS", "1")) <= 1:
        return
    try:
        from submitit.helpers import TorchDistributedEnvironment
    except ImportError:
        return
    TorchDistributedEnvironment().export(set_cuda_visible_devices=False)


def setup() -> Dist:
    """Join the process group if this process is one of several (idempotent). gloo carries CPU tensors and
    Python objects everywhere; NCCL carries CUDA tensors when there are GPUs."""
    submitit_env()
    world = world_size_from_env()
    if world == 1:
        return Dist()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend, timeout=COLLECTIVE_TIMEOUT)
    return Dist(dist.get_rank(), dist.get_world_size(), local_rank)


def shard(model: nn.Module, d: Dist, param_dtype: torch.dtype | None = None) -> nn.Module:
    """FSDP2 over the ranks: each decoder layer is one unit (gathered for its own forward and backward), the root
    holds the embeddings, final norm and head. `param_dtype` (bf16 on GPU) is what the gathered weights are cast
    to for compute; gradients are reduced in fp32 and the sharded master weights stay in their own dtype."""
    if not d.active:
        return model
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from harness.models import decoder_layers

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
    for block in decoder_layers(model):
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model


def full_state_dict(model: nn.Module, d: Dist) -> dict[str, torch.Tensor]:
    """Unsharded weights under their HF names, on rank 0 (in CPU memory; the other ranks get an empty dict):
    what the rollout engine loads and a checkpoint stores. A collective: every rank must call it."""
    if not d.active:
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, d: Dist) -> dict[str, Any]:
    """The optimizer state unsharded on rank 0 (keyed by parameter name), for a checkpoint."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(model, optimizer, options=options)


def load_full_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, weights: Mapping[str, torch.Tensor], optim_state: Any
) -> None:
    """Put a full (unsharded) checkpoint into a sharded model and optimizer: each rank keeps its shard."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, dict(weights), options=options)
    set_optimizer_state_dict(model, optimizer, optim_state, options=options)


def all_sum(value: float, d: Dist) -> float:
    if not d.active:
        return value
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t, group=_cpu_group())
    return float(t.item())


def any_rank(flag: bool, d: Dist) -> bool:
    return all_sum(1.0 if flag else 0.0, d) > 0


def all_ranks(flag: bool, d: Dist) -> bool:
    return all_sum(1.0 if flag else 0.0, d) == d.world


def mean_metrics(metrics: dict[str, float], d: Dist) -> dict[str, float]:
    """Per-rank step metrics combined for the log: the mean over ranks (their shares are equal-sized), and the
    max for `*_max` keys. A key some rank lacks (no signal in its rows) is averaged over the ranks that have it."""
    if not d.active:
        return metrics
    gathered: list[dict[str, float] | None] = [None] * d.world
    dist.all_gather_object(gathered, metrics, group=_cpu_group())
    keys = sorted({k for m in gathered if m for k in m})
    out = {}
    for k in keys:
        values = [m[k] for m in gathered if m and k in m]
        out[k] = max(values) if k.endswith("_max") else sum(values) / len(values)
    return out


def gather_tensor(x: torch.Tensor, d: Dist) -> torch.Tensor:
    """Rank order concatenation along dim 0 of equal-shaped CPU tensors (rewards for the step's statistics)."""
    if not d.active:
        return x
    parts = [torch.empty_like(x) for _ in range(d.world)]
    dist.all_gather(parts, x.contiguous(), group=_cpu_group())
    return torch.cat(parts)


def barrier(d: Dist) -> None:
    if d.active:
        dist.barrier(group=_cpu_group())


def broadcast(obj: Any, d: Dist) -> Any:
    """Rank 0's `obj` on every rank."""
    if not d.active:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=_cpu_group())
    return box[0]


_GLOO: Any = None


def _cpu_group() -> Any:
    """A gloo group for CPU tensors and Python objects, also when the default backend is NCCL."""
    global _GLOO
    if _GLOO is None:
        _GLOO = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else dist.group.WORLD
    return _GLOO


def close(d: Dist | None = None) -> None:
    """Leave the process group, if this process joined one (run.py calls it once every job is done)."""
    if (d is None or d.active) and dist.is_initialized():
        dist.destroy_process_group()
