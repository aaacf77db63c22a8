"""Rollouts with transformers `generate`: the engine for machines without vLLM, and a second kernel stack.

The engine loads its own copy of the model in its own dtype, so its log-probs differ from the trainer's the way a
real inference engine's do. Log-probs are log_softmax(raw logits / temperature): exactly the distribution sampled
from, since top-k/top-p are off.

Sampling: the engine samples itself, inside a logits processor (`_SampleAndRecord`), and `generate` runs greedy
on the one-hot it returns. Why: `torch.multinomial` on CPU costs ~10-20x a softmax over the vocab (42 ms vs 2-5 ms
per step at 16 x 32k on one thread), and was ~30% of a rollout at a 32k vocab (bench/rl_step.py, py-spy). The
processor draws by inverse CDF (one uniform per row, a float64 cumulative sum as torch.multinomial accumulates,
a binary search), and records each step's log-probs and top-K as it goes, so no T x B x V logits are kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Mapping

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM, GenerationConfig, LogitsProcessor, LogitsProcessorList

from harness import moe
from harness.precision import StateDictTransform
from harness.quant import QuantSpec, quantize_model
from harness.rollout.base import (
    Rollout,
    RolloutEngine,
    Sampling,
    assemble_rollout,
    load_tokenizer,
    mask_through_first_eos,
    progress_bar,
)


class HFEngine(RolloutEngine):
    """RolloutEngine (and ScoringEngine) on transformers `generate`."""

    def __init__(
        self,
        model_path: str,
        dtype: torch.dtype,
        weight_transform: StateDictTransform | None = None,
        seed: int = 0,
        max_model_len: int | None = None,
        max_topk: int = 20,
        device: str = "cpu",
        quant: QuantSpec | None = None,
        logit_noise: float = 0.0,
        router_precision: str = "fp32",
    ) -> None:
        self.tokenizer, eos, self.pad_id = load_tokenizer(model_path)
        self.eos_ids = torch.tensor(eos, device=device)
        # With a transform, load fp32 and transform before the cast, exactly as a sync of fp32 trainer weights
        # would: the engine starts from the copy it would get from the trainer.
        load_dtype = torch.float32 if weight_transform is not None else dtype
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=load_dtype).to(device).eval()
        self.model.requires_grad_(False)
        # A mixture of experts: its routers record every token's experts (the rollout's routes, for replay) and
        # compute in `router_precision` (harness.moe); None for a dense model.
        self.routers = moe.routers(self.model, router_precision)
        if quant is not None:  # a W8A8-style copy: Linear inputs rounded per token at every forward (harness.quant)
            quantize_model(self.model, quant)
        if logit_noise < 0:
            raise ValueError(f"rollout.logit_noise must be >= 0, got {logit_noise}")
        # A clean generation config: a checkpoint's own (top_k=20, repetition_penalty, ...) must not leak into
        # sampling, or the returned log-probs would no longer be those of the sampling distribution.
        self.model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=self.pad_id)
        self.weight_transform = weight_transform
        self.seed = seed
        self.max_model_len = max_model_len
        self.max_topk = max_topk
        self.device = torch.device(device)
        self.logit_noise = logit_noise
        self._calls = 0
        if weight_transform is not None:
            self.sync_weights(self.model.state_dict())
            self.model.to(dtype)

    # --- weights ---
    def sync_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy trainer weights into this engine's copy (through the precision's transform, e.g. fp8 fake-quant)."""
        weights = self.weight_transform(state_dict) if self.weight_transform is not None else state_dict
        seen: set[int] = set()
        with torch.no_grad():
            for name, own in self.model.state_dict().items():
                if own.data_ptr() in seen:  # the second name of a tied tensor (lm_head.weight)
                    continue
                seen.add(own.data_ptr())
                if name not in weights:
                    raise ValueError(f"sync_weights: state_dict has no {name!r} (engine loaded from another model?)")
                own.copy_(weights[name])

    # --- sampling ---
    def sample(self, s: Sampling) -> Rollout:
        input_ids, attention_mask = self._left_pad([p for p in s.prompts for _ in range(s.n)])
        # Greedy over the processor's one-hot: the processor is the sampler (module docstring).
        config = GenerationConfig(
            do_sample=False,
            max_new_tokens=s.max_new_tokens,
            eos_token_id=self.eos_ids.tolist(),
            pad_token_id=self.pad_id,
        )
        # A private RNG stream: sampling neither depends on nor advances the trainer's global RNG.
        sampler = _SampleAndRecord(
            s.temperature,
            s.topk,
            torch.Generator(self.device).manual_seed(s.seed),
            s.top_p,
            logit_noise=self.logit_noise,
            top_k=s.top_k,
            min_p=s.min_p,
            mu=s.mu,
        )
        # One batch decodes every sequence together: its progress is in tokens, up to max_new_tokens.
        bar = progress_bar(s.progress, s.max_new_tokens, unit="token") if s.progress else None
        processors = [sampler] if bar is None else [sampler, _Tick(bar)]
        recording = self.routers.recording() if self.routers is not None else contextlib.nullcontext()
        try:
            with torch.no_grad(), recording as recorded:
                sequences = self.model.generate(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    generation_config=config,
                    logits_processor=LogitsProcessorList(processors),
                )
        finally:
            if bar is not None:
                bar.refresh()  # the steps taken, drawn once more before the bar is cleared
                bar.close()
        response_ids = sequences[:, input_ids.shape[1] :]
        logp, topk_ids, topk_logp = sampler.stacked()
        ro = assemble_rollout(
            s.prompts,
            s.n,
            response_ids.cpu(),
            mask_through_first_eos(response_ids, self.eos_ids).cpu(),
            logp.cpu(),
            topk_ids.cpu(),
            topk_logp.cpu(),
            self.eos_ids.cpu(),
            self.pad_id,
            self._decode,
        )
        if recorded is None:
            return ro
        real = torch.cat([attention_mask.cpu().bool(), ro.mask.bool()], dim=1)
        routes = moe.rollout_routes(moe.recorded_routes(recorded, len(ro.texts)), real)
        return dataclasses.replace(ro, routes=routes)

    # --- teacher forcing ---
    def score(self, prompts: list[list[int]], responses: list[list[int]], temperature: float = 1.0) -> torch.Tensor:
        """[B, T] float32 log-probs of each response token under this engine's weights; 0 past each response.

        Teacher forcing never adds `logit_noise` (that noise is a property of sampling); a quantised copy does
        score with its rounded weights and activations."""
        if len(prompts) != len(responses) or any(len(r) == 0 for r in responses):
            raise ValueError("score: need one non-empty response per prompt")
        if not temperature > 0:
            raise ValueError(f"score: temperature must be > 0, got {temperature}")
        seqs = [list(p) + list(r) for p, r in zip(prompts, responses, strict=True)]
        width = max(map(len, seqs))
        # Right padding: real tokens keep positions 0..L-1 without position_ids bookkeeping.
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
            attn[i, : len(s)] = 1
        t_max = max(map(len, responses))
        p_len = torch.tensor([len(p) for p in prompts])
        r_len = torch.tensor([len(r) for r in responses])
        # The logit at position p-1+t predicts response token t.
        pos = (p_len[:, None] - 1 + torch.arange(t_max)[None, :]).clamp(max=width - 1)
        with torch.no_grad():
            logits = self.model(input_ids=ids.to(self.device), attention_mask=attn.to(self.device)).logits
        logits = logits.gather(1, pos.to(self.device)[..., None].expand(-1, -1, logits.shape[-1]))
        targets = ids.gather(1, (pos + 1).clamp(max=width - 1)).to(self.device)
        logp = torch.log_softmax(logits.float() / temperature, dim=-1).gather(-1, targets[..., None])[..., 0]
        valid = torch.arange(t_max)[None, :] < r_len[:, None]
        return logp.cpu().masked_fill(~valid, 0.0)

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]

    # --- helpers ---
    def _left_pad(self, seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = torch.tensor([len(s) for s in seqs])
        width = int(lengths.max())
        keep = torch.arange(width)[None, :] >= (width - lengths)[:, None]
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        ids[keep] = torch.tensor([t for s in seqs for t in s], dtype=torch.long)
        return ids.to(self.device), keep.long().to(self.device)

    def _decode(self, rows: list[list[int]]) -> list[str]:
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)


class _Tick(LogitsProcessor):
    """Advances a progress bar once per decoding step; the scores pass through unchanged."""

    def __init__(self, bar: tqdm) -> None:
        self.bar = bar

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.bar.update(1)
        return scores


class _SampleAndRecord(LogitsProcessor):
    """Samples each step's token from softmax(logits / T) and records its log-prob and the sorted top-K.

    Truncation (rollout.top_k / top_p / min_p, and evaluation's top_p), applied in that order as transformers'
    warpers are: top_k keeps the k most probable tokens, top_p the smallest most-probable set covering top_p of
    what is left, min_p the tokens at least min_p times the most probable one. `mu` says what is recorded: "full"
    is log_softmax(logits / T) over the whole vocabulary (what vLLM's raw log-probs and TRL record; under
    truncation it is not the distribution sampled from, so pi/mu is biased), "truncated" is that distribution
    renormalised over the kept tokens (-inf outside them): the sampled distribution itself.

    Returns 0 at the sampled token and -inf elsewhere, so greedy decoding emits exactly that token. Rows that have
    already finished get a token too; `generate` replaces it with padding and the rollout mask drops it.
    """

    def __init__(
        self,
        temperature: float,
        k: int,
        generator: torch.Generator,
        top_p: float = 1.0,
        logit_noise: float = 0.0,
        top_k: int = 0,
        min_p: float = 0.0,
        mu: str = "full",
    ) -> None:
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.min_p = min_p
        self.mu = mu
        self.logit_noise = logit_noise
        self.k = k
        self.generator = generator
        self.logp: list[torch.Tensor] = []
        self.topk_ids: list[torch.Tensor] = []
        self.topk_logp: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        logits = scores.float()
        if self.logit_noise > 0:
            # rollout.logit_noise: an engine that samples from (and reports) logits + N(0, sigma^2) per entry, a
            # mismatch of known size that does not depend on the weights (unlike the quantised copies).
            noise = torch.randn(logits.shape, generator=self.generator, device=logits.device, dtype=logits.dtype)
            logits = logits + self.logit_noise * noise
        lp = torch.log_softmax(logits / self.temperature, dim=-1)
        # Inverse CDF. float64 accumulation (as torch.multinomial's CPU kernel) keeps the CDF's steps exact down
        # to tail probabilities ~1e-16; right=True never lands on a zero-probability token (its step is empty).
        probs = truncate(lp.exp(), self.top_k, self.top_p, self.min_p)
        if self.mu == "truncated" and probs is not None:
            lp = torch.log(probs / probs.sum(dim=-1, keepdim=True))  # -inf outside the kept set
        probs = lp.exp() if probs is None else probs
        cdf = probs.cumsum(dim=-1, dtype=torch.float64)
        u = torch.rand(cdf.shape[0], 1, generator=self.generator, device=cdf.device, dtype=torch.float64)
        tokens = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp_(max=cdf.shape[1] - 1)
        values, ids = lp.topk(self.k, dim=-1)  # sorted, largest first
        self.logp.append(lp.gather(1, tokens).squeeze(1))
        self.topk_ids.append(ids)
        self.topk_logp.append(values)
        return torch.full_like(scores, -math.inf).scatter_(1, tokens, 0.0)

    def stacked(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[B, T] sampled-token log-probs, [B, T, K] top-K ids and log-probs, on the CPU."""
        return (
            torch.stack(self.logp, dim=1).cpu(),
            torch.stack(self.topk_ids, dim=1).cpu(),
            torch.stack(self.topk_logp, dim=1).cpu(),
        )


def truncate(probs: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor | None:
    """`probs` [B, V] with the tokens top_k, top_p and min_p drop set to 0 (not renormalised), in that order;
    None when nothing truncates. The most probable token always stays."""
    if not (top_k > 0 or top_p < 1 or min_p > 0):
        return None
    if 0 < top_k < probs.shape[-1]:
        kth = probs.topk(top_k, dim=-1).values[:, -1:]
        probs = probs.masked_fill(probs < kth, 0.0)
    if top_p < 1:  # nucleus over what top_k left: drop every token the more probable ones already cover top_p without
        sorted_p, order = probs.sort(dim=-1, descending=True)
        if top_k > 0:  # what top_k kept, as a distribution (untruncated probabilities already sum to 1)
            sorted_p = sorted_p / sorted_p.sum(dim=-1, keepdim=True)
        covered = (sorted_p.cumsum(dim=-1) - sorted_p) >= top_p
        probs = probs.masked_fill(torch.zeros_like(covered).scatter_(1, order, covered), 0.0)
    if min_p > 0:
        probs = probs.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), 0.0)
    return probs
