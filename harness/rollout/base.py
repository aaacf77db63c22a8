"""The batch every rollout engine returns, the engine protocol, and the tensor assembly both engines share.

Log-prob convention (objectives.md P5): `behavior_logp` and `topk_logp` are log_softmax(logits / temperature)
of the engine's own forward, with no top-k/top-p truncation (the engines sample with top_k off, top_p 1).
Top-K convention (objectives.md section 3, SRL): the K highest-probability tokens of mu, sorted; if the sampled
token is not among them it overwrites the K-th entry, so the set always has exactly K entries and stays sorted
(a token outside the top-K is never more probable than the K-th).
"""

from __future__ import annotations

import logging
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import torch
from tqdm import tqdm

if TYPE_CHECKING:  # transformers costs seconds to import; the Top-K helpers and the protocol do not need it
    from transformers import PreTrainedTokenizerBase


logger = logging.getLogger(__name__)


@dataclass
class Rollout:
    """B = len(prompts) * n sequences; a prompt's n samples are contiguous. T = longest response."""

    prompt_ids: list[list[int]]
    """[B] unpadded prompt token ids"""
    response_ids: torch.Tensor
    """[B, T] int64, right-padded with the pad token id"""
    mask: torch.Tensor
    """[B, T] float32, 1.0 on generated tokens (the EOS token included when one was produced)"""
    behavior_logp: torch.Tensor
    """[B, T] float32, engine log-prob of each sampled token; 0 at padding"""
    topk_ids: torch.Tensor
    """[B, T, K] int64, the engine's top-K token ids, sampled token forced in (SRL); 0 at padding"""
    topk_logp: torch.Tensor
    """[B, T, K] float32, engine log-probs of topk_ids; 0 at padding"""
    finished: torch.Tensor
    """[B] bool, True if the response ended with an EOS token (not truncated)"""
    group: torch.Tensor
    """[B] int64, index of the prompt each sequence came from"""
    texts: list[str]
    """[B] decoded responses, special tokens skipped"""
    routes: torch.Tensor | None = None
    """[B, P + T, L, k] int16, mixture-of-experts models on the HF engine: the experts each token (prompt
    left-padded to the longest, P, then the response) was routed to in each MoE layer, -1 where none (harness.moe)"""


@dataclass(frozen=True)
class Sampling:
    """One `generate` call, its arguments checked and its seed decided: what an engine's `sample` draws."""

    prompts: list[list[int]]
    n: int
    max_new_tokens: int
    topk: int
    temperature: float
    seed: int
    top_p: float
    progress: str | None
    top_k: int = 0
    min_p: float = 0.0
    mu: str = "full"
    """under truncation: "full" = log-probs over the whole vocabulary, "truncated" = renormalised over the kept set"""


class RolloutEngine(ABC):
    """What samples rollouts. `generate` is shared: it checks the arguments and, when no seed is given, derives one
    from the engine's seed and its call count (`call_seed`), so a fixed-seed run samples the same rollouts; each
    engine's `sample` draws them. Engines set `seed`, `max_topk`, `max_model_len` and `_calls = 0`."""

    seed: int
    max_topk: int
    max_model_len: int | None
    _calls: int

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        max_new_tokens: int,
        topk: int = 1,
        temperature: float = 1.0,
        seed: int | None = None,
        top_p: float = 1.0,
        progress: str | None = None,
        top_k: int = 0,
        min_p: float = 0.0,
        mu: str = "full",
    ) -> Rollout:
        """`top_p` < 1 samples from the nucleus (evaluation: the DPPO paper's top-p 0.95); the returned log-probs are
        then not the sampled distribution's (HF: log_softmax(logits / T) over the whole vocabulary; vLLM: processed,
        renormalised over the nucleus), so training rollouts keep top_p = 1 (objectives.md P5) unless they emulate
        truncated sampling on purpose: `top_k` (0 = off), `min_p` and `mu` ("full" or "truncated", HF only: see
        `Sampling`) are the rollout.top_k / min_p / mu mismatch model. `progress`: a label for a progress bar on
        stderr while the call runs (`progress_bar`; evaluation sets it)."""
        check_generate_args(prompts, n, max_new_tokens, topk, temperature, self.max_topk, self.max_model_len, top_p)
        if top_k < 0 or not 0 <= min_p < 1 or mu not in ("full", "truncated"):
            raise ValueError(
                f"generate: top_k must be >= 0, min_p in [0, 1), mu full or truncated; got {top_k}, {min_p}, {mu!r}"
            )
        if seed is None:
            seed = call_seed(self.seed, self._calls)
        self._calls += 1
        return self.sample(
            Sampling(prompts, n, max_new_tokens, topk, temperature, seed, top_p, progress, top_k, min_p, mu)
        )

    @abstractmethod
    def sample(self, s: Sampling) -> Rollout: ...

    @abstractmethod
    def sync_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None: ...

    @abstractmethod
    def close(self) -> None: ...


@runtime_checkable
class ScoringEngine(Protocol):
    """Optional extension: teacher-forced log-probs of given responses under the engine's weights.

    Check with `isinstance(engine, ScoringEngine)`; both built-in engines implement it.
    """

    def score(self, prompts: list[list[int]], responses: list[list[int]], temperature: float = 1.0) -> torch.Tensor:
        """[B, T] float32 log-prob of responses[b][t] given prompts[b] + responses[b][:t]; 0 past each response."""
        ...


def check_generate_args(
    prompts: Sequence[Sequence[int]],
    n: int,
    max_new_tokens: int,
    topk: int,
    temperature: float,
    max_topk: int,
    max_model_len: int | None,
    top_p: float = 1.0,
) -> None:
    """The same bad-input errors from every engine (house rule: one-line ValueError naming the argument)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate: prompts must be a non-empty list of non-empty token id lists")
    if n < 1:
        raise ValueError(f"generate: n must be >= 1, got {n}")
    if max_new_tokens < 1:
        raise ValueError(f"generate: max_new_tokens must be >= 1, got {max_new_tokens}")
    if not 1 <= topk <= max_topk:
        raise ValueError(f"generate: topk must be in [1, max_topk={max_topk}], got {topk}")
    if not temperature > 0:
        raise ValueError(f"generate: temperature must be > 0 (the engines always sample), got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"generate: top_p must be in (0, 1], got {top_p}")
    longest = max(len(p) for p in prompts)
    if max_model_len is not None and longest + max_new_tokens > max_model_len:
        raise ValueError(
            f"generate: longest prompt ({longest}) + max_new_tokens ({max_new_tokens}) exceeds "
            f"max_model_len={max_model_len}"
        )


def progress_bar(label: str, total: int, unit: str) -> tqdm:
    """The bar of a long generate call: on stderr, only on a terminal (so tests and log files stay quiet), and
    removed when done (leave=False) so that the training loop's own bar, which tqdm keeps on the line above, stays
    as it was."""
    return tqdm(total=total, desc=label, unit=unit, leave=False, dynamic_ncols=True, disable=None, file=sys.stderr)


@dataclass(frozen=True)
class EvalSettings:
    """How a held-out evaluation samples: `n` completions per problem, `seed` (the step's: harness.loop.evaluate),
    `top_p` < 1 for the papers' nucleus evaluation; `samples_to_keep` completions go to samples.jsonl;
    `truncate_prompts`: prompts too long for the engine keep their last tokens instead of being an error."""

    n: int
    max_new_tokens: int
    temperature: float
    seed: int
    top_p: float = 1.0
    samples_to_keep: int = 0
    truncate_prompts: bool = False


def sample_eval(engine: Any, prompt_ids: Sequence[list[int]], s: EvalSettings) -> tuple[Rollout, int]:
    """(the evaluation's rollout, how many prompts were cut to fit), with a progress bar labelled by its size."""
    prompts, n_cut = fit_prompts(
        prompt_ids, getattr(engine, "max_model_len", None), s.max_new_tokens, s.truncate_prompts
    )
    ro = engine.generate(
        prompts, n=s.n, max_new_tokens=s.max_new_tokens, topk=1, temperature=s.temperature, seed=s.seed,
        top_p=s.top_p, progress=f"eval {len(prompts)} problems x {s.n}",
    )  # fmt: skip
    return ro, n_cut


def fit_prompts(
    prompt_ids: Sequence[list[int]], max_model_len: int | None, max_new_tokens: int, truncate: bool
) -> tuple[list[list[int]], int]:
    prompts = [list(p) for p in prompt_ids]
    if max_model_len is None:
        return prompts, 0
    room = max_model_len - max_new_tokens
    too_long = sum(len(p) > room for p in prompts)
    if not too_long:
        return prompts, 0
    longest = max(len(p) for p in prompts)
    if not truncate or room < 1:
        raise ValueError(
            f"eval: {too_long} prompt(s) up to {longest} tokens do not fit model.max_model_len={max_model_len} "
            f"minus max_new_tokens={max_new_tokens}; raise model.max_model_len or set eval.truncate_prompts=true"
        )
    logger.warning(
        "eval: %d of %d prompts (up to %d tokens) cut to their last %d tokens to fit model.max_model_len=%d",
        too_long, len(prompts), longest, room, max_model_len,
    )  # fmt: skip
    return [p[-room:] if len(p) > room else p for p in prompts], too_long


def call_seed(engine_seed: int, call_index: int) -> int:
    """Seed for the call_index-th generate of an engine when the caller gives none: a run stays reproducible."""
    return int(np.random.SeedSequence([engine_seed, call_index]).generate_state(1)[0] >> 1)


def pad_ragged(rows: Sequence[np.ndarray], pad_value: float, dtype: torch.dtype) -> torch.Tensor:
    """Stack arrays of shape [L_i, *rest] into [B, max L_i, *rest], right-padded, in one scatter."""
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    rest = rows[0].shape[1:]
    out = np.full((len(rows), int(lengths.max(initial=0)), *rest), pad_value, dtype=rows[0].dtype)
    valid = np.arange(out.shape[1])[None, :] < lengths[:, None]
    out[valid] = np.concatenate(rows, axis=0)
    return torch.from_numpy(out).to(dtype)


def mask_through_first_eos(response_ids: torch.Tensor, eos_ids: torch.Tensor) -> torch.Tensor:
    """[B, T] float mask: 1 up to and including the first EOS of each row, 0 after it."""
    is_eos = torch.isin(response_ids, eos_ids).long()
    eos_before = is_eos.cumsum(dim=1) - is_eos
    return (eos_before == 0).float()


def force_sampled_into_topk(
    topk_ids: torch.Tensor, topk_logp: torch.Tensor, sampled_ids: torch.Tensor, sampled_logp: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """SRL convention: where the sampled token is not among the top-K ids, it replaces the K-th entry."""
    absent = ~(topk_ids == sampled_ids.unsqueeze(-1)).any(dim=-1)
    topk_ids, topk_logp = topk_ids.clone(), topk_logp.clone()
    topk_ids[..., -1] = torch.where(absent, sampled_ids, topk_ids[..., -1])
    topk_logp[..., -1] = torch.where(absent, sampled_logp, topk_logp[..., -1])
    return topk_ids, topk_logp


def assemble_rollout(
    prompts: Sequence[Sequence[int]],
    n: int,
    response_ids: torch.Tensor,
    mask: torch.Tensor,
    behavior_logp: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_logp: torch.Tensor,
    eos_ids: torch.Tensor,
    pad_id: int,
    decode: Callable[[list[list[int]]], list[str]],
) -> Rollout:
    """Turn an engine's padded [B, T(, K)] tensors into a Rollout: force the sampled token into the top-K,
    zero every padding position, cut T to the longest response, derive `finished`, `group` and `texts`."""
    lengths = mask.sum(dim=1).long()
    t_max = int(lengths.max())
    mask = mask[:, :t_max].float()
    keep = mask.bool()
    response_ids = response_ids[:, :t_max].long()
    topk_ids, topk_logp = force_sampled_into_topk(
        topk_ids[:, :t_max].long(), topk_logp[:, :t_max].float(), response_ids, behavior_logp[:, :t_max].float()
    )
    response_ids = response_ids.masked_fill(~keep, pad_id)
    last = response_ids.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    rows = [r[:length] for r, length in zip(response_ids.tolist(), lengths.tolist(), strict=True)]
    return Rollout(
        prompt_ids=[list(p) for p in prompts for _ in range(n)],
        response_ids=response_ids,
        mask=mask,
        behavior_logp=behavior_logp[:, :t_max].float().masked_fill(~keep, 0.0),
        topk_ids=topk_ids.masked_fill(~keep.unsqueeze(-1), 0),
        topk_logp=topk_logp.masked_fill(~keep.unsqueeze(-1), 0.0),
        finished=torch.isin(last, eos_ids) & (lengths > 0),
        group=torch.arange(len(prompts)).repeat_interleave(n),
        texts=decode(rows),
    )


def load_tokenizer(model_path: str) -> tuple[PreTrainedTokenizerBase, list[int], int]:
    """The model's tokenizer, the EOS ids both engines stop on, and the pad id responses are padded with.

    EOS ids = the tokenizer's plus those in the model's generation_config.json (instruct models list <|im_end|>
    there); vLLM stops on the same union. Pad = the tokenizer's pad token, else the first EOS id.
    """
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    try:
        gen_eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:  # no generation_config.json
        gen_eos = None
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif gen_eos:
        ids.update(int(i) for i in gen_eos)
    if not ids:
        raise ValueError(f"{model_path}: no eos_token_id in the tokenizer or generation_config; engines need one")
    eos = sorted(ids)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    return tokenizer, eos, int(pad)
