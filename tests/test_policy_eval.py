"""`eval.engine=policy`: held-out accuracy measured on the policy itself, never through a mismatch dose.

The testbed map (findings/map/) doses the rollout engine with quantisation or logit noise; were evaluation sampled
through that engine, the score would mix the dose into what it measures (a noise-2 engine scores 0.15 where the
policy scores 0.25). With `eval.engine=policy` an HF engine holding the trainer's fp32 weights, with no quantisation
and no noise, samples the evaluation.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.config import validate
from harness.loop.train import train
from harness.rundir.files import read_jsonl
from tests.conftest import FAST_TRAINER, compose


def evals(run_dir: Path, small_model: list[str], *overrides: str) -> list[dict]:
    raw = compose(*small_model, *FAST_TRAINER, "rollout=hf", "trainer.total_steps=1", "eval.n=2", *overrides)
    train(validate(raw), run_dir, raw)
    return [{k: r[k] for k in ("step", "avg@2", "problems")} for r in read_jsonl(run_dir / "eval.jsonl")]


@pytest.mark.slow  # trains the small model
def test_the_policy_evaluates_the_same_whatever_the_rollout_dose(tmp_path, small_model):
    clean = evals(tmp_path / "clean", small_model, "precision=fp32", "eval.engine=policy")
    # With an fp32 rollout copy and no noise the rollout engine is the policy: both engines give every sample alike.
    assert evals(tmp_path / "rollout", small_model, "precision=fp32") == clean
    # A dose on the rollout engine: step 0 (the same weights) scores exactly as without it...
    for dose in (["rollout.logit_noise=4"], ["precision=w4a4_rollout"]):
        dosed = evals(tmp_path / dose[0].split("=")[-1], small_model, *dose, "eval.engine=policy")
        assert dosed[0] == clean[0], dose
    # ...while the default evaluation samples through the dose, and its score moves with it.
    through = evals(tmp_path / "through", small_model, "rollout.logit_noise=4")
    assert through[0]["problems"] != clean[0]["problems"]


def test_eval_engine_is_a_checked_choice():
    with pytest.raises(Exception, match="eval.engine"):
        validate(compose("eval.engine=clean"))
