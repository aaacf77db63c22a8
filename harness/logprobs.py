"""Token log-probs, entropy and top-K gathers from logits without full-vocab fp32 copies.

All functions work on logits ``[..., V]`` of any float dtype (bf16 from the policy forward is the
usual case) and walk the flattened ``[N, V]`` rows in chunks. Each chunk is upcast into a reused
fp32 work buffer, so the extra memory is one or two ``rows x V`` fp32 buffers plus O(N) vectors,
never an fp32 copy of the whole tensor (the naive ``logits.float().log_softmax(-1)`` path holds
several; see performance.md B1 and anchors A2, A4, A6).

Per chunk, with ``z = x / T`` and ``m = max z``:

    s = sum exp(z - m),  lse = m + log s,  logp[y] = (z_y - m) - log s,
    H = lse - sum p z = log s - sum exp(z - m) (z - m) / s

so one exp over the chunk serves the log-prob, the entropy and the top-K gathers.

The gradient of ``log softmax(z)[y]`` w.r.t. ``x`` is ``(onehot(y) - p) / T``. The backward pass
recomputes ``p`` chunk by chunk from the saved logits and per-row ``lse`` (fp32, O(N)) and writes
straight into a gradient tensor of the logits' dtype.

``chunk_rows=None`` picks a size from a per-buffer byte budget: small on CPU, where a chunk that
stays in cache makes the several elementwise passes nearly free next to the exp, and large on GPUs,
where each pass is a kernel launch and bandwidth, not cache, is the limit.

Outputs are float32 (float64 when the logits are float64, which gradcheck needs).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = [
    "LogProbOutput",
    "gather_logprobs",
    "logprobs_entropy_topk",
    "token_entropy",
    "token_logprobs",
]

# fp32 bytes per work buffer when chunk_rows is None. CPU: 3 rows at V=151936, which keeps both
# buffers in L2/L3 (3-4 rows measured ~2x faster than 64-256 rows on a 2-core EPYC, AVX2). GPU:
# ~220 rows at V=151936, enough work per kernel that launch overhead is hidden.
_CPU_CHUNK_BYTES = 2 << 20
_GPU_CHUNK_BYTES = 128 << 20


@dataclass(frozen=True)
class LogProbOutput:
    """Result of :func:`logprobs_entropy_topk`.

    logp:      [...] log-prob of ``ids`` (differentiable w.r.t. the logits)
    entropy:   [...] entropy of softmax(logits / T), detached; None unless requested
    topk_logp: [..., K] log-probs at ``topk_ids``, detached; None unless requested
    """

    logp: Tensor
    entropy: Tensor | None
    topk_logp: Tensor | None


def token_logprobs(logits: Tensor, ids: Tensor, temperature: float = 1.0, chunk_rows: int | None = None) -> Tensor:
    """``log_softmax(logits / temperature)`` at ``ids``: logits [..., V], ids [...] -> float32 [...].

    Differentiable w.r.t. ``logits``; the backward pass needs no full-vocab fp32 buffer either.
    """
    return logprobs_entropy_topk(logits, ids, None, temperature, chunk_rows, with_entropy=False).logp


def token_entropy(logits: Tensor, temperature: float = 1.0, chunk_rows: int | None = None) -> Tensor:
    """Entropy of ``softmax(logits / temperature)``: logits [..., V] -> float32 [...], no grad (a metric)."""
    _check_logits(logits)
    temperature = _check_temperature(temperature)
    rows = _rows_per_chunk(chunk_rows, logits)
    with torch.no_grad():
        stats = _chunked_stats(logits, None, None, temperature, rows, with_entropy=True)
    return stats.entropy.reshape(logits.shape[:-1])


def gather_logprobs(logits: Tensor, ids: Tensor, temperature: float = 1.0, chunk_rows: int | None = None) -> Tensor:
    """Log-probs at several ids per position: logits [..., V], ids [..., K] -> float32 [..., K], no grad.

    For the DPPO Top-K divergence, which only builds a detached mask.
    """
    _check_logits(logits)
    topk2d = _check_topk_ids(ids, logits, "ids")
    temperature = _check_temperature(temperature)
    rows = _rows_per_chunk(chunk_rows, logits)
    with torch.no_grad():
        stats = _chunked_stats(logits, None, topk2d, temperature, rows, with_entropy=False)
    return stats.topk.reshape(ids.shape)


def logprobs_entropy_topk(
    logits: Tensor,
    ids: Tensor,
    topk_ids: Tensor | None = None,
    temperature: float = 1.0,
    chunk_rows: int | None = None,
    with_entropy: bool = True,
) -> LogProbOutput:
    """One pass over the logits for the sampled-token log-prob, the entropy and top-K log-probs.

    logits [..., V]; ids [...] (the sampled tokens); topk_ids [..., K] or None.
    Only ``logp`` carries a gradient; entropy and top-K values are detached metrics/mask inputs.
    chunk_rows: rows per chunk (the fp32 work buffers hold that many rows); None picks a size for
    the device (module docstring). A slice such as ``logits[:, p:-1]`` is read in place, not copied.
    """
    _check_logits(logits)
    ids1d = _check_ids(ids, logits)
    topk2d = None if topk_ids is None else _check_topk_ids(topk_ids, logits, "topk_ids")
    temperature = _check_temperature(temperature)
    rows = _rows_per_chunk(chunk_rows, logits)
    logp, entropy, topk = _LogProbFunction.apply(logits, ids1d, topk2d, temperature, rows, with_entropy)
    lead = logits.shape[:-1]
    return LogProbOutput(
        logp=logp.reshape(lead),
        entropy=entropy.reshape(lead) if with_entropy else None,
        topk_logp=topk.reshape(topk_ids.shape) if topk_ids is not None else None,
    )


# ---------------------------------------------------------------------------------------------
# chunked kernels


@dataclass(frozen=True)
class _Stats:
    logp: Tensor | None  # [N]
    lse: Tensor  # [N], logsumexp of logits / T
    entropy: Tensor | None  # [N]
    topk: Tensor | None  # [N, K]


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _row_blocks(logits: Tensor) -> list[Tensor]:
    """2-D views [rows, V] that cover the flattened rows of ``logits`` in order, without copying.

    One block when the leading dims flatten to a view; otherwise (e.g. ``logits[:, p:-1]`` of a
    batch) one block per leading index, so a slice of the model output is never copied whole.
    """
    v = logits.shape[-1]
    if logits.dim() <= 2:
        return [logits.reshape(-1, v)]  # a view for any strides at this rank
    try:
        return [logits.view(-1, v)]
    except RuntimeError:
        return [block for sub in logits.unbind(0) for block in _row_blocks(sub)]


def _chunks(blocks: list[Tensor], rows: int) -> Iterator[tuple[int, Tensor]]:
    """(first flattened row, chunk view) for every chunk of at most ``rows`` rows."""
    offset = 0
    for block in blocks:
        for r0 in range(0, block.shape[0], rows):
            yield offset + r0, block[r0 : r0 + rows]
        offset += block.shape[0]


def _chunked_stats(
    logits: Tensor,
    ids1d: Tensor | None,
    topk2d: Tensor | None,
    temperature: float,
    rows: int,
    with_entropy: bool,
) -> _Stats:
    v = logits.shape[-1]
    n = logits.numel() // v
    dtype = _compute_dtype(logits.dtype)
    new = {"dtype": dtype, "device": logits.device}
    lse = torch.empty(n, **new)
    logp = torch.empty(n, **new) if ids1d is not None else None
    entropy = torch.empty(n, **new) if with_entropy else None
    topk = torch.empty(n, topk2d.shape[1], **new) if topk2d is not None else None
    # Two reused work buffers: z - m, and exp(z - m) (the second only when entropy needs both).
    shifted_buf = torch.empty(min(rows, n), v, **new)
    exp_buf = torch.empty_like(shifted_buf) if with_entropy else None
    inv_t = 1.0 / temperature

    for r0, chunk in _chunks(_row_blocks(logits), rows):
        r1 = r0 + chunk.shape[0]
        z = shifted_buf[: r1 - r0]
        z.copy_(chunk)
        m = z.amax(dim=1, keepdim=True)
        z.sub_(m)
        if temperature != 1.0:
            z.mul_(inv_t)
        # Gathers come before the exp below may overwrite z.
        if logp is not None:
            target = z.gather(1, ids1d[r0:r1, None]).squeeze(1)
        if topk is not None:
            top = z.gather(1, topk2d[r0:r1])
        if exp_buf is not None:
            e = torch.exp(z, out=exp_buf[: r1 - r0])
            s = e.sum(dim=1)
            # nansum: exp(-inf) * -inf = nan must count as 0 (masked vocab entries); a NaN logit
            # still poisons s, hence log s and the entropy.
            weighted = torch.nansum(e.mul_(z), dim=1)
            log_s = s.log()
            torch.sub(log_s, weighted / s, out=entropy[r0:r1])
        else:
            log_s = z.exp_().sum(dim=1).log_()
        torch.add(m.squeeze(1) * inv_t, log_s, out=lse[r0:r1])
        if logp is not None:
            torch.sub(target, log_s, out=logp[r0:r1])
        if topk is not None:
            torch.sub(top, log_s[:, None], out=topk[r0:r1])
    return _Stats(logp=logp, lse=lse, entropy=entropy, topk=topk)


def _chunked_grad(
    logits: Tensor, ids1d: Tensor, lse: Tensor, grad_logp: Tensor, temperature: float, rows: int
) -> Tensor:
    """d(sum g * logp)/dx = g / T * (onehot(ids) - softmax(x / T)), chunk by chunk."""
    v = logits.shape[-1]
    n = logits.numel() // v
    grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    grad2d = grad.view(n, v)
    buf = torch.empty(min(rows, n), v, dtype=lse.dtype, device=logits.device)
    g_over_t = grad_logp.to(lse.dtype).reshape(n) / temperature
    inv_t = 1.0 / temperature
    for r0, chunk in _chunks(_row_blocks(logits), rows):
        r1 = r0 + chunk.shape[0]
        p = buf[: r1 - r0]
        p.copy_(chunk)
        if temperature != 1.0:
            p.mul_(inv_t)
        p.sub_(lse[r0:r1, None]).exp_()
        g = g_over_t[r0:r1, None]
        p.mul_(g.neg())
        p.scatter_add_(1, ids1d[r0:r1, None], g)
        grad2d[r0:r1].copy_(p)
    return grad


class _LogProbFunction(torch.autograd.Function):
    """Saves the logits (alive anyway) and the per-row lse; recomputes softmax in backward."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        logits: Tensor,
        ids1d: Tensor,
        topk2d: Tensor | None,
        temperature: float,
        rows: int,
        with_entropy: bool,
    ) -> tuple[Tensor, Tensor, Tensor]:
        stats = _chunked_stats(logits, ids1d, topk2d, temperature, rows, with_entropy)
        ctx.save_for_backward(logits, ids1d, stats.lse)
        ctx.temperature = temperature
        ctx.rows = rows
        # autograd needs tensors, not None, for every output; empty ones stand in for skipped parts.
        empty = stats.lse.new_empty(0)
        entropy = stats.entropy if stats.entropy is not None else empty
        topk = stats.topk if stats.topk is not None else empty
        ctx.mark_non_differentiable(entropy, topk)
        return stats.logp, entropy, topk

    @staticmethod
    @once_differentiable
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_logp: Tensor | None, *_unused: Tensor | None
    ) -> tuple[Tensor | None, None, None, None, None, None]:
        if grad_logp is None or not ctx.needs_input_grad[0]:
            return None, None, None, None, None, None
        logits, ids1d, lse = ctx.saved_tensors
        grad = _chunked_grad(logits, ids1d, lse, grad_logp, ctx.temperature, ctx.rows)
        return grad, None, None, None, None, None


# ---------------------------------------------------------------------------------------------
# input checks: one-line ValueErrors naming the tensor, its shape and what is allowed


def _check_logits(logits: Tensor) -> None:
    if not isinstance(logits, Tensor) or not logits.is_floating_point() or logits.dim() < 1:
        desc = f"{logits.dtype} {tuple(logits.shape)}" if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(f"logits must be a floating-point tensor [..., V]; got {desc}")
    if logits.shape[-1] == 0:
        raise ValueError(f"logits must have a non-empty vocab dim; got shape {tuple(logits.shape)}")


def _check_index_tensor(idx: Tensor, name: str, logits: Tensor) -> None:
    if not isinstance(idx, Tensor) or idx.is_floating_point() or idx.is_complex() or idx.dtype == torch.bool:
        desc = idx.dtype if isinstance(idx, Tensor) else type(idx).__name__
        raise ValueError(f"{name} must be an integer tensor; got {desc}")
    if idx.device != logits.device:
        raise ValueError(f"{name} is on {idx.device} but logits are on {logits.device}; put both on one device")
    if idx.numel() == 0:
        return
    v = logits.shape[-1]
    lo, hi = torch.stack([idx.min(), idx.max()]).tolist()  # one device sync for both bounds
    if lo < 0 or hi >= v:
        raise ValueError(f"{name} must lie in [0, V={v}) for logits {tuple(logits.shape)}; got min {lo}, max {hi}")


def _check_ids(ids: Tensor, logits: Tensor) -> Tensor:
    _check_index_tensor(ids, "ids", logits)
    if ids.shape != logits.shape[:-1]:
        raise ValueError(
            f"ids shape {tuple(ids.shape)} must equal logits.shape[:-1] {tuple(logits.shape[:-1])} "
            f"(logits {tuple(logits.shape)})"
        )
    return ids.reshape(-1).long()


def _check_topk_ids(topk_ids: Tensor, logits: Tensor, name: str) -> Tensor:
    _check_index_tensor(topk_ids, name, logits)
    if topk_ids.dim() != logits.dim() or topk_ids.shape[:-1] != logits.shape[:-1]:
        raise ValueError(
            f"{name} shape {tuple(topk_ids.shape)} must be logits.shape[:-1] + (K,) = "
            f"{tuple(logits.shape[:-1])} + (K,) (logits {tuple(logits.shape)})"
        )
    return topk_ids.reshape(-1, topk_ids.shape[-1]).long()


def _check_temperature(temperature: float) -> float:
    t = float(temperature)
    if not (math.isfinite(t) and t > 0):
        raise ValueError(f"temperature must be a finite number > 0; got {temperature}")
    return t


def _rows_per_chunk(chunk_rows: int | None, logits: Tensor) -> int:
    v = logits.shape[-1]
    n = logits.numel() // v
    if chunk_rows is None:
        budget = _CPU_CHUNK_BYTES if logits.device.type == "cpu" else _GPU_CHUNK_BYTES
        chunk_rows = budget // (v * torch.finfo(_compute_dtype(logits.dtype)).bits // 8)
        chunk_rows = max(1, chunk_rows)
    elif isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
        raise ValueError(f"chunk_rows must be None (auto) or an int >= 1; got {chunk_rows!r}")
    return max(1, min(chunk_rows, n))
