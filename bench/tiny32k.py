"""A random-init tiny Qwen3 with a 32k vocabulary, for the rollout (B3) and RL-step (B4) benchmarks.

Why a separate model: the harness's tiny preset has a ~1k vocab, where the LM head is negligible and HF
``generate`` already matches vLLM on CPU (stack.md section 5). A real-sized vocab makes the head and the per-token
softmax/sampling work dominate, which is the regime the benchmarks' targets are about. The shape is the tiny
preset's (hidden 256, 4 layers, 4 heads, 2 kv heads, head_dim 64, MLP 512, tied embeddings); only the vocab
differs. Random init, no SFT: only timing is measured.

Tokenizer: a byte-level BPE trained on the harness's arithmetic strings (about 1k tokens, the same specials, EOS
and chat template as harness/models.py, so harness prompts render and EOS is the same token), then padded to
exactly 32768 entries with filler tokens. Fillers have no merge that produces them, so encoding never yields
them, but the model can sample them and they decode to text like any other token. HF, vLLM and the harness all
load the folder with their usual ``from_pretrained``.

Run: ``python -m bench.tiny32k`` prints the folder (built once, cached under ``$HARNESS_CACHE`` or
``~/.cache/trust-region-harness/bench-tiny32k-<hash>``; deterministic for its settings).
"""

from __future__ import annotations

import hashlib
import json
import random
import string
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from harness.models import (
    SIZE_FIELDS,
    TinyModelConfig,
    build_once,
    default_cache_dir,
    hf_tokenizer,
    tiny_generation_config,
    tiny_qwen3,
    train_bpe,
)
from harness.tasks.arith import ArithConfig, demonstration, make_splits

BUILD_VERSION = 1  # bump when the recipe below changes, so a stale cached folder is not reused


@dataclass(frozen=True)
class Tiny32kConfig:
    vocab_size: int = 32768
    bpe_vocab: int = 1000
    """size the BPE is trained to before padding (the tiny preset's target)"""
    corpus_problems: int = 20000
    seed: int = 0
    shape: TinyModelConfig = TinyModelConfig()
    """the network's sizes (SIZE_FIELDS): the tiny preset's; its warm-start fields are not used"""


def recipe(cfg: Tiny32kConfig) -> dict[str, int]:
    """What the folder is built from, flat (the cache key and tiny32k_build.json)."""
    own = {k: v for k, v in asdict(cfg).items() if k != "shape"}
    return {**own, **{name: getattr(cfg.shape, name) for name in SIZE_FIELDS}}


def model_dir(cfg: Tiny32kConfig = Tiny32kConfig(), cache_dir: Path | None = None) -> Path:
    key = json.dumps({"build": BUILD_VERSION, **recipe(cfg)}, sort_keys=True)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return root / f"bench-tiny32k-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def build(cfg: Tiny32kConfig = Tiny32kConfig(), cache_dir: Path | None = None) -> Path:
    """The model folder, built on first use (`harness.models.build_once`: one builder at a time, written beside
    the final folder and renamed)."""
    return build_once(model_dir(cfg, cache_dir), lambda out: _build_into(out, cfg))


def _build_into(out: Path, cfg: Tiny32kConfig) -> None:
    tokenizer = _tokenizer(cfg)
    if len(tokenizer) != cfg.vocab_size:
        raise RuntimeError(f"tiny32k: tokenizer has {len(tokenizer)} tokens, expected {cfg.vocab_size}")
    torch.manual_seed(cfg.seed)
    model = tiny_qwen3(cfg.shape, tokenizer)
    tiny_generation_config(model, tokenizer)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "tiny32k_build.json").write_text(json.dumps({"build": BUILD_VERSION, **recipe(cfg)}, indent=2) + "\n")


def _tokenizer(cfg: Tiny32kConfig) -> PreTrainedTokenizerFast:
    train, _ = make_splits(ArithConfig())
    rng = random.Random(f"tiny32k:{cfg.seed}")
    problems = rng.sample(train, min(cfg.corpus_problems, len(train)))
    corpus = [s for p in problems for s in (p.question, demonstration(p))]
    bpe = train_bpe(corpus, cfg.bpe_vocab)
    # Pad the model's vocab with fillers: "~" plus lowercase letters, all printable ASCII, which byte-level BPE
    # maps to themselves, so they decode to exactly that text. No merges are added, so encoding is unchanged.
    spec = json.loads(bpe.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    next_id = max(max(vocab.values()), max(t["id"] for t in spec["added_tokens"])) + 1
    letters = string.ascii_lowercase
    i = 0
    while next_id < cfg.vocab_size:
        word, k = "", i
        for _ in range(4):  # 26**4 = 456976 distinct fillers, more than any vocab here needs
            word, k = word + letters[k % 26], k // 26
        i += 1
        if f"~{word}" not in vocab:
            vocab[f"~{word}"] = next_id
            next_id += 1
    return hf_tokenizer(Tokenizer.from_str(json.dumps(spec)), cfg.shape.max_position_embeddings)


if __name__ == "__main__":
    print(build())
