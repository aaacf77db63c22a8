import math

import pytest
import torch

from bench.logprobs import cpu_peak_extra_bytes
from harness.logprobs import (
    LogProbOutput,
    gather_logprobs,
    logprobs_entropy_topk,
    token_entropy,
    token_logprobs,
)


def reference(logits: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0):
    """fp64 log_softmax(logits / T) at ids, and entropy -sum p log p."""
    logp_all = torch.log_softmax(logits.double() / temperature, dim=-1)
    logp = logp_all.gather(-1, ids[..., None]).squeeze(-1)
    entropy = -torch.linalg.vecdot(logp_all.exp(), logp_all)
    return logp, entropy, logp_all


def random_case(shape: tuple[int, ...], vocab: int, k: int = 4, seed: int = 0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(*shape, vocab, generator=gen, dtype=torch.float64) * 3).to(dtype)
    ids = torch.randint(0, vocab, shape, generator=gen)
    topk_ids = torch.randint(0, vocab, (*shape, k), generator=gen)
    return logits, ids, topk_ids


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6])
@pytest.mark.parametrize("chunk_rows", [None, 4])
def test_values_match_fp64_reference_with_leading_dims(temperature, chunk_rows):
    logits, ids, topk_ids = random_case((3, 5), vocab=50)
    out = logprobs_entropy_topk(logits, ids, topk_ids, temperature=temperature, chunk_rows=chunk_rows)
    ref_logp, ref_entropy, ref_all = reference(logits, ids, temperature)
    assert isinstance(out, LogProbOutput)
    assert out.logp.shape == (3, 5) and out.entropy.shape == (3, 5) and out.topk_logp.shape == (3, 5, 4)
    assert out.logp.dtype == out.entropy.dtype == out.topk_logp.dtype == torch.float32
    torch.testing.assert_close(out.logp.double(), ref_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.entropy.double(), ref_entropy, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.topk_logp.double(), ref_all.gather(-1, topk_ids), atol=1e-5, rtol=0)
    # The single-purpose entry points agree with the fused one.
    torch.testing.assert_close(token_logprobs(logits, ids, temperature, chunk_rows), out.logp, atol=0, rtol=0)
    torch.testing.assert_close(token_entropy(logits, temperature, chunk_rows), out.entropy, atol=0, rtol=0)
    torch.testing.assert_close(gather_logprobs(logits, topk_ids, temperature, chunk_rows), out.topk_logp)


def test_single_row_without_leading_dims():
    logits = torch.tensor([0.0, math.log(3.0)])  # softmax = [1/4, 3/4]
    logp = token_logprobs(logits, torch.tensor(1))
    assert logp.shape == ()
    assert logp.item() == pytest.approx(math.log(0.75), abs=1e-6)
    # H = -(1/4 log 1/4 + 3/4 log 3/4) = 0.562335
    assert token_entropy(logits).item() == pytest.approx(0.562335, abs=1e-6)


def test_gradcheck_double():
    logits, ids, _ = random_case((2, 3), vocab=7, dtype=torch.float64)
    logits.requires_grad_(True)
    # chunk_rows=4 does not divide the 6 rows: the last chunk is partial.
    assert torch.autograd.gradcheck(lambda x: token_logprobs(x, ids, 0.8, chunk_rows=4), (logits,))


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_fp32_grad_matches_fp64_autograd(temperature):
    logits, ids, topk_ids = random_case((4, 5), vocab=40, seed=1)
    weights = torch.randn(4, 5, generator=torch.Generator().manual_seed(2))
    ours_in = logits.clone().requires_grad_(True)
    out = logprobs_entropy_topk(ours_in, ids, topk_ids, temperature=temperature, chunk_rows=3)
    assert out.logp.requires_grad and not out.entropy.requires_grad and not out.topk_logp.requires_grad
    (out.logp * weights).sum().backward()
    ref_in = logits.double().requires_grad_(True)
    (reference(ref_in, ids, temperature)[0] * weights.double()).sum().backward()
    assert ours_in.grad.dtype == torch.float32
    torch.testing.assert_close(ours_in.grad.double(), ref_in.grad, atol=1e-6, rtol=0)


def test_bf16_grad_has_logits_dtype_and_matches():
    logits, ids, _ = random_case((6,), vocab=300, seed=3, dtype=torch.bfloat16)
    leaf = logits.clone().requires_grad_(True)
    token_logprobs(leaf, ids, chunk_rows=4).sum().backward()
    ref_in = logits.double().requires_grad_(True)
    reference(ref_in, ids)[0].sum().backward()
    assert leaf.grad.dtype == torch.bfloat16
    # One bf16 rounding of values in [-1, 1]: relative 2^-8.
    torch.testing.assert_close(leaf.grad.double(), ref_in.grad, atol=4e-3, rtol=2**-8)


@pytest.mark.slow  # a [1024, 151936] logit matrix against fp64: seconds of CPU
def test_bf16_qwen_vocab_acceptance():
    """B1 accuracy: bf16 logits [1024, 151936] ~ N(0, 2^2); |dlogp| <= 1e-3, |dH| <= 1e-2 vs fp64."""
    n, vocab = 1024, 151936
    gen = torch.Generator().manual_seed(1234)
    logits = torch.randn(n, vocab, generator=gen, dtype=torch.bfloat16).mul_(2.0)  # x2 is exact in bf16
    ids = torch.randint(0, vocab, (n,), generator=gen)
    out = logprobs_entropy_topk(logits, ids)
    max_dlogp = max_dentropy = 0.0
    # fp64 reference in row chunks: whole it would be 1.2 GB; 8 rows (10 MB) stay in cache.
    for r0 in range(0, n, 8):
        ref_logp, ref_entropy, _ = reference(logits[r0 : r0 + 8], ids[r0 : r0 + 8])
        max_dlogp = max(max_dlogp, (out.logp[r0 : r0 + 8].double() - ref_logp).abs().max().item())
        max_dentropy = max(max_dentropy, (out.entropy[r0 : r0 + 8].double() - ref_entropy).abs().max().item())
    assert max_dlogp <= 1e-3
    assert max_dentropy <= 1e-2


def test_topk_gather_equals_reference_and_includes_sampled_token():
    logits, ids, _ = random_case((2, 4), vocab=64, seed=4)
    _, _, ref_all = reference(logits, ids)
    topk_ids = ref_all.topk(8, dim=-1).indices
    got = gather_logprobs(logits, topk_ids, chunk_rows=3)
    torch.testing.assert_close(got.double(), ref_all.topk(8, dim=-1).values, atol=1e-5, rtol=0)
    # K = V covers the whole distribution: probabilities sum to one.
    everything = torch.arange(64).expand(2, 4, 64)
    torch.testing.assert_close(gather_logprobs(logits, everything).exp().sum(-1), torch.ones(2, 4))


def test_uniform_logits_entropy_is_log_vocab():
    logits = torch.full((3, 2, 1000), 2.5, dtype=torch.bfloat16)
    ids = torch.zeros(3, 2, dtype=torch.long)
    out = logprobs_entropy_topk(logits, ids, temperature=0.5, chunk_rows=4)
    torch.testing.assert_close(out.entropy, torch.full((3, 2), math.log(1000)), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.logp, torch.full((3, 2), -math.log(1000)), atol=1e-5, rtol=0)


def test_chunking_does_not_change_results():
    logits, ids, topk_ids = random_case((11,), vocab=257, seed=5)
    results = {}
    for rows in (1, 3, 4, 11, 64, None):  # 3 and 4 do not divide 11; 64 > N
        leaf = logits.clone().requires_grad_(True)
        out = logprobs_entropy_topk(leaf, ids, topk_ids, temperature=0.9, chunk_rows=rows)
        out.logp.sum().backward()
        results[rows] = (out.logp.detach(), out.entropy, out.topk_logp, leaf.grad)
    for rows, got in results.items():
        for a, b in zip(got, results[1], strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=f"chunk_rows={rows}")


def test_sliced_batch_logits_match_contiguous_copy_without_copying():
    # logits[:, 1:-1] of a [B, L, V] model output cannot be flattened to [B*(L-2), V] as a view.
    full, _, _ = random_case((4, 34), vocab=2048, seed=7, dtype=torch.bfloat16)
    ids = torch.randint(0, 2048, (4, 32), generator=torch.Generator().manual_seed(8))
    weights = torch.randn(4, 32, generator=torch.Generator().manual_seed(9))
    grads = []
    for make_input in (lambda leaf: leaf[:, 1:-1], lambda leaf: leaf[:, 1:-1].contiguous()):
        leaf = full.clone().requires_grad_(True)
        sliced = make_input(leaf)
        out = logprobs_entropy_topk(sliced, ids, chunk_rows=4)
        (out.logp * weights).sum().backward()
        grads.append((out.logp.detach(), out.entropy, leaf.grad))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)

    sliced = full[:, 1:-1]
    peak = cpu_peak_extra_bytes(lambda: logprobs_entropy_topk(sliced, ids, chunk_rows=4))
    assert peak < sliced.numel() * sliced.element_size() / 4  # far below even a bf16 copy


def test_masked_vocab_and_shifted_logits_are_stable():
    logits, ids, _ = random_case((5,), vocab=30, seed=6)
    masked = logits.clone()
    masked[:, 20:] = float("-inf")  # e.g. a vocab mask; ids below 20 stay valid
    ids = ids % 20
    out = logprobs_entropy_topk(masked, ids)
    ref_logp, ref_entropy, _ = reference(logits[:, :20], ids)
    torch.testing.assert_close(out.logp.double(), ref_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.entropy.double(), ref_entropy, atol=1e-5, rtol=0)
    assert token_logprobs(masked, torch.full((5,), 25)).eq(float("-inf")).all()
    # softmax is shift-invariant; a +1e4 offset would overflow a naive exp in fp32.
    shifted = token_logprobs(logits + 1e4, ids)
    torch.testing.assert_close(shifted.double(), reference(logits + 1e4, ids)[0], atol=1e-5, rtol=0)


def test_peak_memory_is_one_chunk_not_full_vocab_fp32():
    n, vocab, rows = 256, 4096, 16
    logits = torch.randn(n, vocab).bfloat16()
    ids = torch.randint(0, vocab, (n,))
    full_fp32 = n * vocab * 4
    two_buffers = 2 * rows * vocab * 4

    def forward() -> None:
        logprobs_entropy_topk(logits, ids, chunk_rows=rows)

    assert cpu_peak_extra_bytes(forward) <= two_buffers + 64 * n
    leaf = logits.clone().requires_grad_(True)

    def forward_backward() -> None:
        token_logprobs(leaf, ids, chunk_rows=rows).sum().backward()

    # The bf16 gradient itself (N*V*2) is unavoidable; beyond it, one fp32 chunk buffer.
    peak = cpu_peak_extra_bytes(forward_backward)
    assert peak <= n * vocab * 2 + rows * vocab * 4 + 64 * n
    assert peak < 0.6 * full_fp32


def test_bad_inputs_raise_one_line_value_errors():
    logits = torch.randn(2, 3, 10)
    ids = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"ids shape \(2, 4\) must equal logits.shape\[:-1\] \(2, 3\)"):
        token_logprobs(logits, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"ids must lie in \[0, V=10\).*max 10"):
        token_logprobs(logits, torch.full((2, 3), 10))
    with pytest.raises(ValueError, match=r"ids must lie in \[0, V=10\).*min -1"):
        token_logprobs(logits, torch.full((2, 3), -1))
    with pytest.raises(ValueError, match="ids must be an integer tensor"):
        token_logprobs(logits, ids.float())
    with pytest.raises(ValueError, match=r"topk_ids shape \(2, 2, 4\) must be logits.shape\[:-1\] \+ \(K,\)"):
        logprobs_entropy_topk(logits, ids, torch.zeros(2, 2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"topk_ids must lie in \[0, V=10\)"):
        logprobs_entropy_topk(logits, ids, torch.full((2, 3, 4), 12))
    with pytest.raises(ValueError, match=r"ids shape \(2, 3\) must be logits.shape\[:-1\] \+ \(K,\)"):
        gather_logprobs(logits, ids)
    with pytest.raises(ValueError, match="logits must be a floating-point tensor"):
        token_entropy(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature must be a finite number > 0; got 0"):
        token_logprobs(logits, ids, temperature=0)
    with pytest.raises(ValueError, match="chunk_rows must be None"):
        token_logprobs(logits, ids, chunk_rows=0)


def test_without_entropy_or_topk_and_empty_input():
    logits, ids, _ = random_case((2, 3), vocab=10)
    out = logprobs_entropy_topk(logits, ids, with_entropy=False)
    assert out.entropy is None and out.topk_logp is None
    empty = logprobs_entropy_topk(torch.randn(0, 5, 10), torch.zeros(0, 5, dtype=torch.long))
    assert empty.logp.shape == (0, 5) and empty.entropy.shape == (0, 5)
