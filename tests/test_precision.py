"""Precision policies: the table, fp8 e4m3 fake-quant, the rollout weight transform, straight-through fp8 linears.
(How the precisions move engine log-probs is in test_rollout.py::test_mismatch_grows_fp32_bf16_fp8.)"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import Qwen3Config, Qwen3ForCausalLM

from harness import precision
from harness.precision import Fp8Linear, fp8_fake_quant_state_dict, wrap_fp8_linears
from harness.quant import E4M3_MAX, fp8_quantize_dequantize


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.fixture(scope="module")
def tiny() -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return Qwen3ForCausalLM(config)


def test_table() -> None:
    assert precision.PRECISIONS[:4] == ("fp32", "bf16", "fp8_rollout", "fp8_e2e")
    fp32, bf16, fp8r, fp8e = (precision.get(name) for name in precision.PRECISIONS[:4])
    assert (fp32.rollout_dtype, fp32.train_autocast, fp32.rollout_fp8, fp32.train_fp8) == (
        torch.float32,
        None,
        False,
        False,
    )
    assert (bf16.rollout_dtype, bf16.train_autocast, bf16.rollout_fp8) == (torch.bfloat16, torch.bfloat16, False)
    assert fp8r.rollout_fp8 and not fp8r.train_fp8 and fp8r.train_autocast == torch.bfloat16
    assert fp8e.rollout_fp8 and fp8e.train_fp8 and fp8e.rollout_dtype == torch.bfloat16
    with pytest.raises(
        ValueError, match="precision: unknown 'fp16'; allowed: fp32, bf16, fp8_rollout, fp8_e2e, w8a8_rollout"
    ):
        precision.get("fp16")


def test_weight_transform_and_vllm_kwargs() -> None:
    assert precision.rollout_weight_transform("fp32") is None
    assert precision.rollout_weight_transform("bf16") is None
    assert precision.rollout_weight_transform("fp8_rollout") is fp8_fake_quant_state_dict
    assert precision.rollout_weight_transform("fp8_e2e") is fp8_fake_quant_state_dict
    assert precision.vllm_kwargs("fp32", "cpu") == {"dtype": "float32"}
    assert precision.vllm_kwargs("fp8_rollout", "cpu") == {"dtype": "bfloat16"}  # fake-quant on sync instead
    assert precision.vllm_kwargs("fp8_e2e", "cuda") == {"dtype": "bfloat16", "quantization": "fp8"}
    assert precision.vllm_kwargs("bf16", "cuda:1") == {"dtype": "bfloat16"}


def test_autocast_context() -> None:
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with precision.autocast("fp32"):
        assert (a @ b).dtype == torch.float32
    with precision.autocast("fp8_e2e"):
        assert (a @ b).dtype == torch.bfloat16


def test_fp8_round_trip_error_and_grid() -> None:
    torch.manual_seed(0)
    w = torch.randn(256, 512)
    q = fp8_quantize_dequantize(w)
    # e4m3 keeps 3 mantissa bits: relative rounding error up to 2^-4, about 2-3e-2 in norm for Gaussian data
    assert 1.5e-2 < rel_err(q, w) < 4e-2
    # per-row amax survives exactly, so every row is on its own e4m3 grid: rounding again changes nothing
    scale = w.abs().amax(dim=1, keepdim=True) / E4M3_MAX
    assert torch.allclose(q.abs().amax(dim=1, keepdim=True), w.abs().amax(dim=1, keepdim=True))
    on_grid = q / scale
    assert torch.allclose(on_grid.to(torch.float8_e4m3fn).float(), on_grid, rtol=1e-6, atol=0)
    assert torch.allclose(fp8_quantize_dequantize(q), q, rtol=1e-6, atol=0)


def test_fp8_edge_cases() -> None:
    x = torch.tensor([[0.0, 0.0], [448.0, -448.0], [1e-30, 2e-30]])
    q = fp8_quantize_dequantize(x)
    assert torch.isfinite(q).all() and q[0].tolist() == [0.0, 0.0] and q[1].tolist() == [448.0, -448.0]
    # per tensor: the small row underflows to 0 under the big row's scale, it does not become NaN
    t = fp8_quantize_dequantize(x, dim=None)
    assert torch.isfinite(t).all() and t[2].tolist() == [0.0, 0.0]
    assert fp8_quantize_dequantize(torch.randn(8, 8, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_state_dict_transform_touches_only_linear_weights(tiny: Qwen3ForCausalLM) -> None:
    sd = {k: v.clone() for k, v in tiny.state_dict().items()}
    out = fp8_fake_quant_state_dict(sd)
    assert out.keys() == sd.keys()
    changed = {k for k in sd if not torch.equal(out[k], sd[k])}
    linear = {n + ".weight" for n, m in tiny.named_modules() if isinstance(m, nn.Linear) and n != "lm_head"}
    assert changed == linear and len(linear) == 2 * 7  # q k v o gate up down per layer
    for k in changed:
        assert 5e-3 < rel_err(out[k], sd[k]) < 5e-2
    for k in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"):
        assert out[k] is sd[k]
    assert all(torch.equal(v, tiny.state_dict()[k]) for k, v in sd.items()), "input left unmodified"


def test_ste_gradient_is_identity_through_the_quantizer() -> None:
    torch.manual_seed(1)
    lin = nn.Linear(32, 16)
    x = torch.randn(8, 32, requires_grad=True)
    upstream = torch.randn(8, 16)
    fp8 = Fp8Linear(32, 16)
    fp8.load_state_dict(lin.state_dict())
    (fp8(x) * upstream).sum().backward()
    # Reference: a plain linear evaluated at the rounded weight and input. Straight-through means the gradient
    # w.r.t. the unrounded tensors equals the gradient w.r.t. the rounded ones.
    w_q = fp8_quantize_dequantize(lin.weight.detach()).requires_grad_()
    x_q = fp8_quantize_dequantize(x.detach()).requires_grad_()
    (torch.nn.functional.linear(x_q, w_q, lin.bias.detach()) * upstream).sum().backward()
    assert torch.allclose(fp8.weight.grad, w_q.grad, atol=1e-6)
    assert torch.allclose(x.grad, x_q.grad, atol=1e-6)
    # ...which is the unquantized layer's gradient up to fp8 rounding of the other factor
    x32 = x.detach().requires_grad_()
    (lin(x32) * upstream).sum().backward()
    assert rel_err(fp8.weight.grad, lin.weight.grad) < 5e-2 and rel_err(x.grad, x32.grad) < 5e-2
    assert torch.equal(fp8.bias.grad, lin.bias.grad)


def test_wrap_fp8_linears(tiny: Qwen3ForCausalLM) -> None:
    model = Qwen3ForCausalLM(tiny.config)
    model.load_state_dict(tiny.state_dict())
    keys = list(model.state_dict())
    params = [id(p) for p in model.parameters()]
    ids = torch.randint(0, 96, (2, 10))
    ref = model(ids).logits.detach()
    assert wrap_fp8_linears(model) == 14
    assert wrap_fp8_linears(model) == 0  # already wrapped
    assert type(model.lm_head) is nn.Linear and type(model.model.layers[0].mlp.up_proj) is Fp8Linear
    assert list(model.state_dict()) == keys and [id(p) for p in model.parameters()] == params
    with precision.autocast("fp8_e2e"):
        logits = model(ids).logits
        logits.float().logsumexp(-1).sum().backward()
    assert 0 < rel_err(logits.detach(), ref) < 0.1
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
