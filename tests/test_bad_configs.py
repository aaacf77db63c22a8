"""Issue 6: every bad configuration fails before any model is built, fast, with one line naming the key and
what is allowed. A table, so a new check is one row. A row is refused by `validate` (the config alone) or by
`harness.machine.check_files` (the files it names), the two checks run.py makes before any model is built."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from harness.cli.checks import GROUP_NAMES, check_group_options, check_override_keys
from harness.config import validate
from harness.machine import check_files
from tests.test_config import children_cpu_s, composed, run_cli


def gpt2_folder(tmp: Path) -> str:
    """A model folder whose projections are Conv1D, not nn.Linear: config only, no weights needed."""
    folder = tmp / "gpt2-like"
    folder.mkdir(exist_ok=True)
    config = {"model_type": "gpt2", "n_embd": 32, "n_layer": 1, "n_head": 2, "vocab_size": 64, "n_positions": 64}
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def latin1_file(tmp: Path) -> str:
    """A benchmark file saved as Latin-1, not UTF-8: the 'é' is the single byte 0xe9."""
    path = tmp / "latin1.jsonl"
    path.write_bytes('{"problem": "caf\u00e9 costs 1 + 1", "answer": 2}\n'.encode("latin-1"))
    return str(path)


def short_context_folder(tmp: Path) -> str:
    """A model folder whose config.json allows 64 positions (no weights: validation must not need them)."""
    folder = tmp / "ctx64"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3", "max_position_embeddings": 64}))
    return str(folder)


PLACEHOLDERS = {"<gpt2>": gpt2_folder, "<latin1>": latin1_file, "<ctx64>": short_context_folder}


# (overrides, the key the message must name, a fragment saying what is allowed)
BAD = [
    (["trainer.group_size=1"], "trainer.group_size", ">= 2"),
    (["correction=decoupled_token_rs", "correction.rollout_rs=token_k9"], "correction.rollout_rs", "token_k1"),
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
    (["trainer.max_staleness=-1"], "trainer.max_staleness", ">= 0"),
    (["trainer.max_staleness=0.5"], "trainer.max_staleness", "expected int"),
    (["trainer.max_staleness=1", "rollout.sync=step"], "trainer.max_staleness", "set rollout.sync=rollout"),
    (["trainer.max_staleness=2", "rollout.behavior=trainer"], "trainer.max_staleness", "rollout.behavior=trainer"),
    (["trainer.bad_update_gap=1"], "trainer.bad_update_gap", "must be < 1, got 1.0"),
    (["trainer.bad_update_gap=-0.1"], "trainer.bad_update_gap", "must be >= 0"),
    (["trainer.bad_update_gap=half"], "trainer.bad_update_gap", "expected float"),
    (["trainer.resume=maybe"], "trainer.resume", "bool"),
    (["+trainer.epochs=2"], "trainer: unknown key 'epochs'", "allowed keys: advantage"),
    (["objective=dppo_topk_tv", "rollout.max_topk=5"], "rollout.max_topk", "objective.topk = 20"),
    (["objective.eps_high=-1"], "objective.eps_high", "> 0"),
    (["objective=dppo", "objective.delta=0"], "objective.delta", "> 0"),
    (["objective.agg=mean"], "objective.agg", "'token-mean'"),
    (["objective.anchor=ref"], "objective.anchor", "'behavior'"),
    (["objective=dppo_topk_kl", "objective.topk=0"], "objective.topk", ">= 1"),
    (["+objective.beta=0.1"], "objective: unknown key 'beta'", "allowed keys: agg"),
    (["objective=gspo", "objective.eps_low=0"], "objective.eps_low", "> 0"),
    (["objective=cppo", "objective.w_min=1.5"], "objective.w_min", "<= 1"),
    (["objective=cppo", "objective.delta_b=-0.02"], "objective.delta_b", ">= 0"),
    (["objective=icepop", "objective.mask_low=6"], "objective.mask_low", "must be < objective.mask_high (5.0)"),
    (["objective=icepop", "objective.anchor=behavior"], "objective.anchor", "supports only 'old'"),
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
    # Issue 18: values that used to pass validation and fail late, after the model and engine were built.
    (["trainer.lr=inf"], "trainer.lr", "must be a finite number, got inf"),
    (["trainer.lr=-inf"], "trainer.lr", "finite"),
    (["objective=dppo", "objective.delta=inf"], "objective.delta", "finite"),
    (["reward.timeout_s=inf"], "reward.timeout_s", "finite"),
    (["logger.init_timeout_s=inf"], "logger.init_timeout_s", "finite"),
    (["trainer.max_new_tokens=100000"], "trainer.max_new_tokens", "use at most 511"),
    (["eval.max_new_tokens=512"], "eval.max_new_tokens", "use at most 511"),
    (["model.path=<ctx64>", "model.max_model_len=512"], "model.max_model_len", "use at most 64"),
    (["benchmark=aime24", "benchmark.path=/nonexistent/aime.jsonl"], "benchmark.path", "does not exist"),
    (["benchmark=aime24", "benchmark.path=<latin1>"], "benchmark.path", "latin1.jsonl:1 is not UTF-8 (byte 0xe9"),
    (["data=dapo_math", "data.path=<latin1>"], "data.path", "is not UTF-8"),
    (["data=dapo_math", "data.path=./missing.parquet"], "data.path", "does not exist"),
    (["data.pool_path=/nonexistent/pool.json"], "data.pool_path", "harness.loop.pass_rates"),
    # A folder built on this machine (model.build): the error names the command that builds it.
    (["model=smollm2_135m", "model.path=/nonexistent/smollm2"], "model.path", "build it with make real-model"),
]


@pytest.mark.parametrize("overrides,key,allowed", BAD, ids=[" ".join(o) for o, _, _ in BAD])
def test_bad_config_fails_fast_in_one_line(tmp_path, overrides, key, allowed):
    for name, make in PLACEHOLDERS.items():
        overrides = [o.replace(name, make(tmp_path)) if name in o else o for o in overrides]
    start = time.process_time()  # this process's CPU time: what validation costs, whatever else runs
    with pytest.raises(ValueError) as err:
        check_files(validate(composed(*overrides)))
    message = str(err.value)
    assert time.process_time() - start < 5
    assert "\n" not in message and key in message and allowed in message, message


def test_every_group_a_run_composes_has_a_bad_value_in_the_table():
    """`experiment` only selects the other groups; every other group's section is named by some case above."""
    named = {key.split(".")[0] for _, key, _ in BAD}
    assert set(GROUP_NAMES) - {"experiment"} <= named, set(GROUP_NAMES) - {"experiment"} - named


@pytest.mark.parametrize("group", GROUP_NAMES)
def test_unknown_group_option_lists_the_valid_ones(group, capsys):
    with pytest.raises(SystemExit) as exit_:
        check_group_options([f"{group}=nope"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {group}=nope is not an option; valid {group} options: ") and "\n" not in err


UNKNOWN_KEYS = [
    (["trainer.lrr=1"], "trainer: unknown key 'lrr'; allowed keys: advantage, bad_update_gap, beta1, beta2,"),
    (["traner.lr=1"], "the config: unknown key 'traner'; allowed keys: benchmark, correction, data, device, eval,"),
    (["objective.delta=0.3"], "objective (objective=grpo): unknown key 'delta'; allowed keys: agg, anchor, eps_high,"),
    (["model.lora_rnk=8"], "model (model=tiny): unknown key 'lora_rnk'; allowed keys: architecture,"),
    (["-m", "objective=dppo,grpo", "objective.delta=0.3"], "objective (objective=grpo): unknown key 'delta'"),
    # The experiment's own sweep (hydra.sweeper.params) picks the objective: drpo has no `eps`.
    (["-m", "+experiment=drpo_ablation_absadv", "objective.eps=3"], "objective (objective=drpo): unknown key 'eps'"),
]


@pytest.mark.parametrize("argv,line", UNKNOWN_KEYS, ids=[" ".join(a) for a, _ in UNKNOWN_KEYS])
def test_an_override_of_a_key_the_config_lacks_is_one_line_naming_the_keys_there(argv, line, capsys):
    with pytest.raises(SystemExit) as exit_:
        check_override_keys(argv)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and err.startswith(f"error: {line}") and "\n" not in err, err


ACCEPTED = [
    ["objective=dppo", "objective.delta=0.3", "trainer.lr=1e-4"],
    ["-m", "objective=dppo,drpo", "objective.delta=0.1,0.2", "seed=1,2"],
    ["-m", "objective=glob(dppo_*)", "objective.delta=0.1"],
    ["-m", "+experiment=drpo_ablation_absadv", "trainer.total_steps=2"],
    ["+experiment=drpo_ablation_absadv", "objective=drpo", "objective.delta=0.2"],
    ["+trainer.epochs=2"],  # adding a key: validation refuses it, with its own line (BAD above)
    ["hydra.run.dir=/tmp/x", "~logger"],
    ["trainer.lrr=1", "trainer.lr=("],  # a line Hydra cannot parse: Hydra reports it
]


@pytest.mark.parametrize("argv", ACCEPTED, ids=[" ".join(a) for a in ACCEPTED])
def test_the_key_check_refuses_nothing_hydra_composes(argv):
    check_override_keys(argv)


@pytest.mark.slow  # starts run.py
def test_cli_refuses_an_unknown_key_in_one_line_before_any_folder_is_made(tmp_path):
    res = run_cli("trainer.lrr=1", cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [res.stderr.strip()], res.stderr
    assert res.stderr.startswith("error: trainer: unknown key 'lrr'; allowed keys: ") and "lr," in res.stderr
    assert "Could not override" not in res.stderr and not (tmp_path / "outputs").exists()


@pytest.mark.slow  # starts run.py
def test_cli_rejects_a_bad_precision_model_pair_before_loading_anything(tmp_path):
    start = children_cpu_s()
    res = run_cli("precision=fp8_e2e", f"model.path={gpt2_folder(tmp_path)}", f"hydra.run.dir={tmp_path / 'run'}",
                  cwd=tmp_path)  # fmt: skip
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert res.stderr.startswith("error: precision.name: fp8_e2e")
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "failed"
    assert children_cpu_s() - start < 30  # CPU s: interpreter + torch import included; no model, no engine


@pytest.mark.slow  # starts run.py
@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_cli_rejects_cuda_on_a_machine_without_it_before_loading_anything(tmp_path):
    res = run_cli("device=cuda", "rollout.tensor_parallel_size=2", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert res.stderr.startswith("error: device: cuda, but this machine has no usable CUDA device")
    assert res.stderr.strip().endswith("use device=cpu")
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "failed"


@pytest.mark.slow  # starts run.py
def test_cli_refuses_values_that_used_to_fail_after_the_model_loaded(tmp_path):
    """trainer.max_new_tokens beyond the context and lr=inf: one line, exit 2, before any model or engine."""
    for bad, message in (
        ("trainer.max_new_tokens=100000", "error: trainer.max_new_tokens: 100000 leaves no room for a prompt"),
        ("trainer.lr=inf", "error: trainer.lr: must be a finite number, got inf"),
    ):
        start = children_cpu_s()
        run_dir = tmp_path / bad.partition("=")[0]
        res = run_cli(bad, f"hydra.run.dir={run_dir}", cwd=tmp_path)
        assert res.returncode == 2 and res.stderr.strip().splitlines() == [res.stderr.strip()], res.stderr
        assert res.stderr.startswith(message), res.stderr
        assert not (run_dir / "checkpoints").exists()
        assert children_cpu_s() - start < 30


@pytest.mark.slow  # starts run.py
def test_eval_mode_without_network_or_benchmark_path_is_one_line(tmp_path):
    """mode=eval with a hub benchmark (benchmark.path=HuggingFaceH4/aime_2024; the default reads the repository's
    data/aime/) and no network ends like training does: exit 2 and one line (not datasets' retries and a
    traceback). HF_ENDPOINT points at a host that cannot resolve, so
    the test means the same on a machine that has a network."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    # W&B as a user gets it without the Makefile's WANDB_SILENT: its banner would come before our line if W&B
    # started before the benchmark was read.
    env = {**os.environ, "HF_ENDPOINT": "https://hub.invalid", "HF_HUB_OFFLINE": "0", "WANDB_MODE": "offline",
           "WANDB_SILENT": "false"}  # fmt: skip
    res = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "mode=eval", "benchmark=aime24", "rollout=hf",
         "benchmark.path=HuggingFaceH4/aime_2024", f"hydra.run.dir={tmp_path / 'eval'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.strip().splitlines() == [res.stderr.strip()], res.stderr[-2000:]
    assert res.stderr.startswith("error: benchmark.path: hub dataset 'HuggingFaceH4/aime_2024' cannot be downloaded")
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == res.stderr.strip().removeprefix("error: ")


@pytest.mark.slow  # starts run.py
def test_training_prompts_that_cannot_fit_fail_before_the_model_loads(tmp_path, small_model):
    """A training prompt longer than model.max_model_len - trainer.max_new_tokens used to crash the step that
    sampled it; now the run does not start, and the message says how to drop such prompts."""
    rows = [{"problem": "1 + 1", "answer": "2"}, {"problem": " + ".join(["1"] * 400), "answer": "400"}]
    data = tmp_path / "long.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = run_cli(*small_model, "data=dapo_math", f"data.path={data}", "rollout=hf",
                  "logger=none", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)  # fmt: skip
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [res.stderr.strip()], res.stderr[-2000:]
    assert "1 of 2 training prompts are longer than model.max_model_len" in res.stderr
    assert "set data.max_prompt_tokens=" in res.stderr


@pytest.mark.slow  # starts run.py
def test_a_malformed_data_file_fails_before_the_tiny_model_is_built(tmp_path):
    """A training or benchmark file whose rows lack the fields: one line and exit 2 before the tiny model's first
    build (minutes on 2 cores): on an empty model cache nothing is built."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"bad": 1}\n')
    cache = tmp_path / "cache"
    env = {**os.environ, "HARNESS_CACHE": str(cache), "WANDB_MODE": "offline"}
    for which in (["data=dapo_math", f"data.path={bad}"], ["benchmark=aime24", f"benchmark.path={bad}"]):
        res = subprocess.run(
            [sys.executable, str(ROOT / "run.py"), *which, "rollout=hf", "logger=none",
             f"hydra.run.dir={tmp_path / which[0].partition('=')[0]}"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert res.returncode == 2, res.stderr[-2000:]
        assert res.stderr.strip() == f"error: {bad}:1: missing field 'problem' or 'question' (fields present: bad)"
        assert not cache.exists() or list(cache.iterdir()) == [], list(cache.iterdir())
