"""harness.quant: the fake-quantised (weights and activations) rollout copy behind precision=w*a*_rollout."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from harness import precision
from harness.config import compose, validate
from harness.quant import QuantLinear, QuantSpec, quantize_dequantize, quantize_model, quantize_state_dict


def test_int_rounding_levels() -> None:
    x = torch.tensor([[-1.0, -0.3, 0.0, 0.52, 1.0]])
    # int4: 7 levels each side of 0, scale amax / 7; amax is kept exactly.
    assert torch.allclose(quantize_dequantize(x, "int4"), torch.round(x * 7) / 7)
    assert torch.equal(quantize_dequantize(x, "int8")[0, [0, 4]], x[0, [0, 4]])
    assert torch.equal(quantize_dequantize(x, "e4m3"), precision.fp8_quantize_dequantize(x))
    assert quantize_dequantize(torch.zeros(2, 3), "int3").abs().sum() == 0  # no 0/0
    with pytest.raises(ValueError, match="unknown 'int9'"):
        QuantSpec(weights="int9", activations=None)


def test_quantized_copy_keeps_names_and_rounds_inputs() -> None:
    config = Qwen3Config(
        vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).eval()
    ids = torch.randint(0, 96, (2, 7))
    ref = model(ids).logits
    spec = QuantSpec(weights="int4", activations="int4")
    names = list(model.state_dict())
    q = quantize_state_dict(model.state_dict(), spec)
    assert torch.equal(q["model.embed_tokens.weight"], model.model.embed_tokens.weight)  # embedding untouched
    assert not torch.equal(q["model.layers.0.mlp.up_proj.weight"], model.model.layers[0].mlp.up_proj.weight)
    assert quantize_model(model, spec) == 14  # 7 Linear layers per decoder layer, the head left alone
    assert quantize_model(model, spec) == 14  # idempotent
    assert type(model.lm_head) is torch.nn.Linear and type(model.model.layers[0].mlp.up_proj) is QuantLinear
    assert list(model.state_dict()) == names
    out = model(ids).logits  # activations rounded, weights not (yet) synced through the transform
    assert 0 < (out - ref).abs().max() < 1.0


@pytest.mark.slow  # ~20 Hydra compositions: over 3 s of CPU
def test_precision_table_and_engine_check() -> None:
    spec = precision.get("w4a4_rollout")
    assert spec.train_autocast is None and spec.rollout_dtype == torch.float32 and not spec.rollout_fp8
    assert spec.rollout_quant == QuantSpec(weights="int4", activations="int4")
    assert precision.rollout_weight_transform("w4a4_rollout") is not None
    with pytest.raises(ValueError, match="only rollout=hf simulates"):
        validate(compose("precision=w4a4_rollout", "rollout=vllm"))
    # The sanity test's BF16 training beside the same W4A4 copy: only the trainer's autocast differs.
    bf16 = precision.get("w4a4_rollout_bf16")
    assert bf16.train_autocast == torch.bfloat16 and bf16.rollout_quant == spec.rollout_quant
    assert bf16.rollout_dtype == torch.float32 and not bf16.rollout_fp8 and not bf16.train_fp8
    assert precision.rollout_weight_transform("w4a4_rollout_bf16") is not None
    with pytest.raises(ValueError, match="only rollout=hf simulates"):
        validate(compose("precision=w4a4_rollout_bf16", "rollout=vllm"))
    assert validate(compose("precision=w4a4_rollout_bf16", "rollout=hf")).precision.name == "w4a4_rollout_bf16"
    # The config check (torch-free, so by name) refuses exactly the presets whose rollout copy rounds activations.
    for name in precision.PRECISIONS:
        refused = True
        try:
            validate(compose(f"precision={name}", "rollout=vllm"))
        except ValueError as e:
            assert "only rollout=hf simulates" in str(e)
        else:
            refused = False
        assert refused == (precision.get(name).rollout_quant is not None), name
    with pytest.raises(ValueError, match="only rollout=hf adds logit noise"):
        validate(compose("rollout=vllm", "rollout.logit_noise=0.5"))
    assert validate(compose("precision=w4a4_rollout", "rollout=hf", "rollout.logit_noise=1.0")).rollout.logit_noise == 1
