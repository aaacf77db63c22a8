"""Issue 6, security: configs cannot instantiate arbitrary code, and secrets never reach the run directory."""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import pytest

from harness.config import validate
from tests.conftest import FAST_TRAINER, ROOT, compose


@pytest.mark.parametrize(
    "override,message",
    [
        ("+objective._target_=os.system", "objective: unknown key '_target_'"),
        ("+trainer._target_=os.system", "trainer: unknown key '_target_'"),
        ("+model._target_=subprocess.run", "model: unknown key '_target_'"),
        ("+_target_=builtins.exec", "unknown top-level key '_target_'"),
        ("objective.name=os.system", "objective"),  # only registered objective names resolve
    ],
)
def test_a_config_cannot_name_an_import_path(override, message):
    with pytest.raises(ValueError, match=message):
        validate(compose(override))


def test_the_code_never_instantiates_or_evaluates_config_values():
    """No hydra.utils.instantiate / call, eval or exec anywhere in the package: configs pick from registries."""
    banned = {"instantiate", "call", "eval", "exec", "get_method", "get_class", "get_object", "__import__"}
    offenders = []
    for path in [
        *sorted((ROOT / "harness").rglob("*.py")),
        *sorted((ROOT / "analysis").rglob("*.py")),
        ROOT / "run.py",
    ]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                fn = node.func
                name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
                # model.eval() switches a torch module to inference mode: a method call with no arguments.
                if name in banned and not (name == "eval" and isinstance(fn, ast.Attribute) and not node.args):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}()")
    assert not offenders, offenders


@pytest.mark.slow  # trains the small model
def test_the_wandb_key_never_reaches_the_run_directory(tmp_path, small_model, monkeypatch):
    from harness.loop.train import train

    secret = "local-0123456789abcdef0123456789abcdef01234567"
    monkeypatch.setenv("WANDB_API_KEY", secret)
    monkeypatch.setenv("WANDB_MODE", "offline")
    raw = compose(*small_model, *FAST_TRAINER, "rollout=hf", "logger=wandb", "trainer.total_steps=1")
    run_dir = tmp_path / "run"
    summary = train(validate(raw), run_dir, raw)
    assert summary["status"] == "completed" and (run_dir / "wandb").is_dir()
    leaks = []
    for path in run_dir.rglob("*"):
        if path.is_file() and secret.encode() in path.read_bytes():
            leaks.append(str(path.relative_to(run_dir)))
    assert not leaks, f"WANDB_API_KEY found in {leaks}"
    assert os.environ["WANDB_API_KEY"] == secret  # the check saw the key set for the whole run


def test_grading_never_hands_model_text_to_python(monkeypatch):
    """The guard is LaTeX-only extraction: math-verify's expression extraction passes the model's text to sympy's
    parse_expr, which compiles it and evaluates it with Python's eval. An audit hook sees every compile: with the
    guard the payload's expression never reaches one (the LaTeX grammar compiles single number tokens only);
    with the guard off (expression extraction added, as math-verify's default has it) it does."""
    import math_verify

    import harness.grading as grading
    import harness.rewards as rewards

    payload = "12345*67891+1"
    compiled: list[str] = []

    def hook(event: str, args: tuple) -> None:
        if event == "compile" and isinstance(args[0], str | bytes):
            source = args[0].decode(errors="replace") if isinstance(args[0], bytes) else args[0]
            flat = "".join(source.replace("Integer", "").split()).replace("(", "").replace(")", "")
            if payload in flat:
                compiled.append(source)

    sys.addaudithook(hook)  # an audit hook cannot be removed; it only records
    completions = [f"\\boxed{{{payload}}}", payload, f"The answer is {payload}"]
    rewards.grade(completions, ["1"] * 3, workers=1, require_boxed=False)
    assert compiled == [], f"model text was compiled for eval: {compiled}"
    monkeypatch.setattr(
        grading, "_LATEX_ONLY", (math_verify.LatexExtractionConfig(), math_verify.ExprExtractionConfig())
    )
    rewards.grade(completions, ["1"] * 3, workers=1, require_boxed=False)
    assert compiled, "with expression extraction the payload should have been compiled: the test cannot fail"


def test_grading_never_executes_model_text(tmp_path):
    from harness.rewards import grade

    marker = Path(tmp_path) / "pwned"
    payloads = [
        f"\\boxed{{__import__('os').system('touch {marker}')}}",
        f"\\boxed{{exec(\"open('{marker}','w')\")}}",
        f"\\boxed{{eval(\"open('{marker}','w')\")}}",
    ]
    result = grade(payloads, ["1"] * len(payloads), workers=1)
    assert not any(result.correct) and not marker.exists()
