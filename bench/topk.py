"""B2: the cost of DPPO's Top-K divergence in the trainer's loss path, against GRPO on the same logits.

Run: ``python -m bench.topk [--reps 20] [--warmup 1] [--threads 1] [--rows 256 1024]``

What is timed is the loss path exactly as harness/loop/step.py runs it for one mini-batch, from logits onwards:
``logprobs_entropy_topk`` over bf16 logits [B, T, V=151936] (with the rollout's top-K ids when the objective
needs Top-K, so the same chunked pass also gathers K log-probs per token), then the objective, then
``aggregate`` (seq-mean-token-sum-norm, horizon T), ``float()`` of every metric and of the loss (the trainer's
host syncs), then ``backward`` into the logits leaf. The model is left out on purpose: it costs the same for
every objective, and without it the ratio shows the Top-K overhead undiluted.

Cases: GRPO (the baseline), DPPO Binary-TV (``dppo``), and DPPO Top-K TV and KL at K = 8, 20, 64, all on one
set of logits. CPU: N = B*T = 256 rows by default (N = 1024 takes ~4x as long, which does not fit ``make
bench``'s 10 minutes next to B1; pass ``--rows 256 1024`` to run it). CUDA, when present: N in {2048, 16384}.

Rollout data are synthesised the way an engine would produce them: the behaviour policy mu is a perturbed copy
of the logits (fp32 noise of std 0.3), the sampled token is drawn from mu, the behaviour top-K is mu's top-K
with the sampled token forced in (SRL's convention, harness.rollout.base.force_sampled_into_topk). The logits
are N(0, 2^2) with a few boosted tokens per row, so mu's top-K holds most of the mass as in a real LM.

Timing and memory: bench.common (interleaved medians after warm-up; peak extra bytes from the CPU allocator's
profiler events or CUDA's peak counter). Every variant's peak includes the bf16 gradient of the logits
(N*V*2 bytes) and the chunk buffers; the Top-K overhead is its peak minus GRPO's.

Targets (issue B2, performance.md B2): extra peak vs GRPO <= 2% of N*V*4 bytes; time <= 1.10x GRPO.
Also reported, not targeted by the issue: extra peak as % of GRPO's own peak (performance.md: <= 5%) and the
rollout's stored bytes per token for the top-K entries (int64 ids + fp32 log-probs, as harness.batch keeps them).
Writes bench/results/topk.json.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from bench.common import (
    base_meta,
    interleaved_medians,
    peak_extra_bytes,
    reuse_freed_memory,
    summary_row,
    write_results,
)
from harness.logprobs import logprobs_entropy_topk
from harness.objectives import Objective, aggregate, get_objective
from harness.rollout.base import force_sampled_into_topk

VOCAB = 151936
TOKENS_PER_ROW = 64  # T: N rows of logits are B = N / T sequences of T response tokens
CPU_ROWS = (256,)
CUDA_ROWS = (2048, 16384)
TOPK = (8, 20, 64)
AGG = "seq-mean-token-sum-norm"
MU_NOISE = 0.3
SETUP_CHUNK = 1024  # rows per chunk while synthesising, so no fp32 [N, V] copy exists at N = 16384


@dataclass(frozen=True)
class Inputs:
    leaf: Tensor  # [B, T, V] bf16 logits, requires grad
    ids: Tensor  # [B, T] sampled tokens
    mask: Tensor  # [B, T] float
    advantages: Tensor  # [B, T]
    behavior_logp: Tensor  # [B, T] float32
    topk_ids: dict[int, Tensor]  # K -> [B, T, K] int64, sampled token forced in
    topk_behavior_logp: dict[int, Tensor]  # K -> [B, T, K] float32


def synthesise(n: int, device: torch.device, seed: int) -> Inputs:
    gen = torch.Generator(device=device).manual_seed(seed + n)
    b, t = n // TOKENS_PER_ROW, TOKENS_PER_ROW
    logits = torch.empty(n, VOCAB, dtype=torch.bfloat16, device=device)
    ids = torch.empty(n, dtype=torch.long, device=device)
    behavior = torch.empty(n, device=device)
    kmax = max(TOPK)
    top_ids = torch.empty(n, kmax, dtype=torch.long, device=device)
    top_logp = torch.empty(n, kmax, device=device)
    for r0 in range(0, n, SETUP_CHUNK):
        r1 = min(r0 + SETUP_CHUNK, n)
        x = torch.randn(r1 - r0, VOCAB, generator=gen, device=device).mul_(2.0)
        # A few likely tokens per row, as in an LM's next-token distribution.
        boost = torch.randint(0, VOCAB, (r1 - r0, 8), generator=gen, device=device)
        x.scatter_add_(1, boost, torch.empty(r1 - r0, 8, device=device).uniform_(4.0, 10.0, generator=gen))
        logits[r0:r1] = x.to(torch.bfloat16)
        mu = torch.log_softmax(x.add_(torch.randn(x.shape, generator=gen, device=device), alpha=MU_NOISE), dim=-1)
        ids[r0:r1] = torch.multinomial(mu.exp(), 1, generator=gen).squeeze(1)
        behavior[r0:r1] = mu.gather(1, ids[r0:r1, None]).squeeze(1)
        top = mu.topk(kmax, dim=-1)
        top_ids[r0:r1], top_logp[r0:r1] = top.indices, top.values
        del x, mu, top
    topk_ids, topk_behavior = {}, {}
    for k in TOPK:
        tid, tlp = force_sampled_into_topk(top_ids[:, :k], top_logp[:, :k], ids, behavior)
        topk_ids[k], topk_behavior[k] = tid.view(b, t, k), tlp.view(b, t, k)
    lengths = torch.randint(t // 2, t + 1, (b,), generator=gen, device=device)
    mask = (torch.arange(t, device=device)[None, :] < lengths[:, None]).float()
    signs = torch.randint(0, 2, (b,), generator=gen, device=device).float().mul_(2).sub_(1)
    return Inputs(
        leaf=logits.view(b, t, VOCAB).detach().requires_grad_(True),
        ids=ids.view(b, t),
        mask=mask,
        advantages=signs[:, None] * mask,
        behavior_logp=behavior.view(b, t) * mask,
        topk_ids=topk_ids,
        topk_behavior_logp=topk_behavior,
    )


def loss_path(obj: Objective, x: Inputs) -> Callable[[], None]:
    """The trainer's mini-batch update from logits to the gradient (no model, no optimizer step)."""
    k = obj.topk
    topk_ids = x.topk_ids[k] if k > 1 else None
    topk_behavior = x.topk_behavior_logp[k] if k > 1 else None
    horizon = float(x.mask.shape[1])

    def run() -> None:
        lp = logprobs_entropy_topk(x.leaf, x.ids, topk_ids, temperature=1.0)
        out = obj(
            logp=lp.logp,
            behavior_logp=x.behavior_logp,
            advantages=x.advantages,
            mask=x.mask,
            old_logp=None,
            topk_logp=lp.topk_logp,
            topk_behavior_logp=topk_behavior,
        )
        loss = aggregate(out.loss_mat, x.mask, AGG, horizon)
        loss.backward()
        # The trainer reads every metric and the loss on the host after the backward.
        {key: float(v) for key, v in out.metrics.items()}
        float(loss.detach())
        x.leaf.grad = None  # freed, so each run (and the profiled one) starts without the last gradient

    return run


def variants() -> dict[str, Objective]:
    out = {"grpo": get_objective("grpo"), "dppo (binary tv)": get_objective("dppo")}
    for name in ("dppo_topk_tv", "dppo_topk_kl"):
        for k in TOPK:
            out[f"{name} K={k}"] = get_objective(name, topk=k)
    return out


def bench_case(n: int, device: torch.device, warmup: int, reps: int, seed: int) -> list[dict]:
    x = synthesise(n, device, seed)
    objs = variants()
    runs = {name: loss_path(obj, x) for name, obj in objs.items()}
    medians = interleaved_medians(runs, device, warmup, reps)
    peaks = {name: peak_extra_bytes(run, device) for name, run in runs.items()}
    nv4 = n * VOCAB * 4
    rows = []
    for name, obj in objs.items():
        extra = peaks[name] - peaks["grpo"]
        rows.append(
            {
                "device": device.type,
                "N": n,
                "V": VOCAB,
                "case": name,
                "objective": obj.name,
                "K": obj.topk,
                "ms": medians[name],
                "grpo_ms": medians["grpo"],
                "time_ratio": medians[name] / medians["grpo"],
                "peak_extra_mb": peaks[name] / 2**20,
                "extra_vs_grpo_mb": extra / 2**20,
                "extra_pct_nv4": 100.0 * extra / nv4,
                "extra_pct_grpo_peak": 100.0 * extra / peaks["grpo"],
                # What the rollout stores per token for the top-K entries (int64 id + fp32 log-prob).
                "topk_bytes_per_token": obj.topk * 12 if obj.topk > 1 else 0,
            }
        )
        print(format_row(rows[-1]), flush=True)
    return rows


HEADER = (
    f"{'device':>6} {'N':>6} {'case':<18} {'ms':>8} {'grpo ms':>8} {'t/grpo':>7} {'peak MB':>8} "
    f"{'+MB':>7} {'+% NV4':>7} {'+% grpo':>8}"
)


def format_row(r: dict) -> str:
    return (
        f"{r['device']:>6} {r['N']:>6} {r['case']:<18} {r['ms']:>8.1f} {r['grpo_ms']:>8.1f} {r['time_ratio']:>7.3f} "
        f"{r['peak_extra_mb']:>8.1f} {r['extra_vs_grpo_mb']:>7.2f} {r['extra_pct_nv4']:>7.3f} "
        f"{r['extra_pct_grpo_peak']:>8.2f}"
    )


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        if r["K"] <= 1:  # the targets are about Top-K; GRPO and Binary-TV are context rows
            continue
        case = f"{r['case']} {r['device']} N={r['N']}"
        out.append(summary_row("B2", case, "time ratio vs grpo", r["time_ratio"], "<= 1.10"))
        out.append(summary_row("B2", case, "extra peak % of N*V*4", r["extra_pct_nv4"], "<= 2"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20, help="timed repetitions per variant (median)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per variant first")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the box is shared)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rows", type=int, nargs="+", default=list(CPU_ROWS), help="CPU N values (multiples of 64)")
    parser.add_argument(
        "--reuse-freed-memory",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="raise glibc's mmap/trim thresholds so reps do not re-fault their buffers (bench.common)",
    )
    args = parser.parse_args()
    if args.reps < 1 or args.warmup < 0 or args.threads < 1 or any(n < 1 or n % TOKENS_PER_ROW for n in args.rows):
        raise ValueError(f"--reps and --threads must be >= 1, --warmup >= 0, --rows multiples of {TOKENS_PER_ROW}")
    torch.set_num_threads(args.threads)
    reused = reuse_freed_memory() if args.reuse_freed_memory else False

    cases = [(torch.device("cpu"), n) for n in args.rows]
    if torch.cuda.is_available():
        cases += [(torch.device("cuda"), n) for n in CUDA_ROWS]
    print(HEADER, flush=True)
    rows = []
    t0 = time.perf_counter()
    for device, n in cases:
        rows += bench_case(n, device, args.warmup, args.reps, args.seed)
    meta = {
        **base_meta(args.threads, args.reps, args.warmup, reused),
        "tokens_per_row": TOKENS_PER_ROW,
        "agg": AGG,
        "mu_noise": MU_NOISE,
        "cpu_memory_method": "torch.profiler allocation events, running-total peak",
        "wall_s": time.perf_counter() - t0,
    }
    path = write_results("topk", meta, rows, summarize(rows))
    print(f"wrote {path} ({meta['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
