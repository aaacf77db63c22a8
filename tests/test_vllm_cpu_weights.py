"""The vLLM CPU engine's direct weight write on a second architecture: Qwen2 (the R1-Distill models), whose q/k/v
projections carry biases, with an untied output head and a bf16 engine copy. tests/test_rollout.py covers the tiny
model's shape (Qwen3, tied head, padded vocabulary) and the writer's refusals.

An engine of its own, in its own module: vLLM keeps one engine's distributed state per process, so this test
starts after test_rollout.py's engine has been closed, and closes its own."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.rollout import make_engine
from tests.test_rollout import EOS, PAD, _direct_equals_reload, build_tiny_model

pytestmark = pytest.mark.slow  # a vLLM engine


def test_vllm_direct_sync_qwen2_biases_untied_head(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from transformers import Qwen2Config, Qwen2ForCausalLM

    build_tiny_model(tmp_path)  # for the tokenizer
    config = Qwen2Config(
        vocab_size=290, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=256, tie_word_embeddings=False, eos_token_id=EOS,
        pad_token_id=PAD, bos_token_id=EOS,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(1)
        qwen2 = Qwen2ForCausalLM(config).eval()
        for name, p in qwen2.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)  # nonzero biases, so a bias written to the wrong rows would show
    qwen2.save_pretrained(tmp_path)
    engine = make_engine("vllm", str(tmp_path), "bf16", seed=0, max_model_len=128, kv_cache_gb=0.25)
    try:
        _direct_equals_reload(engine, qwen2)
    finally:
        engine.close()
