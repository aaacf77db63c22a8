"""Divergences between the behavior policy mu and the current policy pi (objectives.md §2.3, §3).

Binary divergences compare the Bernoulli {sampled token, everything else}; Top-K ones compare K buckets of mu's
top-K tokens plus one tail bucket (the sampled token sits inside the K set, SRL convention). Both are lower
bounds of the full-vocabulary divergence (P-DPPO §4.4). Per-token quantities are computed in float64: they are
O(B*T*K) and `1 - p` near p = 1 cancels badly in fp32 (P6); Binary-TV is the exception (see there).
The exact full-vocabulary versions, from logits, are for diagnostics and tests.
"""

from __future__ import annotations

import torch
from torch import Tensor

MASS_FLOOR = 1e-12  # the floor SRL's compute_topk_kl puts under every bucket mass


def _log1m_exp(log_p: Tensor) -> Tensor:
    """log(1 - p) from log p, accurate near p = 1 (where 1 - exp(log p) would cancel)."""
    return torch.log((-torch.expm1(log_p)).clamp(min=MASS_FLOOR))


def binary_tv(logp: Tensor, mu_logp: Tensor) -> Tensor:
    """|pi - mu| of the sampled token (P-DPPO Eq. 13), in the inputs' precision.

    Not upcast: the official code compares fp32 probabilities with delta, and a token exactly at the boundary
    (kept, strict >) must stay kept; an upcast would move it by the rounding of log p.
    """
    return (logp.exp() - mu_logp.exp()).abs()


def binary_kl(logp: Tensor, mu_logp: Tensor) -> Tensor:
    """KL(mu || pi) of the Bernoulli {sampled, rest} (P-DPPO Eq. 14)."""
    lp, lq = logp.double(), mu_logp.double()
    q = lq.exp()
    return q * (lq - lp) + (1 - q) * (_log1m_exp(lq) - _log1m_exp(lp))


def _with_tail(topk_logp: Tensor) -> tuple[Tensor, Tensor]:
    p = topk_logp.double().exp()
    rest = (1 - p.sum(-1)).clamp(min=MASS_FLOOR)
    return p.clamp(min=MASS_FLOOR), rest


def topk_tv(topk_logp: Tensor, topk_mu_logp: Tensor) -> Tensor:
    """0.5 * (sum_k |pi_k - mu_k| + |rest_pi - rest_mu|) over mu's top-K ids (P-DPPO Eq. 15). [..., K] -> [...]."""
    p, rest_p = _with_tail(topk_logp)
    q, rest_q = _with_tail(topk_mu_logp)
    return 0.5 * ((p - q).abs().sum(-1) + (rest_p - rest_q).abs())


def topk_kl(topk_logp: Tensor, topk_mu_logp: Tensor) -> Tensor:
    """KL(mu || pi) on K + 1 buckets (P-DPPO Eq. 16). [..., K] -> [...]."""
    p, rest_p = _with_tail(topk_logp)
    q, rest_q = _with_tail(topk_mu_logp)
    return (q * (q.log() - p.log())).sum(-1) + rest_q * (rest_q.log() - rest_p.log())


def full_tv(logits_pi: Tensor, logits_mu: Tensor, chunk_rows: int = 1024) -> Tensor:
    """Exact 0.5 * sum_v |pi_v - mu_v| from logits [..., V], in row chunks so no whole fp32 [N, V] copy exists."""
    return _rowwise(logits_pi, logits_mu, chunk_rows, lambda lp, lq: 0.5 * (lp.exp() - lq.exp()).abs().sum(-1))


def full_kl(logits_pi: Tensor, logits_mu: Tensor, chunk_rows: int = 1024) -> Tensor:
    """Exact KL(mu || pi) = sum_v mu_v (log mu_v - log pi_v) from logits [..., V]."""
    return _rowwise(logits_pi, logits_mu, chunk_rows, lambda lp, lq: (lq.exp() * (lq - lp)).sum(-1))


@torch.no_grad()
def _rowwise(logits_pi: Tensor, logits_mu: Tensor, chunk_rows: int, fn) -> Tensor:
    if logits_pi.shape != logits_mu.shape:
        raise ValueError(f"logits_pi {tuple(logits_pi.shape)} and logits_mu {tuple(logits_mu.shape)} must match")
    lead, v = logits_pi.shape[:-1], logits_pi.shape[-1]
    a, b = logits_pi.reshape(-1, v), logits_mu.reshape(-1, v)
    out = torch.empty(a.shape[0], dtype=torch.float64, device=a.device)
    for i in range(0, a.shape[0], chunk_rows):
        lp = torch.log_softmax(a[i : i + chunk_rows].double(), -1)
        lq = torch.log_softmax(b[i : i + chunk_rows].double(), -1)
        out[i : i + chunk_rows] = fn(lp, lq)
    return out.reshape(lead)
