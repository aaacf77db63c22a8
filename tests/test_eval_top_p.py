"""eval.top_p reaches both engines' sampling without a model: the HF sampler's nucleus, vLLM's SamplingParams."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from harness.rollout.base import check_generate_args
from harness.rollout.hf import _SampleAndRecord
from harness.rollout.vllm import VLLMEngine

PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05])


def sample(top_p: float, rows: int = 4000) -> tuple[torch.Tensor, torch.Tensor]:
    sampler = _SampleAndRecord(1.0, 2, torch.Generator().manual_seed(0), top_p)
    out = sampler(torch.zeros(rows, 1, dtype=torch.long), PROBS.log().expand(rows, 4).clone())
    tokens = out.argmax(dim=-1)
    assert torch.equal(out.max(dim=-1).values, torch.zeros(rows))  # a one-hot at the sampled token
    return tokens, sampler.stacked()[0][:, 0]


def test_hf_nucleus_keeps_the_smallest_set_covering_top_p():
    # top_p 0.7: 0.5 alone does not cover it, 0.5 + 0.3 = 0.8 does -> tokens {0, 1}, renormalised 0.625 / 0.375.
    tokens, logp = sample(0.7)
    assert set(tokens.tolist()) == {0, 1}
    assert (tokens == 0).float().mean().item() == pytest.approx(0.625, abs=0.03)
    # The recorded log-prob is still log_softmax over the whole vocabulary (evaluation does not use it).
    assert torch.allclose(logp, PROBS.log()[tokens])
    # top_p 0.45: the most probable token alone covers it; top_p tiny: the most probable token always stays.
    assert set(sample(0.45)[0].tolist()) == {0} and set(sample(1e-6)[0].tolist()) == {0}


def test_hf_top_p_one_is_the_unchanged_sampler():
    tokens, _ = sample(1.0)
    assert set(tokens.tolist()) == {0, 1, 2, 3}
    default = _SampleAndRecord(1.0, 2, torch.Generator().manual_seed(0))
    rows = 4000
    ref = default(torch.zeros(rows, 1, dtype=torch.long), PROBS.log().expand(rows, 4).clone()).argmax(dim=-1)
    assert torch.equal(tokens, ref)


def test_vllm_sampling_params_carry_top_p():
    engine = object.__new__(VLLMEngine)
    engine._vllm = SimpleNamespace(SamplingParams=lambda **kw: kw)
    engine.eos_ids = torch.tensor([2])
    assert engine._sampling_params(1, 8, 1, 0.7, 0, 0.95)["top_p"] == 0.95
    assert engine._sampling_params(1, 8, 1, 1.0, 0)["top_p"] == 1.0  # training rollouts: the default


@pytest.mark.parametrize("top_p", [0.0, -0.1, 1.01, math.nan])
def test_bad_top_p_is_one_line(top_p):
    with pytest.raises(ValueError, match=r"^generate: top_p must be in \(0, 1\]"):
        check_generate_args([[1]], 1, 4, 1, 1.0, 20, None, top_p)
