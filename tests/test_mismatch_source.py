"""The calibrated mismatch sources on the real tiny model (model=tiny, no mocks): a rollout engine built as a run
builds it samples 32 prompts x 8, the fp32 trainer scores the same tokens, and |pi - mu| must lie where
findings/CALIBRATION.md says it does at step 1: about the papers' range (mean ~0.003-0.02, max >= 0.5; the W4A4 copy
down to 0.002 on some CPUs, below).

The tiny model is the one `make run` builds (cached; a first build takes ~2 min). One torch thread: < 30 s."""

from __future__ import annotations

import random

import pytest
import torch

from harness.batch import build_batch, policy_logprobs
from harness.config import compose, validate
from harness.loop.model_path import model_dir
from harness.models import load_policy
from harness.rollout import make_engine
from harness.tasks import load_problems, render_prompts
from harness.tasks.arith import balanced_sample

# (precision, rollout.logit_noise) -> (lowest mean, highest mean, lowest max) of |pi - mu| at step 1, with margins
# around the values measured on seeds 0-2 (findings/CALIBRATION.md, "Mismatch sources"). The tiny model builds to
# other floats on other CPUs, and the W4A4 copy's mean moves with it: 0.0034-0.0042 where section 1 measured it,
# 0.0023-0.0026 on the machine of section 23 (2026-12-05, seed 0: 0.00243, max 0.58), below the papers' ~0.003.
# The band is what the source was measured to give, not the papers' range.
EXPECTED = {
    ("w4a4_rollout", 0.0): (0.002, 0.02, 0.5),
    ("fp32", 1.0): (0.003, 0.02, 0.5),
}


def load_tiny() -> tuple[str, torch.nn.Module, list[list[int]], int]:
    """(model folder, fp32 policy, 32 prompts, pad id) of the tiny model."""
    cfg = validate(compose("rollout=hf", "logger=none"))
    path = str(model_dir(cfg))  # builds the tiny model if it is not cached yet
    policy, tokenizer = load_policy(path)
    policy.eval()
    train, _ = load_problems(cfg.data, cfg.benchmark)
    problems = balanced_sample(train, 32, random.Random(123))
    return path, policy, render_prompts(tokenizer, problems, "chat"), tokenizer.pad_token_id


@pytest.fixture(scope="module")
def tiny():
    return load_tiny()


def abs_prob_diff(tiny, precision: str, logit_noise: float, seed: int = 0, n_prompts: int = 32) -> torch.Tensor:
    """|pi - mu| over every sampled response token: mu from the engine as a run builds it, pi from the trainer."""
    path, policy, prompts, pad_id = tiny
    prompts = prompts[:n_prompts]
    engine = make_engine("hf", path, precision, seed=seed, max_model_len=512, logit_noise=logit_noise)
    try:
        ro = engine.generate(prompts, n=8, max_new_tokens=24, seed=seed)
    finally:
        engine.close()
    batch = build_batch(ro, torch.zeros(len(ro.texts)), pad_id, topk=1)
    with torch.no_grad():
        logp = policy_logprobs(policy, batch).logp
    m = batch.mask > 0
    return (logp.exp() - batch.behavior_logp.exp())[m].abs()


def test_fp32_engine_has_no_mismatch(tiny) -> None:
    # The control: the same weights in the same precision give mu = pi (to float rounding).
    assert abs_prob_diff(tiny, "fp32", 0.0, n_prompts=4).max() < 1e-4


@pytest.mark.parametrize(("precision", "logit_noise"), list(EXPECTED))
def test_mismatch_in_papers_range(tiny, precision: str, logit_noise: float) -> None:
    low, high, max_low = EXPECTED[(precision, logit_noise)]
    d = abs_prob_diff(tiny, precision, logit_noise)
    assert low <= float(d.mean()) <= high, f"mean |pi-mu| {float(d.mean()):.4g} outside [{low}, {high}]"
    assert float(d.max()) >= max_low, f"max |pi-mu| {float(d.max()):.3g} < {max_low}"
