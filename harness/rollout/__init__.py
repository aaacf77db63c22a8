"""Rollout engines: one base class (`RolloutEngine`), two implementations (HF generate, vLLM), one factory."""

from __future__ import annotations

from typing import Any

import torch

from harness import precision as precisions
from harness.rollout.base import Rollout, RolloutEngine, ScoringEngine
from harness.rollout.hf import HFEngine

ENGINES = ("hf", "vllm")
# Settings only vLLM has; the HF engine ignores them so one call site serves both engines.
_VLLM_ONLY = ("kv_cache_gb", "enforce_eager", "gpu_memory_utilization", "cpu_threads", "tensor_parallel_size", "sleep")

__all__ = ["ENGINES", "HFEngine", "Rollout", "RolloutEngine", "ScoringEngine", "engine_from_config", "make_engine"]


def make_engine(kind: str, model_path: str, precision: str, seed: int, max_model_len: int, **kw: Any) -> RolloutEngine:
    """Build a rollout engine whose weight copy follows `precision` (see harness/precision.py).

    kw go to the engine: max_topk, device ("cpu" or "cuda"; default: cuda if available), and for vLLM
    kv_cache_gb, enforce_eager, gpu_memory_utilization.
    """
    if kind not in ENGINES:
        raise ValueError(f"rollout engine: unknown {kind!r}; allowed: {', '.join(ENGINES)}")
    spec = precisions.get(precision)
    device = kw.pop("device", None) or ("cuda" if torch.cuda.is_available() else "cpu")
    scale_refresh = kw.pop("scale_refresh", 1)
    if kind == "hf":
        for key in _VLLM_ONLY:
            kw.pop(key, None)
        return HFEngine(
            model_path,
            spec.rollout_dtype,
            precisions.rollout_weight_transform(precision, scale_refresh),
            seed,
            max_model_len=max_model_len,
            device=device,
            quant=spec.rollout_quant,
            **kw,
        )
    if spec.rollout_quant is not None:
        raise ValueError(f"precision.name: {precision} quantises activations, which only rollout=hf simulates")
    if kw.pop("logit_noise", 0.0):
        raise ValueError("rollout.logit_noise: only rollout=hf adds logit noise")
    if kw.pop("router_precision", "fp32") != "fp32":
        raise ValueError("rollout.router_precision: only rollout=hf emulates a low-precision router")
    from harness.rollout.vllm import VLLMEngine

    vllm_kw = precisions.vllm_kwargs(precision, device)
    # vLLM's own fp8 (GPU) quantizes the copy itself; fake-quant on top would round twice.
    if "quantization" in vllm_kw and scale_refresh != 1:
        raise ValueError("rollout.scale_refresh: vLLM's own fp8 on a GPU sets its scales itself; use 1 or rollout=hf")
    transform = None if "quantization" in vllm_kw else precisions.rollout_weight_transform(precision, scale_refresh)
    return VLLMEngine(
        model_path,
        vllm_kw["dtype"],
        transform,
        seed,
        max_model_len=max_model_len,
        quantization=vllm_kw.get("quantization"),
        device=device,
        **kw,
    )


def engine_from_config(rollout: Any, model_path: str, precision: str, seed: int, max_model_len: int, device: str):
    """`make_engine` with the settings of a `rollout` config group (harness.config.RolloutConfig)."""
    return make_engine(
        rollout.engine,
        model_path,
        precision,
        seed=seed,
        max_model_len=max_model_len,
        max_topk=rollout.max_topk,
        device=device,
        kv_cache_gb=rollout.kv_cache_gb,
        enforce_eager=rollout.enforce_eager,
        gpu_memory_utilization=rollout.gpu_memory_utilization,
        cpu_threads=rollout.threads,
        tensor_parallel_size=rollout.tensor_parallel_size,
        sleep=rollout.sleep,
        logit_noise=rollout.logit_noise,
        scale_refresh=rollout.scale_refresh,
        router_precision=rollout.router_precision,
    )
