"""Can this machine run this config? Checked after the config validates and before any model is built, so asking
for CUDA, FP8 or vLLM where they are missing costs one line saying what is missing and what to use instead.

`validate()` stays a pure function of the config (a sweep for a GPU cluster composes and validates anywhere);
this check runs where the job runs: in the SLURM job on the GPU node, not on the login node that submits it.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import torch

from harness.config import RunConfig
from harness.loop.distributed import world_size_from_env

# torchao's float8 training (fp8_e2e on GPU) and vLLM's fp8 weights run on Ada/Hopper and newer (sm_89+).
FP8_MIN_CAPABILITY = (8, 9)


@dataclass(frozen=True)
class Machine:
    cuda: bool
    gpus: int
    capability: tuple[int, int] | None
    """of GPU 0"""
    vllm: bool
    torchao: bool
    world: int = 1
    """processes in this run (torchrun's WORLD_SIZE)"""
    local_world: int = 1
    """processes of this run on this node (torchrun's LOCAL_WORLD_SIZE)"""


def probe() -> Machine:
    cuda = torch.cuda.is_available()
    return Machine(
        cuda=cuda,
        gpus=torch.cuda.device_count() if cuda else 0,
        capability=torch.cuda.get_device_capability(0) if cuda else None,
        vllm=importlib.util.find_spec("vllm") is not None,
        torchao=importlib.util.find_spec("torchao") is not None,
        world=world_size_from_env(),
        local_world=int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1),
    )


def check(run: RunConfig, m: Machine) -> None:
    """Raise ValueError (one line: the key, what is missing, what to set instead) if `m` cannot run `run`."""
    r, p = run.rollout, run.precision.name
    if run.device == "cuda" and not m.cuda:
        raise ValueError(
            f"device: cuda, but this machine has no usable CUDA device (torch {torch.__version__}); use device=cpu"
        )
    if r.engine == "vllm" and not m.vllm:
        raise ValueError(
            "rollout.engine: vllm is not installed here (pip install vllm on GPU, or the vllm extra on CPU); "
            "use rollout=hf"
        )
    if r.tensor_parallel_size > 1:
        if run.device != "cuda" or r.engine != "vllm":
            raise ValueError(
                f"rollout.tensor_parallel_size: {r.tensor_parallel_size} shards vLLM over GPUs and needs "
                "device=cuda rollout=vllm; use rollout.tensor_parallel_size=1"
            )
        if r.tensor_parallel_size > m.gpus:
            raise ValueError(
                f"rollout.tensor_parallel_size: {r.tensor_parallel_size} is more than the {m.gpus} visible GPU(s); "
                f"use at most {m.gpus}"
            )
        if m.world > 1:
            raise ValueError(
                f"rollout.tensor_parallel_size: {r.tensor_parallel_size} under torchrun ({m.world} processes); each "
                "process holds its own engine, so use rollout.tensor_parallel_size=1 (or one process per run)"
            )
    if run.device == "cuda" and p in ("fp8_rollout", "fp8_e2e"):
        cap = m.capability or (0, 0)
        if cap < FP8_MIN_CAPABILITY:
            raise ValueError(
                f"precision.name: {p} needs a GPU with FP8 support (compute capability 8.9+, e.g. L40S, H100); this "
                f"one is {cap[0]}.{cap[1]}; use precision=bf16"
            )
        if p == "fp8_e2e" and not m.torchao:
            raise ValueError(
                "precision.name: fp8_e2e on GPU trains through torchao's float8 linears and torchao is not installed "
                "(pip install torchao); use precision=fp8_rollout or bf16"
            )
    if m.world > 1:
        if run.device == "cuda" and m.local_world > m.gpus:
            raise ValueError(
                f"device: {m.local_world} processes on this node but {m.gpus} visible GPU(s); one GPU per process "
                f"(torchrun --nproc_per_node={m.gpus})"
            )
        t = run.trainer
        if t.prompts_per_step % m.world or (t.prompts_per_step // m.world * t.group_size) % t.minibatches:
            raise ValueError(
                f"trainer.prompts_per_step: {t.prompts_per_step} prompts must split over {m.world} processes into "
                f"equal shares whose rows ({t.group_size} per prompt) divide into {t.minibatches} mini-batches"
            )
