"""Rollouts with vLLM, in-process, holding its own weight copy (stack.md section 5).

vLLM is imported only when an engine is built, so `import harness` works without the `vllm` extra.

Choices and the vLLM 0.32 facts behind them:
- In-process engine core (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): the vLLM weight-sync path that works on CPU is a
  direct call to the worker's `reload_weights(weights_iterator=...)`; `load_weights` fails (CPU replaces the
  Parameters) and the multiprocess RPC cannot pickle tensors. Tied models need `lm_head.weight` in the iterator.
  On CPU the engine writes the tensors into the model itself instead (`vllm_cpu_weights.py`: the same packed
  weights, bit for bit, at a third of the cost), and keeps `reload_weights` for any model that writer does not
  cover exactly (`direct_sync_refused` says why).
- `logprobs_mode="processed_logprobs"`: log_softmax of the logits after temperature, top-k/top-p and min-p. With
  top_k=0 (0 = off in 0.32; -1 is accepted too), top_p=1 and min_p=0 that is log_softmax(raw logits / T), the
  distribution sampled from, as the Rollout contract asks. The default `raw_logprobs` ignores the temperature;
  at T=1 the two are identical. Truncated sampling would make processed log-probs renormalised (P5); this engine
  never truncates.
- `flat_logprobs=True`: each position holds exactly K+1 entries, [sampled, rank 1..K], duplicates kept, so a
  response's log-probs reshape to [L, K+1] without building a dict per token.
- `detokenize=False`: no per-token text work in vLLM (it would also decode every top-K candidate); responses are
  decoded once with the HF tokenizer, as in the HF engine.
- One seed per prompt, hashed from the call's seed (vLLM gives child j of a request seed + j): requests sharing
  a seed draw the same noise, so their samples would be correlated; and `seed + i * n` would make calls with
  consecutive seeds (the trainer passes base + step) replay each other's samples shifted by one child.
- An in-process CPU engine touches process state: it replaces `torch.set_num_threads` with a no-op, reseeds the
  global RNGs, and its sampler draws from the global torch RNG. The engine restores the first two after start-up
  and forks the RNG around generate, so building or using it leaves the trainer's threads and RNG stream alone.
- On a GPU the engine shares the device with the trainer (colocated, as in verl): with `sleep=True` it is built
  with vLLM's sleep mode and sleeps (weights offloaded to CPU, KV cache freed) between its calls, so training has
  the memory; each generate or weight sync wakes it first. With `tensor_parallel_size > 1` vLLM runs its own worker
  processes, and a weight sync sends the tensors to them with `collective_rpc("reload_weights")`, the call the
  in-process path makes directly. (Written to vLLM 0.32's API; no GPU was available to run these paths here.)
- CPU generate runs with `cpu_threads` (default 1) torch threads, then restores the trainer's count. vLLM serves
  with one thread for the same reason: its decode loop is many small ops between Python scheduling, and idle
  OMP workers spin. Measured on the 2-core machine, 64 prompts x 8 x 24 tokens, vocab 1k: about 4k tok/s with
  one thread vs 0.8-1.5k with two.
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from harness.precision import StateDictTransform
from harness.rollout.base import (
    Rollout,
    RolloutEngine,
    Sampling,
    assemble_rollout,
    load_tokenizer,
    pad_ragged,
    progress_bar,
)
from harness.rollout.vllm_cpu_weights import CPUWeightWriter

_MISSING = "rollout=vllm needs the vllm extra (pip install -e '.[vllm]'); use rollout=hf instead"


class VLLMEngine(RolloutEngine):
    """RolloutEngine (and ScoringEngine) on an in-process `vllm.LLM`."""

    def __init__(
        self,
        model_path: str,
        dtype: torch.dtype | str,
        weight_transform: StateDictTransform | None = None,
        seed: int = 0,
        max_model_len: int = 1024,
        gpu_memory_utilization: float | None = None,
        kv_cache_gb: float = 1,
        enforce_eager: bool = True,
        quantization: str | None = None,
        max_topk: int = 20,
        device: str = "cpu",
        cpu_threads: int | None = 1,
        tensor_parallel_size: int = 1,
        sleep: bool = False,
    ) -> None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        # ERROR: on CPU vLLM warns at every weight sync (rotary buffers are not weights) and about missing
        # tcmalloc/triton; those lines would bury the progress bar. VLLM_LOGGING_LEVEL=INFO brings them back.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        try:
            import vllm
        except ImportError:
            raise ImportError(_MISSING) from None
        self._vllm = vllm
        self.tokenizer, eos, self.pad_id = load_tokenizer(model_path)
        self.eos_ids = torch.tensor(eos)
        self.weight_transform = weight_transform
        self.seed = seed
        self.max_model_len = max_model_len
        self.max_topk = max_topk
        self._calls = 0
        self._threads = cpu_threads if device == "cpu" else None
        gpu = device.startswith("cuda")
        self._tp = tensor_parallel_size
        # CPU, one process, unquantized: weight syncs write straight into the model (vllm_cpu_weights.py) once a
        # plan covers it; otherwise, and on GPU, vLLM's reload_weights.
        self._direct_ok = device == "cpu" and tensor_parallel_size == 1 and quantization is None
        self._writer: CPUWeightWriter | None = None
        self.direct_sync_refused: str | None = None
        self._sleep_mode = sleep and gpu
        self._asleep = False
        memory = _memory(gpu, kv_cache_gb, gpu_memory_utilization, tensor_parallel_size, self._sleep_mode)
        self.llm = _start_llm(
            vllm, model=model_path, dtype=dtype, seed=seed, max_model_len=max_model_len, enforce_eager=enforce_eager,
            quantization=quantization, max_logprobs=max_topk, **memory,
        )  # fmt: skip
        self._dtype = self.llm.llm_engine.model_config.dtype
        self._tied = bool(getattr(self.llm.llm_engine.model_config.hf_config, "tie_word_embeddings", False))
        if weight_transform is not None:
            self._reload(weight_transform(_hf_state_dict(model_path)))

    # --- weights ---
    def sync_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy trainer weights into vLLM's copy (through the precision's transform) and drop cached prefixes."""
        self._reload(self.weight_transform(state_dict) if self.weight_transform is not None else state_dict)
        self._sleep()

    def _reload(self, weights: Mapping[str, torch.Tensor]) -> None:
        weights = dict(weights)
        if self._tied and "lm_head.weight" not in weights:
            # vLLM's tied head reports "Failed to load weights" and keeps stale values without it (stack.md).
            weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
        self._wake()
        if self._tp == 1:  # in-process worker: hand it the tensors, no copy through a pipe
            worker = self.llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker
            if self._direct_ok and self._writer is None:
                writer = CPUWeightWriter(worker.model_runner.get_model())
                self.direct_sync_refused = writer.plan(weights)
                self._writer = writer if self.direct_sync_refused is None else None
                self._direct_ok = self._writer is not None
            if self._writer is not None:
                from vllm.config import set_current_vllm_config

                with set_current_vllm_config(worker.vllm_config):
                    self._writer.write(dict(self._cast(weights)))
            else:
                worker.reload_weights(weights_iterator=self._cast(weights))
        else:  # vLLM's own worker processes, one per GPU: each loads its shard from the full tensors
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(self._cast(weights))})
        self.llm.reset_prefix_cache()

    def _wake(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def _sleep(self) -> None:
        """Level 1: weights to CPU memory, KV cache dropped; the next call wakes the engine (GPU, sleep=True)."""
        if self._sleep_mode and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def _cast(self, weights: Mapping[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
        # Sending the engine dtype avoids vLLM's per-tensor dtype-mismatch warning and a second cast inside it.
        for name, t in weights.items():
            yield name, (t.detach().to(self._dtype) if t.is_floating_point() else t.detach())

    # --- sampling ---
    def sample(self, s: Sampling) -> Rollout:
        if s.mu == "full" and (s.top_k > 0 or s.min_p > 0):
            raise ValueError("generate: mu=full under top_k/min_p is recorded by the HF engine only; use mu=truncated")
        params = [
            self._sampling_params(s.n, s.max_new_tokens, s.topk, s.temperature, int(k), s.top_p, s.top_k, s.min_p)
            for k in np.random.SeedSequence(s.seed).generate_state(len(s.prompts))
        ]
        # Only where it shows: vLLM divides by a disabled bar's elapsed time (0) to print its speeds.
        bar = sample_bar(s.progress, len(s.prompts) * s.n) if s.progress and sys.stderr.isatty() else None
        outputs = self._run(s.prompts, params, bar)
        ids, logps, top_ids, top_logps = [], [], [], []
        for out in outputs:
            for sample in sorted(out.outputs, key=lambda s: s.index):
                length = len(sample.token_ids)
                flat = sample.logprobs
                entries = np.asarray(flat.token_ids, dtype=np.int64).reshape(length, s.topk + 1)
                values = np.asarray(flat.logprobs, dtype=np.float32).reshape(length, s.topk + 1)
                ids.append(np.asarray(sample.token_ids, dtype=np.int64))
                logps.append(values[:, 0])
                top_ids.append(entries[:, 1:])
                top_logps.append(values[:, 1:])
        response_ids = pad_ragged(ids, self.pad_id, torch.long)
        mask = pad_ragged([np.ones(len(r), dtype=np.float32) for r in ids], 0.0, torch.float32)
        return assemble_rollout(
            s.prompts,
            s.n,
            response_ids,
            mask,
            pad_ragged(logps, 0.0, torch.float32),
            pad_ragged(top_ids, 0, torch.long),
            pad_ragged(top_logps, 0.0, torch.float32),
            self.eos_ids,
            self.pad_id,
            self._decode,
        )

    def _sampling_params(
        self,
        n: int,
        max_new_tokens: int,
        topk: int,
        temperature: float,
        seed: int,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
    ) -> Any:
        # Truncation (top_p < 1, top_k, min_p) only for evaluation and for the rollout.mu=truncated mismatch model:
        # the processed log-probs are then renormalised over the kept tokens, the distribution sampled from.
        return self._vllm.SamplingParams(
            n=n,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            max_tokens=max_new_tokens,
            logprobs=topk,
            seed=seed,
            stop_token_ids=self.eos_ids.tolist(),
            detokenize=False,
            flat_logprobs=True,
        )

    # --- teacher forcing ---
    def score(self, prompts: list[list[int]], responses: list[list[int]], temperature: float = 1.0) -> torch.Tensor:
        """[B, T] float32 log-probs of each response token (vLLM prompt log-probs); 0 past each response."""
        if len(prompts) != len(responses) or any(len(r) == 0 for r in responses):
            raise ValueError("score: need one non-empty response per prompt")
        if temperature != 1.0:
            raise ValueError(f"score: vLLM prompt log-probs ignore temperature; only 1.0 is allowed, got {temperature}")
        seqs = [list(p) + list(r) for p, r in zip(prompts, responses, strict=True)]
        params = self._vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False, flat_logprobs=True)
        outputs = self._run(seqs, [params] * len(seqs))
        rows = []
        for out, p, r in zip(outputs, prompts, responses, strict=True):
            # Position 0 has no log-prob, every later position exactly one: flat index j is position j + 1.
            values = np.asarray(out.prompt_logprobs.logprobs, dtype=np.float32)
            rows.append(values[len(p) - 1 : len(p) - 1 + len(r)])
        return pad_ragged(rows, 0.0, torch.float32)

    def _run(self, prompts: list[list[int]], params: list[Any], bar: Callable[..., Any] | None = None) -> list[Any]:
        from vllm.inputs import TokensPrompt

        self._wake()
        threads = torch.get_num_threads()
        if self._threads is not None:
            torch.set_num_threads(self._threads)
        try:
            # The CPU sampler draws from the global torch RNG even for seeded requests: keep that off the trainer.
            with torch.random.fork_rng(devices=[]):
                return self.llm.generate(
                    [TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=bar or False
                )
        finally:
            torch.set_num_threads(threads)
            self._sleep()

    def _decode(self, rows: list[list[int]]) -> list[str]:
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)

    def close(self) -> None:
        """Shut the engine core down (frees the KV cache and vLLM's distributed state, so another can start)."""
        if getattr(self, "llm", None) is not None:
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None


def _hf_state_dict(model_path: str) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under HF names, to push through a weight transform once at start-up."""
    from transformers import AutoModelForCausalLM

    return dict(AutoModelForCausalLM.from_pretrained(model_path).state_dict())


def sample_bar(label: str, samples: int) -> Callable[..., Any]:
    """vLLM's `use_tqdm` hook, counting samples: vLLM advances its bar by a finished request's n samples and sizes
    it by its unfinished requests (which count the n samples in 0.32, not in every version), so the total here is
    ours (prompts x n), and so are the label and the quiet defaults.
    vLLM also wraps the (quick) adding of the requests with it: that iterable passes through without a bar."""

    def make(*iterable: Any, **vllm_kwargs: Any) -> Any:
        if iterable:
            return iterable[0]
        bar = progress_bar(label, samples, unit="sample")
        bar.postfix = vllm_kwargs.get("postfix")  # vLLM's running token speeds
        return bar

    return make


def _start_llm(vllm: Any, **kw: Any) -> Any:
    """`vllm.LLM(**kw)` with the harness's fixed settings. The engine's start may replace `torch.set_num_threads`,
    change the thread count and draw from the global RNGs; all are put back, so that the trainer's threads and a
    fixed-seed run's draws do not depend on an engine having started."""
    set_threads, threads = torch.set_num_threads, torch.get_num_threads()
    rng = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        return vllm.LLM(
            logprobs_mode="processed_logprobs",
            use_tqdm_on_load=False,
            # Chunked prefill splits a long prompt across engine steps, and with per-request seeds the CPU
            # sampler then fails ("CPU Generator does not use offset"): AIME-length prompts hit it.
            enable_chunked_prefill=False,
            **kw,
        )
    finally:
        torch.set_num_threads = set_threads
        set_threads(threads)
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.set_rng_state(rng[2])


def _memory(gpu: bool, kv_cache_gb: float, utilization: float | None, tp: int, sleep_mode: bool) -> dict[str, Any]:
    """vLLM's memory keywords: a KV cache of fixed size, or on a GPU a share of its memory when one is given;
    tensor parallelism and sleep mode exist only there."""
    memory: dict[str, Any] = {"kv_cache_memory_bytes": int(kv_cache_gb * 2**30)}
    if gpu and utilization is not None:
        memory = {"gpu_memory_utilization": utilization}
    if gpu:
        memory |= {"tensor_parallel_size": tp, "enable_sleep_mode": sleep_mode}
    return memory
