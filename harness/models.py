"""Loading any HF causal LM, and building the tiny local model the CPU runs use.

The tiny model follows reference/tiny-learnability.md: a byte-level BPE tokenizer (~1k tokens) trained on the
task's own strings, a random-init 2.6M-param Qwen3, and a short SFT warm start on demonstrations of the train
split that lands at ~20% held-out accuracy (T=1), leaving RL room to show a gain.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import random
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, pre_tokenizers, trainers
from tokenizers.models import BPE
from tqdm.auto import tqdm
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from harness import moe
from harness.errors import first_line
from harness.tasks.arith import ArithConfig, Problem, balanced_sample, demonstration, make_splits
from harness.tasks.templates import render

# Bump when the build procedure changes, so stale cached models are not reused under the same configs.
BUILD_VERSION = 2

EOS, USER, ASSISTANT, PAD = "<|end|>", "<|user|>", "<|assistant|>", "<|pad|>"
SPECIAL_TOKENS = (EOS, USER, ASSISTANT, PAD)  # ids 0..3, in this order

# `<|user|>Q<|assistant|>A<|end|>`: the assistant turn ends with the EOS token, which generation stops on.
CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'user' -%}" + USER + "{{ m['content'] }}"
    "{%- elif m['role'] == 'assistant' -%}" + ASSISTANT + "{{ m['content'] }}" + EOS + ""
    "{%- else -%}{{ raise_exception('the tiny chat template knows only user and assistant roles') }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}" + ASSISTANT + "{%- endif -%}"
)

# A hub id is `name` or `owner/name`; anything else that is not an existing path is a typo'd path.
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


# TinyModelConfig's fields that shape the network (what `tiny_qwen3` reads); bench's tiny32k takes them too.
SIZE_FIELDS = (
    "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
    "max_position_embeddings",
)  # fmt: skip


@dataclass(frozen=True)
class TinyModelConfig:
    """The tiny Qwen3 and its warm start. Defaults are the measured recipe (21% T=1 at SFT step 300)."""

    vocab_size: int = 1000
    """BPE target size; the trainer stops early when merges run out (942 on the default task)."""
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 512
    max_position_embeddings: int = 512
    sft_steps: int = 300
    """Warm-start length: 200 steps gives ~15% T=1, 300 ~21%, 400 ~35%, 600 ~54%."""
    sft_lr: float = 1e-3
    sft_batch: int = 64
    sft_warmup: int = 50
    """Linear lr warmup steps; constant afterwards."""
    seed: int = 0
    corpus_size: int = 60000
    """Problems sampled (kinds in equal shares) whose question and demonstration strings train the BPE."""
    unused_tokens: int = 0
    """Tokens appended to the BPE vocabulary that no task string contains (`<|unused0|>`, ...): the untouched tail
    of a large model's vocabulary, which no warm-start target ever is (so the warm start takes probability away from
    it). A sampled one decodes as its own text, so it spoils the answer, as a stray token does at scale."""
    num_experts: int = 0  # 2-4: a mixture of experts in every layer (harness.moe), routing each token to
    experts_per_token: int = 0  # this many of them (top-k); both 0: the dense model

    def __post_init__(self) -> None:
        for name in (*SIZE_FIELDS, "sft_batch", "corpus_size"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"TinyModelConfig.{name} must be a positive integer, got {value!r}")
        for name in ("sft_steps", "sft_warmup", "seed", "unused_tokens", "num_experts", "experts_per_token"):
            value = getattr(self, name)
            if not _is_int(value) or value < 0:
                raise ValueError(f"TinyModelConfig.{name} must be an integer >= 0, got {value!r}")
        min_vocab = 256 + len(SPECIAL_TOKENS)
        if not _is_int(self.vocab_size) or self.vocab_size < min_vocab:
            raise ValueError(
                f"TinyModelConfig.vocab_size must be an integer >= {min_vocab} (256 bytes + special tokens), "
                f"got {self.vocab_size!r}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"TinyModelConfig.num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if not (isinstance(self.sft_lr, int | float) and self.sft_lr > 0):
            raise ValueError(f"TinyModelConfig.sft_lr must be a positive number, got {self.sft_lr!r}")


def default_cache_dir() -> Path:
    """``$HARNESS_CACHE``, else ``~/.cache/trust-region-harness``."""
    env = os.environ.get("HARNESS_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "trust-region-harness"


def tiny_model_dir(cfg: TinyModelConfig, task: ArithConfig, cache_dir: Path) -> Path:
    """Where ``build_tiny`` keeps the model for these configs: ``cache_dir/tiny-<hash>``."""
    model = moe.recipe(cfg)
    if not model["unused_tokens"]:  # added after the pools were measured: the models without it keep their names
        del model["unused_tokens"]
    key = json.dumps({"build": BUILD_VERSION, "model": model, "task": dataclasses.asdict(task)}, sort_keys=True)
    return Path(cache_dir) / f"tiny-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def build_tiny(cfg: TinyModelConfig, task: ArithConfig, cache_dir: Path, progress: bool = True) -> Path:
    """Train the tokenizer, init the model, SFT-warm-start it on the train split, and save it with
    ``save_pretrained``; returns the folder. An existing folder for the same configs is returned as is.

    Deterministic for a seed: the same configs give bit-identical weights on the same machine and thread count
    (CPU matmul reductions depend on the thread count)."""
    return build_once(tiny_model_dir(cfg, task, cache_dir), lambda out: _build_into(out, cfg, task, progress))


def build_once(final: Path, build_into: Callable[[Path], None]) -> Path:
    """`final`, made by `build_into(folder)` unless it already holds a model (a `config.json`); the tiny model and
    the benchmarks' models are built this way."""
    if (final / "config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    # One builder at a time (the findings suite starts two runs at once on an empty cache; each would spend a
    # core-minute building the same model). The waiter finds the model when the lock is released; the kernel
    # releases it when a builder dies, so a crash never blocks the next run. Every builder takes this lock (flock
    # reaches NFS locks on Linux clients), so a temp folder found while holding it is a dead builder's.
    with open(final.parent / f".{final.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "config.json").is_file():
            return final
        for dead in final.parent.glob(f".{final.name}-*"):  # a killed builder's half-written folder
            shutil.rmtree(dead, ignore_errors=True)
        # Build beside the final folder and rename: readers, who skip the lock (the check above), never see a
        # half-written model.
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
        try:
            build_into(tmp)
            try:
                tmp.rename(final)
            except OSError:
                if not (final / "config.json").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def load_policy(
    path_or_id: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``(model, tokenizer)`` from a local folder or a Hugging Face hub id. A tokenizer without a pad token
    gets its EOS token as pad (batched generation needs one)."""
    source, is_local = _model_source(path_or_id)
    try:
        # The model first: if it is missing, the tokenizer's own (slow, retried) hub lookup is skipped.
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as e:  # huggingface_hub's errors are OSErrors
        raise _unloadable(source, is_local, e) from None
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device), tokenizer


def load_tokenizer_of(path_or_id: str) -> PreTrainedTokenizerBase:
    """The tokenizer alone (the training prompts' lengths are checked before the weights load), with
    load_policy's one-line errors for a path that is not a model."""
    source, is_local = _model_source(path_or_id)
    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as e:
        raise _unloadable(source, is_local, e) from None


def _model_source(path_or_id: str) -> tuple[str, bool]:
    source = str(path_or_id)
    path = Path(source).expanduser()
    is_local = path.exists()
    if not is_local and (source.startswith(("/", ".", "~")) or not _HUB_ID_RE.match(source)):
        raise FileNotFoundError(
            f"model path {source!r} does not exist (expected a local model folder or a hub id like 'Qwen/Qwen3-4B')"
        )
    return (str(path) if is_local else source), is_local


def _unloadable(source: str, is_local: bool, e: Exception) -> OSError:
    if is_local:
        where = f"folder {source!r} is not a loadable model"
    else:
        where = f"model {source!r} could not be found locally or downloaded from the Hugging Face hub"
    return OSError(f"{where}: {first_line(e)}")


def architecture_config(architecture: dict) -> PretrainedConfig:
    """A transformers config from a model preset's `architecture` block (its config.json fields), offline."""
    fields = dict(architecture)
    model_type = fields.pop("model_type", None)
    if model_type is None:
        raise ValueError("model.architecture: needs 'model_type' (e.g. qwen3, qwen3_moe, qwen2)")
    try:
        return AutoConfig.for_model(model_type, **fields)
    except ValueError as e:
        raise ValueError(f"model.architecture: {first_line(e)}") from None


def meta_model(architecture: dict) -> PreTrainedModel:
    """The preset's architecture instantiated on the meta device: every module and parameter shape, no memory,
    no download. What the FSDP2 wrapping and activation checkpointing of a real run are checked against."""
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(architecture_config(architecture))


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a causal LM: FSDP2's sharding units (each is gathered for its own forward)."""
    blocks = getattr(getattr(model, "model", None), "layers", None)
    if blocks is None:
        raise ValueError(f"{type(model).__name__}: no model.layers to shard (not a decoder-only HF causal LM?)")
    return list(blocks)


# ---------------------------------------------------------------- building the tiny model


def tiny_qwen3(sizes: TinyModelConfig, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    """A freshly initialised Qwen3 of `sizes` (its SIZE_FIELDS) with tied embeddings over `tokenizer`'s vocabulary,
    no BOS token, the tokenizer's EOS and PAD (bench's tiny32k's too); with num_experts, its mixture of experts."""
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=sizes.hidden_size,
        intermediate_size=sizes.intermediate_size,
        num_hidden_layers=sizes.num_layers,
        num_attention_heads=sizes.num_heads,
        num_key_value_heads=sizes.num_kv_heads,
        head_dim=sizes.head_dim,
        max_position_embeddings=sizes.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return moe.mixture(config, sizes) if sizes.num_experts else Qwen3ForCausalLM(config)


def tiny_generation_config(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Generation stops at the tokenizer's EOS, pads with its PAD, and starts with no BOS."""
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None
    )


def _build_into(out: Path, cfg: TinyModelConfig, task: ArithConfig, progress: bool) -> None:
    train, _ = make_splits(task)
    rng = random.Random(f"tiny:{cfg.seed}")
    tokenizer = _train_tokenizer(train, cfg, rng)

    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        torch.manual_seed(cfg.seed)
        model = tiny_qwen3(cfg, tokenizer)
        info = _sft(model, tokenizer, train, cfg, rng, progress)
    finally:
        torch.use_deterministic_algorithms(was_deterministic)

    tiny_generation_config(model, tokenizer)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "tiny_build.json").write_text(
        json.dumps(
            {"build": BUILD_VERSION, "model": moe.recipe(cfg), "task": dataclasses.asdict(task), **info},
            indent=2,
        )
        + "\n"
    )


def train_bpe(corpus: list[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE trained on `corpus` up to `vocab_size` entries, SPECIAL_TOKENS first (the tiny preset's and
    bench's tiny32k's)."""
    bpe = Tokenizer(BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=2,
            special_tokens=list(SPECIAL_TOKENS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    return bpe


def hf_tokenizer(bpe: Tokenizer, max_length: int) -> PreTrainedTokenizerFast:
    """`bpe` as the tiny models' HF tokenizer: EOS, PAD, left padding, the chat template."""
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token=EOS, pad_token=PAD, padding_side="left", chat_template=CHAT_TEMPLATE,
        model_max_length=max_length,
    )  # fmt: skip


def _train_tokenizer(train: list[Problem], cfg: TinyModelConfig, rng: random.Random) -> PreTrainedTokenizerFast:
    corpus = []
    for p in balanced_sample(train, cfg.corpus_size, rng):
        # Question and answer are separate strings: special tokens always separate them in the chat format.
        corpus += [p.question, demonstration(p)]
    tokenizer = hf_tokenizer(train_bpe(corpus, cfg.vocab_size), cfg.max_position_embeddings)
    # Plain (not special) added tokens: decoding keeps them in the text, where they break the answer's format.
    tokenizer.add_tokens([f"<|unused{i}|>" for i in range(cfg.unused_tokens)])
    return tokenizer


def _sft(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    train: list[Problem],
    cfg: TinyModelConfig,
    rng: random.Random,
    progress: bool,
) -> dict[str, float]:
    """Supervised warm start: cross-entropy on completion tokens only (the demonstration and the EOS token)."""
    # Tokenise every train problem once: prompt and completion separately, so the loss mask is exact.
    prompts = tokenizer([render(tokenizer, p.question, "chat") for p in train], add_special_tokens=False)
    completions = tokenizer([demonstration(p) for p in train], add_special_tokens=False)
    encoded = {
        p.id: (prompt, completion + [tokenizer.eos_token_id])
        for p, prompt, completion in zip(train, prompts["input_ids"], completions["input_ids"], strict=True)
    }

    # lr, warmup and betas are the recipe's; it names no weight decay or clipping, so none and a loose 1.0.
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.sft_lr, betas=(0.9, 0.98), weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / cfg.sft_warmup) if cfg.sft_warmup else 1.0
    )
    model.train()
    start = time.perf_counter()
    loss_value = float("nan")
    bar = tqdm(range(cfg.sft_steps), desc="tiny-model SFT", disable=not progress, leave=False)
    for step in bar:
        rows = [encoded[p.id] for p in balanced_sample(train, cfg.sft_batch, rng)]
        width = max(len(a) + len(b) for a, b in rows)
        # Right padding keeps positions starting at 0, as in generation (which derives them from the mask).
        input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for r, (prompt, completion) in enumerate(rows):
            n = len(prompt) + len(completion)
            input_ids[r, :n] = torch.tensor(prompt + completion)
            labels[r, len(prompt) : n] = torch.tensor(completion)
            attention[r, :n] = 1
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels, **moe.warm_start_kwargs(model)).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        loss_value = loss.item()
        if step % 10 == 0:
            bar.set_postfix(loss=f"{loss_value:.3f}")
    model.eval()
    return {"sft_final_loss": loss_value, "sft_seconds": round(time.perf_counter() - start, 2)}


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
