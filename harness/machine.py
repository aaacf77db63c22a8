"""Can this machine run this config? Checked after the config validates and before any model is built, so a
missing data file or model folder, or CUDA, FP8 or vLLM where they are missing, costs one line saying what is
missing and what to use instead.

`validate()` stays a pure function of the config (a sweep for a GPU cluster composes and validates anywhere);
these checks read the files the config names and probe the hardware where the job runs: in the SLURM job on the
GPU node, not on the login node that submits it.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.config import ModelConfig, RunConfig
from harness.distributed import world_size_from_env

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
    """Raise ValueError (one line: the key, what is missing, what to set instead) if `m` cannot run `run`: the
    files it names first (`check_files`), then the hardware and packages."""
    check_files(run)
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


def check_files(run: RunConfig) -> None:
    """The files a config names, read without loading a model: the model folder (its context, its layers for
    fp8_e2e and LoRA), the data and benchmark files (a .jsonl decoded once), the pass-rate pool, the reward
    model. One-line ValueError naming the key."""
    from harness.lora import check_lora_config
    from harness.reward_model import check_reward_model_path
    from harness.tasks import benchmark_sources
    from harness.tasks.loaders import check_source

    path = run.model.path
    if path is not None and run.model.build and not (Path(path).expanduser() / "config.json").is_file():
        raise ValueError(
            f"model.path: {path!r} is not built yet (model={run.model.name}); build it with {run.model.build}"
        )
    if path is not None and path.startswith(("/", ".", "~")) and not Path(path).expanduser().exists():
        raise ValueError(
            f"model.path: {path!r} does not exist (give a local model folder, a run directory or a hub id)"
        )
    if run.precision.name == "fp8_e2e" and path is not None:
        from harness.precision import fp8_unwrappable_reason

        reason = fp8_unwrappable_reason(Path(path).expanduser())
        if reason:
            raise ValueError(
                f"precision.name: fp8_e2e quantizes the trainer's nn.Linear layers and {path!r} has none ({reason}); "
                "allowed with this model: fp32, bf16, fp8_rollout"
            )
    check_lora_config(run.model, run.precision.name)
    _check_context(run)
    sources = [("benchmark.path", s) for s in benchmark_sources(run.benchmark)]  # the right number for the benchmark
    if run.data.name != "arith" and run.data.path is not None:
        sources.append(("data.path", run.data.path))
    for key, source in sources:
        try:
            check_source(source, key, read=True)
        except FileNotFoundError as e:
            raise ValueError(str(e)) from None
    pool = run.data.pool_path
    if pool is not None and not Path(pool).expanduser().is_file():
        raise ValueError(f"data.pool_path: {pool!r} does not exist (make one with python -m harness.loop.pass_rates)")
    if run.reward.kind == "reward_model" and run.reward.model_path is not None:
        check_reward_model_path(run.reward.model_path)


def _check_context(run: RunConfig) -> None:
    """The rollout's context against the model's own, read from its config.json without loading weights."""
    m = run.model
    context = model_context(m)
    if context is not None and m.max_model_len > context:
        raise ValueError(
            f"model.max_model_len: {m.max_model_len} exceeds the model's context of {context} positions "
            f"(max_position_embeddings in {m.path}); use at most {context}"
        )


def model_context(m: ModelConfig) -> int | None:
    """The model's position limit: the tiny model is built with model.max_model_len; a local folder or a hub id
    in the local cache says it in config.json (read as JSON: no weights, not even transformers' import). None
    when it cannot be read here (a hub id not cached, a run directory: checked where it is loaded)."""
    if m.path is None:
        return m.max_model_len
    path: Path | str | None = Path(m.path).expanduser() / "config.json"
    if not Path(path).is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            path = try_to_load_from_cache(m.path, "config.json")
        except ValueError:  # not a repo id
            path = None
    if not isinstance(path, str | Path):
        return None
    try:
        config = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    config = config.get("text_config") or config  # multimodal configs nest the language model's
    limit = config.get("max_position_embeddings")
    return limit if isinstance(limit, int) else None
