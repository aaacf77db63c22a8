"""Issue 6: every bad configuration fails before any model is built, fast, with one line naming the key and
what is allowed. A table, so a new check is one row."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from harness.cli import GROUP_NAMES, check_group_options
from harness.config import validate
from tests.test_config import composed, run_cli


def gpt2_folder(tmp: Path) -> str:
    """A model folder whose projections are Conv1D, not nn.Linear: config only, no weights needed."""
    folder = tmp / "gpt2-like"
    folder.mkdir(exist_ok=True)
    config = {"model_type": "gpt2", "n_embd": 32, "n_layer": 1, "n_head": 2, "vocab_size": 64, "n_positions": 64}
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


# (overrides, the key the message must name, a fragment saying what is allowed)
BAD = [
    (["trainer.group_size=1"], "trainer.group_size", ">= 2"),
    (["trainer.minibatches=3"], "trainer.minibatches", "does not divide"),
    (["trainer.eval_every=0"], "trainer.eval_every", ">= 1"),
    (["trainer.lr=fast"], "trainer.lr", "expected float"),
    (["trainer.lr=0"], "trainer.lr", "> 0"),
    (["trainer.total_steps=-1"], "trainer.total_steps", ">= 0"),
    (["trainer.prompts_per_step=0"], "trainer.prompts_per_step", ">= 1"),
    (["trainer.beta1=1.0"], "trainer.beta1", "< 1"),
    (["trainer.grad_clip=0"], "trainer.grad_clip", "> 0"),
    (["trainer.advantage=ppo"], "trainer.advantage", "'drgrpo'"),
    (["trainer.max_bad_steps=0"], "trainer.max_bad_steps", ">= 1"),
    (["trainer.resume=maybe"], "trainer.resume", "bool"),
    (["+trainer.epochs=2"], "trainer: unknown key 'epochs'", "allowed keys: advantage"),
    (["objective=dppo_topk_tv", "rollout.max_topk=5"], "rollout.max_topk", "objective.topk = 20"),
    (["objective.eps_high=-1"], "objective.eps_high", "> 0"),
    (["objective=dppo", "objective.delta=0"], "objective.delta", "> 0"),
    (["objective.agg=mean"], "objective.agg", "'token-mean'"),
    (["objective.anchor=ref"], "objective.anchor", "'behavior'"),
    (["objective=dppo_topk_kl", "objective.topk=0"], "objective.topk", ">= 1"),
    (["+objective.beta=0.1"], "objective: unknown key 'beta'", "allowed keys: agg"),
    (["rollout.engine=sglang"], "rollout.engine", "'vllm' | 'hf'"),
    (["rollout.sync=never"], "rollout.sync", "'rollout'"),
    (["rollout.temperature=0"], "rollout.temperature", "> 0"),
    (["rollout.behavior=recompute"], "rollout.behavior", "'engine' | 'trainer'"),
    (["eval.top_p=0"], "eval.top_p", "> 0"),
    (["eval.top_p=1.5"], "eval.top_p", "<= 1"),
    (["data.max_prompt_tokens=0"], "data.max_prompt_tokens", ">= 1"),
    (["data.max_prompt_tokens=500"], "data.max_prompt_tokens", "raise model.max_model_len to at least 524"),
    (["mode=dry"], "config.mode", "'plan'"),
    (["precision.name=fp4"], "precision.name", "'fp32'"),
    (["model.name=qwen", "model.path=null"], "model.path", "hub id"),
    (["model.path=/nonexistent/model"], "model.path", "does not exist"),
    (["data=dapo_math", "data.path=null"], "data.path", "local file or hub name"),
    (["benchmark.path=/tmp/x.jsonl"], "benchmark.path", "generated"),
    (["data.levels=[6]"], "data.levels", "1..5"),
    (["reward.fallback_pattern='('"], "reward.fallback_pattern", "regex"),
    (["reward.timeout_s=0"], "reward.timeout_s", "> 0"),
    (["reward.scheme=ternary"], "reward.scheme", "'binary'"),
    (["reward.workers=-1"], "reward.workers", ">= 0"),
    (["eval.n=0"], "eval.n", ">= 1"),
    (["mode=serve"], "mode", "'train'"),
    (["seed=-1"], "seed", ">= 0"),
    (["+colour=blue"], "colour", "allowed"),
    (["precision=fp8_e2e", "model.path=<gpt2>"], "precision.name", "fp32, bf16, fp8_rollout"),
    (["model.lora_rank=-1"], "model.lora_rank", ">= 0"),
    (["model.lora_alpha=64"], "model.lora_alpha", "model.lora_rank=<r>"),
    (["model.lora_rank=8", "model.lora_targets=[qproj]"], "model.lora_targets", "allowed: down_proj, gate_proj"),
    (["model.lora_rank=8", "precision=fp8_e2e"], "model.lora_rank", "allowed with LoRA: fp32, bf16, fp8_rollout"),
    (["model=qwen3_30b_a3b_base", "model.lora_rank=8", "model.lora_dropout=0.1"], "model.lora_dropout", "must be 0"),
    (["reward.kind=reward_model"], "reward.model_path", "a hub id, a local folder, or tiny"),
    (["reward.kind=reward_model", "reward.model_path=<gpt2>"], "reward.model_path", "*ForSequenceClassification"),
    (["reward.model_path=tiny"], "reward.model_path", "reward.kind=reward_model"),
    (["data=ultrafeedback"], "reward.kind", "use reward.kind=reward_model"),
    (["benchmark=hh_rlhf"], "reward.kind", "use reward.kind=reward_model"),
]


@pytest.mark.parametrize("overrides,key,allowed", BAD, ids=[" ".join(o) for o, _, _ in BAD])
def test_bad_config_fails_fast_in_one_line(tmp_path, overrides, key, allowed):
    overrides = [o.replace("<gpt2>", gpt2_folder(tmp_path)) for o in overrides]
    start = time.perf_counter()
    with pytest.raises(ValueError) as err:
        validate(composed(*overrides))
    message = str(err.value)
    assert time.perf_counter() - start < 5
    assert "\n" not in message and key in message and allowed in message, message


def test_the_table_is_long_enough():
    assert len(BAD) >= 25


@pytest.mark.parametrize("group", GROUP_NAMES)
def test_unknown_group_option_lists_the_valid_ones(group, capsys):
    with pytest.raises(SystemExit) as exit_:
        check_group_options([f"{group}=nope"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {group}=nope is not an option; valid {group} options: ") and "\n" not in err


def test_cli_rejects_a_bad_precision_model_pair_before_loading_anything(tmp_path):
    start = time.perf_counter()
    res = run_cli("precision=fp8_e2e", f"model.path={gpt2_folder(tmp_path)}", f"hydra.run.dir={tmp_path / 'run'}",
                  cwd=tmp_path)  # fmt: skip
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert res.stderr.startswith("error: precision.name: fp8_e2e")
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "failed"
    assert time.perf_counter() - start < 30  # interpreter + torch import included; no model, no engine


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_cli_rejects_cuda_on_a_machine_without_it_before_loading_anything(tmp_path):
    res = run_cli("device=cuda", "rollout.tensor_parallel_size=2", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert res.stderr.startswith("error: device: cuda, but this machine has no usable CUDA device")
    assert res.stderr.strip().endswith("use device=cpu")
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "failed"
