"""One run over several processes: `torchrun --nproc_per_node=N run.py ...`, or a SLURM job with N tasks.

Data parallel, with the policy sharded by PyTorch FSDP2 (`fully_shard` on every decoder layer, then the root):
- rank 0 rolls out the step's whole batch with the one engine and hands it to every rank (`from_main`);
- each rank trains on its rows of every mini-batch; the loss is normalised by the *global* mini-batch's
  denominator and FSDP2 sums the gradients (reduce-scatter), so the update equals one process's on the same
  global batch (tests/test_distributed.py checks loss and gradients to 1e-5 on CPU, gloo backend);
- rank 0 alone evaluates and logs; the others wait for it. Checkpoints are sharded: every rank writes its own
  shards in parallel (torch.distributed.checkpoint, harness.loop.sharded), and loading reshards, so a checkpoint
  resumes under any number of processes. Only the policy folders a run exports (harness.loop.export) and the
  weight sync into rank 0's engine gather the full model.

With one process (no torchrun) `setup()` returns `SingleProcess`, whose collectives are the identity or a no-op,
so the loop has one code path and no branch on rank.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

# How long a collective may wait for the slowest rank: rank 0's evaluation and checkpoint writes happen while
# the others wait at a barrier, and an AIME evaluation of a large model takes far longer than torch's default.
COLLECTIVE_TIMEOUT = datetime.timedelta(hours=2)

T = TypeVar("T")
Restore = Callable[[Mapping[str, torch.Tensor], Any], None]


def world_size_from_env() -> int:
    """WORLD_SIZE as torchrun (or `submitit_env`) sets it; 1 when the run is a single process."""
    value = os.environ.get("WORLD_SIZE", "1").strip()
    return int(value) if value.isdigit() and int(value) > 0 else 1


def rank_from_env() -> int:
    """This process's rank under torchrun (RANK), 0 otherwise: rank 0 writes the run directory."""
    value = os.environ.get("RANK", "0").strip()
    return int(value) if value.isdigit() else 0


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


def setup() -> ProcessGroup:
    """This process's group: `SingleProcess` (every collective the identity) unless it is one of several
    (torchrun, a SLURM job with several tasks); then join the torch process group (idempotent). gloo carries CPU
    tensors and Python objects everywhere; NCCL carries CUDA tensors when there are GPUs."""
    submitit_env()
    world = world_size_from_env()
    if world == 1:
        return SingleProcess()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend, timeout=COLLECTIVE_TIMEOUT)
    return TorchGroup(dist.get_rank(), dist.get_world_size(), local_rank)


class ProcessGroup:
    """Where this process stands in the run and the collectives the loop needs. The loop calls these on every
    rank alike, so it reads the same with one process or many: rank 0 alone rolls out, evaluates, logs and
    writes checkpoints, and `from_main` hands what it made to the others."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        return obj

    def from_main(self, make: Callable[[], T]) -> T:
        """`make()` run on rank 0 only, its result on every rank (a rollout, an evaluation record)."""
        return self.broadcast(make() if self.main else None)

    def all_sum(self, value: float) -> float:
        return value

    def any(self, flag: bool) -> bool:
        return self.all_sum(1.0 if flag else 0.0) > 0

    def all(self, flag: bool) -> bool:
        return self.all_sum(1.0 if flag else 0.0) == self.world

    def mean_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Per-rank step metrics combined for the log: the mean over ranks (equal-sized shares), the max for
        `*_max` keys, the min for `*_min` keys; a key some rank lacks (no signal in its rows) is averaged over the
        ranks that have it."""
        return metrics

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Rank-order concatenation along dim 0 of equal-shaped CPU tensors."""
        return x

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's `obj` (small, picklable: RNG states), in rank order, on every rank."""
        return [obj]

    def barrier(self) -> None:
        pass

    def shard(self, model: nn.Module, param_dtype: torch.dtype | None = None) -> nn.Module:
        """FSDP2 over the ranks (see `TorchGroup.shard`); one process keeps the model whole."""
        return model

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Unsharded weights under their HF names, on rank 0 (in CPU memory; the other ranks get an empty dict):
        what the rollout engine loads and an exported policy folder holds. A collective: every rank must call it."""
        return model.state_dict()

    def restore(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> Restore | None:
        """How a one-process checkpoint's full tensors go into a sharded model and optimizer; None:
        load_state_dict."""
        return None

    def close(self) -> None:
        """Leave the process group, if this process joined one (run.py calls it once every job is done)."""


class SingleProcess(ProcessGroup):
    """One process: every collective is the identity."""


class TorchGroup(ProcessGroup):
    """One of `world` processes of a torch.distributed run (torchrun, or SLURM tasks via `submitit_env`)."""

    def __init__(self, rank: int, world: int, local_rank: int) -> None:
        self.rank, self.world, self.local_rank = rank, world, local_rank

    def broadcast(self, obj: Any) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=_cpu_group())
        return box[0]

    def all_sum(self, value: float) -> float:
        t = torch.tensor([float(value)], dtype=torch.float64)
        dist.all_reduce(t, group=_cpu_group())
        return float(t.item())

    def mean_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        gathered: list[dict[str, float] | None] = [None] * self.world
        dist.all_gather_object(gathered, metrics, group=_cpu_group())
        keys = sorted({k for m in gathered if m for k in m})
        out = {}
        for k in keys:
            values = [m[k] for m in gathered if m and k in m]
            if k.endswith("_max"):
                out[k] = max(values)
            elif k.endswith("_min"):
                out[k] = min(values)
            else:
                out[k] = sum(values) / len(values)
        return out

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(parts, x.contiguous(), group=_cpu_group())
        return torch.cat(parts)

    def gather_objects(self, obj: Any) -> list[Any]:
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, obj, group=_cpu_group())
        return gathered

    def barrier(self) -> None:
        dist.barrier(group=_cpu_group())

    def shard(self, model: nn.Module, param_dtype: torch.dtype | None = None) -> nn.Module:
        """FSDP2: each decoder layer is one unit (gathered for its own forward and backward), the root holds the
        embeddings, final norm and head. `param_dtype` (bf16 on GPU) is what the gathered weights are cast to for
        compute; gradients are reduced in fp32 and the sharded master weights stay in their own dtype."""
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        from harness.models import decoder_layers

        mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
        for block in decoder_layers(model):
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        return model

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def restore(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> Restore:
        """Every rank reads the full (one-process) checkpoint and keeps its shard."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        def load(weights: Mapping[str, torch.Tensor], optim_state: Any) -> None:
            options = StateDictOptions(full_state_dict=True)
            set_model_state_dict(model, dict(weights), options=options)
            set_optimizer_state_dict(model, optimizer, by_name(model, optimizer, optim_state), options=options)
            if not optim_state.get("state"):  # saved before any update: drop the zero-gradient step torch took
                optimizer.state.clear()  # to give the optimizer a state (harness.loop.sharded.save_shards)

        return load

    def close(self) -> None:
        close()


def by_name(model: nn.Module, optimizer: torch.optim.Optimizer, optim_state: dict[str, Any]) -> dict[str, Any]:
    """A one-process `optimizer.state_dict()` (parameters numbered in the optimizer's order) keyed by parameter
    name instead, as `set_optimizer_state_dict` wants it. The optimizer here was built over the same parameters in
    the same order (FSDP2 keeps the names); a state already keyed by name is returned as is."""
    if all(isinstance(k, str) for k in optim_state.get("state", {})):
        return optim_state
    names_of = {id(p): n for n, p in model.named_parameters()}
    names = [names_of[id(p)] for group in optimizer.param_groups for p in group["params"]]
    saved = sum(len(g["params"]) for g in optim_state["param_groups"])
    if saved != len(names):
        raise ValueError(f"the checkpoint's optimizer has {saved} parameters, this one {len(names)}")
    return {
        "state": {names[i]: slots for i, slots in optim_state["state"].items()},
        "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in optim_state["param_groups"]],
    }


_GLOO: Any = None


def _cpu_group() -> Any:
    """A gloo group for CPU tensors and Python objects, also when the default backend is NCCL."""
    global _GLOO
    if _GLOO is None:
        _GLOO = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else dist.group.WORLD
    return _GLOO


def close() -> None:
    """Leave the process group, if this process joined one (run.py calls it once every job is done). Every rank
    meets at a barrier first: a rank that tore down its gloo pairs while its peer was still busy (saving, say)
    aborted at exit with "terminate called without an active exception" (3 of 15 two-process runs, measured)."""
    global _GLOO
    if dist.is_initialized():
        dist.barrier(group=_cpu_group())
        _GLOO = None
        dist.destroy_process_group()
