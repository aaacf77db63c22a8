"""Eval-only runs end to end: the small tiny model, HF rollouts, math-verify, the run directory's files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.config import validate
from harness.loop.checkpoint import load_order
from harness.loop.eval_only import _latest_checkpoint, evaluate_model, resolve_model
from harness.loop.model_path import model_dir
from harness.loop.train import train
from harness.machine import check_files
from harness.rundir.files import read_jsonl
from tests.conftest import FAST_TRAINER, compose

# Every test evaluates the small model (built, trained a step, or run through run.py).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
AIME24 = ROOT / "data" / "aime" / "aime24.jsonl"  # the copy in this repository (data/aime/README.md)
AIME25 = AIME24.with_name("aime25.jsonl")
DAPO = Path(__file__).resolve().parent / "fixtures" / "dapo_verl.jsonl"
EVAL = ["mode=eval", "rollout=hf", "logger=none", "trainer.threads=1", "trainer.max_new_tokens=16"]


def evaluate_into(run_dir: Path, *overrides: str) -> tuple[dict, dict]:
    raw = compose(*EVAL, *overrides)
    summary = evaluate_model(validate(raw), run_dir, raw)
    (record,) = read_jsonl(run_dir / "eval.jsonl")
    return summary, record


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, small_model) -> Path:
    """One training step with a checkpoint, laid out as run.py leaves it (.hydra/config.yaml included)."""
    run_dir = tmp_path_factory.mktemp("runs") / "train"
    raw = compose(*small_model, *FAST_TRAINER, "rollout=hf", "trainer.total_steps=1")
    train(validate(raw), run_dir, raw)
    (run_dir / ".hydra").mkdir()
    OmegaConf.save(OmegaConf.create(raw), run_dir / ".hydra" / "config.yaml")
    return run_dir


def test_eval_of_a_run_directory_reproduces_its_step_eval(tmp_path, trained_run):
    # Same benchmark, n, length and seed as the training run's evaluation after step 1.
    first_summary, first = evaluate_into(tmp_path / "a", f"model.path={trained_run}", "benchmark.max_problems=12")
    _, second = evaluate_into(tmp_path / "b", f"model.path={trained_run}", "benchmark.max_problems=12")
    trained = read_jsonl(trained_run / "eval.jsonl")[-1]

    assert first["step"] == 1 and first_summary["step"] == 1
    assert first_summary["checkpoint"].endswith("checkpoints/step_1/model.safetensors")
    assert first["avg@1"] == second["avg@1"] == trained["avg@1"] == first_summary["final_score"]
    assert first["problems"] == second["problems"] == trained["problems"]
    assert len(first["problems"]) == 12 and all(row["n"] == 1 for row in first["problems"])
    for name in ("eval.jsonl", "samples.jsonl", "summary.json"):
        assert (tmp_path / "a" / name).is_file()
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["mode"] == "eval"
    assert len(read_jsonl(tmp_path / "a" / "samples.jsonl")) == 8  # trainer.samples_per_eval


def test_eval_of_a_checkpoint_folder_and_of_a_model_folder(tmp_path, trained_run, small_model):
    step_dir = trained_run / "checkpoints" / "step_1"
    _, record = evaluate_into(tmp_path / "ckpt", f"model.path={step_dir}", "benchmark.max_problems=12", "eval.n=2")
    assert record["step"] == 1 and 0 <= record["avg@2"] <= 1 and "maj@2" in record and "pass@2" in record
    base = model_dir(validate(compose(*small_model)))
    src = resolve_model(validate(compose(*EVAL, f"model.path={base}")))
    assert (src.base, src.weights, src.step, src.tiny) == (str(base), None, 0, False)


def test_tiny_model_on_aime_cuts_prompts_to_its_context(tmp_path, small_model):
    summary, record = evaluate_into(
        tmp_path / "aime",
        *small_model,
        "benchmark=aime24",
        f"benchmark.path={AIME24}",
        "benchmark.max_problems=3",
        "eval.n=2",
    )
    assert summary["status"] == "completed" and summary["n_problems"] == 3 and record["step"] == 0
    assert record["benchmark"] == "aime24"
    assert [r["id"] for r in record["problems"]] == ["2024-I-1", "2024-I-2", "2024-I-3"]
    assert 0 < record["prompt_truncated_frac"] <= 1  # AIME problems are longer than 512 tiny-BPE tokens
    assert record["acc/aime24"] == record["avg@2"]


def test_a_run_directory_is_evaluated_at_the_checkpoint_a_resume_would_load(tmp_path):
    """One ordering of a run's checkpoints (checkpoint.load_order, what load_latest tries first): the newest
    step by number, not by name; the one `latest` names when it names another; never a temp folder."""
    root = tmp_path / "checkpoints"
    for name in ("step_2", "step_10", ".tmp-step_11-x"):
        (root / name).mkdir(parents=True)
    assert _latest_checkpoint(tmp_path) == root / "step_10" == load_order(root)[0]
    (root / "latest").write_text("step_2\n")
    assert _latest_checkpoint(tmp_path) == root / "step_2" == load_order(root)[0]


def test_bad_model_paths_fail_with_one_line(tmp_path, trained_run):
    empty_run = tmp_path / "empty_run"
    (empty_run / ".hydra").mkdir(parents=True)
    (empty_run / ".hydra" / "config.yaml").write_text((trained_run / ".hydra" / "config.yaml").read_text())
    (tmp_path / "junk").mkdir()
    cases = [
        (str(tmp_path / "nope"), ValueError, r"model.path: '.*nope' does not exist"),  # check_files catches it
        (str(tmp_path / "junk"), ValueError, r"neither a run directory .* nor a model folder"),
        (str(empty_run), FileNotFoundError, r"has no checkpoint under checkpoints/"),
    ]
    for path, exc, message in cases:
        with pytest.raises(exc, match=message) as err:
            cfg = validate(compose(*EVAL, f"model.path={path}"))
            check_files(cfg)
            resolve_model(cfg)
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("data", ["arith", "dapo_math"])
def test_training_evaluates_on_aime_without_code_changes(tmp_path, small_model, data):
    source = [f"data.path={DAPO}"] if data == "dapo_math" else []
    raw = compose(
        *small_model,
        *FAST_TRAINER,
        "rollout=hf",
        "trainer.total_steps=1",
        f"data={data}",
        *source,
        "benchmark=aime24_25",
        f"benchmark.path=[{AIME24},{AIME25}]",
        "benchmark.max_problems=4",
    )
    summary = train(validate(raw), tmp_path / "run", raw)
    evals = read_jsonl(tmp_path / "run" / "eval.jsonl")
    assert summary["status"] == "completed" and [e["step"] for e in evals] == [0, 1]
    for e in evals:
        assert e["benchmark"] == "aime24_25" and {"acc/aime24", "acc/aime25", "maj@1", "pass@1"} <= set(e)
        assert [r["id"] for r in e["problems"]] == ["2024-I-1", "2025-I-1", "2024-I-2", "2025-I-2"]


def test_run_py_mode_eval(tmp_path, small_model):
    args = [*small_model, *EVAL, "benchmark.max_problems=6", "eval.n=2", f"hydra.run.dir={tmp_path / 'out'}"]
    res = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *args], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "evaluation finished: completed" in res.stdout
    (record,) = read_jsonl(tmp_path / "out" / "eval.jsonl")
    assert record["benchmark"] == "arith" and len(record["problems"]) == 6


def test_eval_of_a_run_directory_with_vllm(tmp_path, trained_run):
    # vLLM takes the checkpoint through its own weight loader (tied head included); the HF test above checks
    # the weights are the trained ones, this one that the vLLM path runs.
    summary, record = evaluate_into(
        tmp_path / "v", f"model.path={trained_run}", "rollout=vllm", "benchmark.max_problems=12", "eval.n=2"
    )
    assert summary["status"] == "completed" and record["step"] == 1 and 0 <= record["avg@2"] <= 1
    assert len(record["problems"]) == 12 and all(len(r["predictions"]) == 2 for r in record["problems"])


def test_figures_read_an_eval_only_run_beside_the_training_run(tmp_path, trained_run):
    """`make figures` over an outputs/ that holds a training run and an eval-only run of it (the README's two
    commands in turn): the eval run's summary has a `step` (its checkpoint's) that a training summary lacks, and
    reading the two together failed casting that column to int."""
    import shutil

    from analysis.__main__ import main as figures
    from analysis.load import load_runs

    outputs = tmp_path / "outputs"
    shutil.copytree(trained_run, outputs / "train")
    raw = compose(*EVAL, f"model.path={trained_run}", "benchmark.max_problems=6")
    evaluate_model(validate(raw), outputs / "eval", raw)
    (outputs / "eval" / ".hydra").mkdir()
    OmegaConf.save(OmegaConf.create(raw), outputs / "eval" / ".hydra" / "config.yaml")

    summaries = load_runs([outputs]).summaries
    by_mode = {row["mode"] if row["mode"] == "eval" else "train": row for row in summaries.to_dict("records")}
    assert sorted(by_mode) == ["eval", "train"] and by_mode["eval"]["step"] == 1
    assert by_mode["train"]["status"] == "completed" and by_mode["train"]["n_steps"] == 1
    assert figures(["--roots", str(outputs), "--out", str(tmp_path / "figures"), "--no-geometry"]) == 0
    assert (tmp_path / "figures" / "index.md").is_file()


def test_a_model_folder_with_a_torn_tokenizer_fails_in_one_line_before_the_run_starts(tmp_path, small_model):
    """A model folder (config.json) whose tokenizer cannot load (a torn tokenizer.json): one line naming the
    folder, raised before the run's log or W&B start, so the run directory stays empty (run.py's handler then
    records the line)."""
    import shutil

    from harness.config import SetupError

    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(model_dir(validate(compose(*small_model))) / "config.json", broken / "config.json")
    (broken / "tokenizer.json").write_text("{not json")
    (broken / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}')
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    raw = compose(*EVAL, f"model.path={broken}", "benchmark.max_problems=4")
    with pytest.raises(SetupError, match=rf"^folder '{broken}' is not a loadable model: ") as err:
        evaluate_model(validate(raw), run_dir, raw)
    assert "\n" not in str(err.value) and list(run_dir.iterdir()) == []
