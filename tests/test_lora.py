"""LoRA through peft (harness/lora.py): only adapters train, the engine gets merged weights under the base names,
checkpoints hold the adapters. Small random Qwen3 / Qwen3-MoE models: each test runs in about a second."""

from __future__ import annotations

import types

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from harness.loop.checkpoint import load_latest, save_checkpoint
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


# ---------------------------------------------------------------- a real run: the loop trains the adapters only


@pytest.mark.slow  # trains the small model
def test_a_lora_run_trains_adapters_syncs_merged_weights_and_resumes(tmp_path, small_model, monkeypatch):
    from safetensors.torch import load_file

    from harness.batch import build_batch, policy_logprobs
    from harness.config import validate
    from harness.loop.model_path import model_dir
    from harness.loop.train import train
    from harness.lora import merged_from_checkpoint
    from harness.models import load_policy
    from harness.rollout import HFEngine, make_engine
    from harness.tasks import load_problems, render_prompts
    from tests.conftest import FAST_TRAINER, compose

    synced: list[dict[str, torch.Tensor]] = []
    original = HFEngine.sync_weights

    def record(self, state):
        synced.append({k: v.detach().clone() for k, v in state.items()})
        original(self, state)

    monkeypatch.setattr(HFEngine, "sync_weights", record)
    common = [
        *small_model,
        *FAST_TRAINER,
        "rollout=hf",
        "model.lora_rank=8",
        "model.lora_alpha=16",
        "trainer.lr=0.02",
        "trainer.eval_every=2",
        "trainer.checkpoint_every=1",
        "benchmark.max_problems=4",
    ]

    def run(name: str, *extra: str) -> tuple[dict, object]:
        raw = compose(*common, *extra)
        return train(validate(raw), tmp_path / name, raw), tmp_path / name

    summary, run_dir = run("straight", "trainer.total_steps=2")
    assert summary["status"] == "completed"
    cfg = validate(compose(*common))
    base_dir = str(model_dir(cfg))
    base, tok = load_policy(base_dir)
    base_state = base.state_dict()

    # The engine first gets the base model itself (B = 0), then merged weights under the base names.
    assert all(torch.equal(synced[0][k], v) for k, v in base_state.items()) and synced[0].keys() == base_state.keys()
    last = synced[-1]
    changed = {k for k, v in base_state.items() if not torch.equal(last[k], v)}
    assert changed and all(".layers." in k and k.endswith("_proj.weight") for k in changed)

    # Checkpoints hold the adapters only; base + adapters reproduce the last sync bit for bit, so the base weights
    # did not move during training.
    adapters = load_file(run_dir / "checkpoints" / "step_2" / "model.safetensors")
    assert adapters and all(".lora_A." in k or ".lora_B." in k for k in adapters)
    merged = merged_from_checkpoint(base_dir, adapters, cfg.model)
    assert all(torch.equal(merged[k], last[k]) for k in base_state)
    # policy/final is the merged model under the base names, a plain model folder (no adapter keys, no peft).
    exported = load_policy(str(run_dir / "policy" / "final"))[0].state_dict()
    assert exported.keys() == base_state.keys() and all(torch.equal(exported[k], last[k]) for k in base_state)

    # The engine's log-probs (merged weights) are the LoRA policy's (base + adapters, unmerged).
    policy = apply_lora(load_policy(base_dir)[0], cfg.model)
    load_adapter_state(policy, adapters)
    _, problems = load_problems(cfg.data, cfg.benchmark)
    engine = make_engine("hf", base_dir, "fp32", seed=0, max_model_len=256, max_topk=1, device="cpu")
    try:
        engine.sync_weights(last)
        ro = engine.generate(render_prompts(tok, problems[:4], "chat"), n=2, max_new_tokens=12, seed=1)
    finally:
        engine.close()
    batch = build_batch(ro, torch.zeros(len(ro.texts)), tok.pad_token_id, topk=1)
    with torch.no_grad():
        lp = policy_logprobs(policy, batch)
    assert float((lp.logp - batch.behavior_logp)[batch.mask > 0].abs().max()) <= 1e-4

    # mode=eval on the run directory merges its adapters into the base: it reproduces the run's step-2 evaluation.
    from omegaconf import OmegaConf

    from harness.loop.eval_only import evaluate_model
    from harness.rundir.files import read_jsonl

    (run_dir / ".hydra").mkdir()
    OmegaConf.save(compose(*common), run_dir / ".hydra" / "config.yaml")
    raw = compose(*common, "mode=eval", f"model.path={run_dir}")
    evaluated = evaluate_model(validate(raw), tmp_path / "eval", raw)
    trained_eval = read_jsonl(run_dir / "eval.jsonl")[-1]
    assert evaluated["step"] == 2 and evaluated["final_score"] == trained_eval["avg@1"]
    assert read_jsonl(tmp_path / "eval" / "eval.jsonl")[0]["problems"] == trained_eval["problems"]

    # Resume from the adapter checkpoint: the same adapters as the uninterrupted run.
    run("resumed", "trainer.total_steps=1")
    summary, resumed_dir = run("resumed", "trainer.total_steps=2", "trainer.resume=true")
    assert summary["status"] == "completed"
    again = load_file(resumed_dir / "checkpoints" / "step_2" / "model.safetensors")
    assert again.keys() == adapters.keys() and all(torch.equal(again[k], adapters[k]) for k in adapters)
