"""The real-checkpoint presets, wired without a download: each architecture is instantiated from its config on the
meta device and checked against its published size; the machine check turns a GPU-only setting on a machine
without it into one line."""

from __future__ import annotations

import pytest
import torch

from harness.config import compose, validate
from harness.lora import resolve_targets, structure, structure_from_fields
from harness.machine import Machine, check, probe
from harness.models import architecture_config, decoder_layers, meta_model

# (preset, class, decoder layers, published size in billions of parameters)
PRESETS = [
    ("qwen3_1_7b_base", "Qwen3ForCausalLM", 28, 1.7),
    ("qwen3_4b_base", "Qwen3ForCausalLM", 36, 4.0),
    ("qwen3_8b_base", "Qwen3ForCausalLM", 36, 8.2),
    ("qwen3_30b_a3b_base", "Qwen3MoeForCausalLM", 48, 30.5),
    ("qwen3_30b_a3b", "Qwen3MoeForCausalLM", 48, 30.5),
    ("r1_distill_qwen_1_5b", "Qwen2ForCausalLM", 28, 1.78),
    ("gemma_2_9b_it", "Gemma2ForCausalLM", 42, 9.24),
    ("qwen3_4b_instruct_2507", "Qwen3ForCausalLM", 36, 4.02),
]


def hand_count(a: dict) -> int:
    """Parameters of a Qwen2/Qwen3(-MoE) decoder from its config fields, written out from the architecture."""
    h, v, layers = a["hidden_size"], a["vocab_size"], a["num_hidden_layers"]
    hd = a.get("head_dim", h // a["num_attention_heads"])
    q, kv = a["num_attention_heads"] * hd, a["num_key_value_heads"] * hd
    attn = h * q + 2 * h * kv + q * h
    if a["model_type"] == "qwen2":
        attn += q + 2 * kv  # q, k, v biases
    elif a["model_type"] != "gemma2":
        attn += 2 * hd  # Qwen3's per-head q and k RMSNorms
    if a["model_type"] == "qwen3_moe":
        mlp = a["num_experts"] * 3 * h * a["moe_intermediate_size"] + h * a["num_experts"]  # experts + router
    else:
        mlp = 3 * h * a["intermediate_size"]
    norms = (4 if a["model_type"] == "gemma2" else 2) * h  # Gemma 2 norms before and after attention and MLP
    embed = v * h * (1 if a["tie_word_embeddings"] else 2)
    return layers * (attn + mlp + norms) + h + embed


@pytest.mark.parametrize(("preset", "cls", "layers", "published_b"), PRESETS)
def test_preset_instantiates_on_meta_device_at_its_published_size(preset, cls, layers, published_b):
    run = validate(compose(f"model={preset}", "device=cuda", "rollout=vllm", "precision=bf16"))
    m = run.model
    assert m.path and m.architecture and m.gradient_checkpointing
    # DPPO Table 1's 1024 + 16384 for the thinking model; the papers' 10240 (or the model's own limit) elsewhere
    expected = 17408 if preset == "qwen3_30b_a3b" else min(10240, m.architecture["max_position_embeddings"])
    assert m.max_model_len == expected
    model = meta_model(m.architecture)
    assert type(model).__name__ == cls
    params = list(model.parameters())
    assert all(p.device.type == "meta" for p in params)  # nothing allocated, nothing downloaded
    n = sum(p.numel() for p in params)  # a tied head is one parameter, counted once
    assert n == hand_count(m.architecture)
    assert abs(n / 1e9 - published_b) / published_b < 0.03, n
    # FSDP2's units: one per decoder layer, covering every layer parameter.
    blocks = decoder_layers(model)
    assert len(blocks) == layers
    in_blocks = sum(p.numel() for b in blocks for p in b.parameters())
    assert in_blocks == n - sum(p.numel() for name, p in model.named_parameters() if ".layers." not in name)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert model.is_gradient_checkpointing
    # LoRA's config-time target check reads a table, not the model: it must list this model's own projections.
    from_table = resolve_targets(structure_from_fields(m.architecture), (), 0.0)
    assert from_table == resolve_targets(structure(model), (), 0.0) and from_table.modules


def test_moe_preset_routes_eight_of_128_experts():
    cfg = architecture_config(validate(compose("model=qwen3_30b_a3b_base")).model.architecture)
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (128, 8, 768)
    # Active parameters per token: attention + 8 experts + router per layer, plus embeddings (published 3.3B).
    h, hd = cfg.hidden_size, cfg.head_dim
    attn = 2 * h * cfg.num_attention_heads * hd + 2 * h * cfg.num_key_value_heads * hd
    active = cfg.num_hidden_layers * (attn + 8 * 3 * h * 768 + h * 128) + 2 * cfg.vocab_size * h
    assert abs(active / 1e9 - 3.3) < 0.1


def test_qwen3_5_moe_preset_is_the_hybrid_architecture():
    """Qwen3.5-35B-A3B-Base (DRPO setting 5): transformers 5.19 has the architecture; 34.7B in the language model
    (the published 35B counts the vision encoder), 40 layers, one full-attention layer in four, 8 of 256 experts."""
    run = validate(compose("model=qwen3_5_35b_a3b_base", "device=cuda", "rollout=vllm", "precision=bf16"))
    assert run.model.path == "Qwen/Qwen3.5-35B-A3B-Base"
    model = meta_model(run.model.architecture)
    assert type(model).__name__ == "Qwen3_5MoeForCausalLM"
    n = sum(p.numel() for p in model.parameters())
    assert abs(n / 1e9 - 34.66) < 0.05, n
    assert len(decoder_layers(model)) == 40
    cfg = model.config
    assert cfg.layer_types.count("full_attention") == 10 and (cfg.num_experts, cfg.num_experts_per_tok) == (256, 8)


def test_bad_architecture_block_names_the_key():
    with pytest.raises(ValueError, match="^model.architecture: needs 'model_type'"):
        architecture_config({"hidden_size": 8})
    with pytest.raises(ValueError, match="^model.architecture: "):
        architecture_config({"model_type": "not_a_model"})


CPU_BOX = Machine(cuda=False, gpus=0, capability=None, vllm=True, torchao=False)
AMPERE = Machine(cuda=True, gpus=2, capability=(8, 0), vllm=True, torchao=True)
HOPPER = Machine(cuda=True, gpus=8, capability=(9, 0), vllm=True, torchao=False)


@pytest.mark.parametrize(
    ("overrides", "machine", "message"),
    [
        (["device=cuda"], CPU_BOX, "device: cuda, but this machine has no usable CUDA device"),
        (["rollout=vllm"], Machine(False, 0, None, vllm=False, torchao=False), "rollout.engine: vllm is not installed"),
        (["device=cuda", "rollout.tensor_parallel_size=4"], AMPERE, "is more than the 2 visible GPU(s); use at most 2"),
        (["rollout.tensor_parallel_size=2"], CPU_BOX, "needs device=cuda rollout=vllm"),
        (["device=cuda", "precision=fp8_rollout"], AMPERE, "compute capability 8.9+"),
        (["device=cuda", "precision=fp8_e2e"], HOPPER, "torchao is not installed"),
        (["trainer.prompts_per_step=3"], Machine(False, 0, None, True, False, world=2), "split over 2 processes"),
        (["device=cuda"], Machine(True, 1, (9, 0), True, True, world=2, local_world=2), "2 processes on this node"),
    ],
)
def test_machine_check_is_one_line_naming_the_key_and_the_alternative(overrides, machine, message):
    run = validate(compose(*overrides))
    with pytest.raises(ValueError) as err:
        check(run, machine)
    text = str(err.value)
    assert message in text and "\n" not in text
    assert text.split(":", 1)[0] in {"device", "rollout.engine", "rollout.tensor_parallel_size", "precision.name",
                                     "trainer.prompts_per_step"}  # fmt: skip


def test_machine_check_passes_what_the_machine_has():
    hopper_with_torchao = Machine(cuda=True, gpus=8, capability=(9, 0), vllm=True, torchao=True)
    check(validate(compose("device=cuda", "precision=fp8_e2e", "rollout.tensor_parallel_size=8")), hopper_with_torchao)
    check(validate(compose()), probe())  # the default run on this very machine


def test_this_machine_probe_matches_torch():
    m = probe()
    assert m.cuda == torch.cuda.is_available() and m.gpus == (torch.cuda.device_count() if m.cuda else 0)
