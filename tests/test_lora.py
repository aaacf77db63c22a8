"""LoRA through peft (harness/lora.py): only adapters train, the engine gets merged weights under the base names,
checkpoints hold the adapters. Small random Qwen3 / Qwen3-MoE models: each test runs in about a second."""

from __future__ import annotations

import types

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from harness.checkpoint import load_latest, save_checkpoint
from harness.lora import (
    adapter_state_dict,
    apply_lora,
    engine_state_dict,
    is_lora,
    load_adapter_state,
    resolve_targets,
    restore_adapter,
    structure,
    structure_from_fields,
    trainable_parameters,
)


def lora_cfg(rank=4, alpha=8.0, dropout=0.0, targets=()):
    return types.SimpleNamespace(lora_rank=rank, lora_alpha=alpha, lora_dropout=dropout, lora_targets=targets)


def small(kind: str, seed: int = 0):
    config = AutoConfig.for_model(
        kind, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16, vocab_size=50,
        tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


def perturb_adapters(model, seed: int = 1) -> None:
    """B starts at zero (the adapter is a no-op): give it values, as training would."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)


@pytest.mark.parametrize("kind", ["qwen3", "qwen3_moe"])
def test_merged_weights_carry_the_adapters_under_the_base_names(kind):
    base_model = small(kind)
    base = {k: v.clone() for k, v in base_model.state_dict().items()}
    model = apply_lora(small(kind), lora_cfg())
    assert is_lora(model) and not is_lora(base_model)
    x = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        assert torch.equal(model(x).logits, base_model(x).logits)  # B = 0: unchanged until trained
    perturb_adapters(model)
    merged = engine_state_dict(model)
    assert set(merged) == set(base)  # the base model's own names: what the engine loads
    with torch.no_grad():
        want = model(x).logits
        base_model.load_state_dict(merged)
        assert torch.allclose(base_model(x).logits, want, atol=1e-5)
    # Every adapted weight equals peft's own W + delta; the rest are the base tensors.
    from peft.tuners.lora import LoraLayer

    adapted = set()
    for name, layer in model.named_modules():
        if isinstance(layer, LoraLayer):
            key = name.replace(".base_layer", "") + "." + getattr(layer, "parameter_name", "weight")
            adapted.add(key)
            assert torch.allclose(merged[key], base[key] + layer.get_delta_weight("default"), atol=1e-6)
    assert {k for k in base if not torch.equal(merged[k], base[k])} == adapted
    if kind == "qwen3_moe":  # the fused expert stacks are adapted too (peft's target_parameters)
        assert any(k.endswith("experts.gate_up_proj") for k in adapted)
    # The trainer's weights are untouched by the merge.
    assert all(torch.equal(v, base[k.replace(".base_layer", "")]) for k, v in model.state_dict().items()
               if "lora_" not in k)  # fmt: skip


def test_only_the_adapters_train():
    model = apply_lora(small("qwen3"), lora_cfg(targets=("q_proj", "v_proj")))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = trainable_parameters(model)
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    assert {n.split(".")[-4] for n in names} == {"q_proj", "v_proj"}
    opt = torch.optim.AdamW(params, lr=1e-2)
    for _ in range(2):
        loss = model(torch.randint(0, 50, (2, 9))).logits.square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = model.state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and moved <= {k for k in before if "lora_" in k}


def test_adapter_checkpoint_restores_and_rejects_a_different_adapter(tmp_path):
    model = apply_lora(small("qwen3"), lora_cfg())
    perturb_adapters(model)
    opt = torch.optim.AdamW(trainable_parameters(model), lr=1e-3)
    state = adapter_state_dict(model.state_dict())
    assert state and all("lora_" in k for k in state)
    save_checkpoint(tmp_path, 3, model, opt, {}, model_state=state)
    fresh = apply_lora(small("qwen3"), lora_cfg())
    fresh_opt = torch.optim.AdamW(trainable_parameters(fresh), lr=1e-3)
    info = load_latest(tmp_path, fresh, fresh_opt, restore_adapter(fresh, fresh_opt))
    assert info["step"] == 3
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in model.state_dict().items())
    other = apply_lora(small("qwen3"), lora_cfg(targets=("q_proj",)))
    with pytest.raises(ValueError, match="LoRA checkpoint does not fit this model"):
        load_adapter_state(other, state)


def test_no_lora_is_a_no_op():
    model = small("qwen3")
    assert apply_lora(model, lora_cfg(rank=0, alpha=None)) is model and not is_lora(model)
    assert engine_state_dict(model).keys() == model.state_dict().keys()
    assert len(trainable_parameters(model)) == len(list(model.parameters()))


@pytest.mark.parametrize("kind", ["qwen3", "qwen3_moe"])
def test_config_time_targets_match_the_built_model(kind):
    """validate() reads the targets off config.json fields (no model is built); they must be the real model's."""
    model = small(kind)
    fields = model.config.to_dict()
    assert resolve_targets(structure_from_fields(fields), (), 0.0) == resolve_targets(structure(model), (), 0.0)
    assert resolve_targets(structure_from_fields(fields), ("o_proj",), 0.0).modules == (
        "model.layers.0.self_attn.o_proj",
        "model.layers.1.self_attn.o_proj",
    )
