"""The checkpoint a run trains: `model.path` as given, or the tiny model built (once, cached) from the run's
model and task config."""

from __future__ import annotations

from pathlib import Path

from harness.config import RunConfig
from harness.models import TinyModelConfig, build_tiny, default_cache_dir
from harness.tasks import arith_config
from harness.tasks.arith import ArithConfig


def model_dir(cfg: RunConfig) -> Path | str:
    """The checkpoint to train: `model.path` as given, or the tiny model built (once, cached) from its config."""
    if cfg.model.path is not None:
        return cfg.model.path
    return build_tiny(*tiny_spec(cfg))


def tiny_spec(cfg: RunConfig) -> tuple[TinyModelConfig, ArithConfig, Path]:
    """What `build_tiny` is given for this run: the tiny model's config, the task it is warm-started on, and the
    cache folder. `tiny_model_dir(*tiny_spec(cfg)).name` names the model without building it (a pass-rate file
    records that name)."""
    m = cfg.model
    tiny = TinyModelConfig(
        vocab_size=m.vocab_size,
        hidden_size=m.hidden_size,
        num_layers=m.num_layers,
        num_heads=m.num_heads,
        num_kv_heads=m.num_kv_heads,
        head_dim=m.head_dim,
        intermediate_size=m.intermediate_size,
        max_position_embeddings=m.max_model_len,
        sft_steps=m.sft_steps,
        sft_lr=m.sft_lr,
        sft_batch=m.sft_batch,
        seed=m.init_seed,
        corpus_size=m.corpus_size,
        unused_tokens=m.unused_tokens,
        num_experts=m.num_experts,
        experts_per_token=m.experts_per_token,
    )
    cache = Path(m.cache_dir).expanduser() if m.cache_dir else default_cache_dir()
    return tiny, arith_config(cfg.data), cache
