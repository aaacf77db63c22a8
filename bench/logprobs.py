"""B1: chunked log-prob + entropy (harness.logprobs) against the naive full-vocab fp32 path.

Run: ``python -m bench.logprobs [--reps 20] [--warmup 1] [--threads 1]``

Cases: bf16 logits [N, V=151936] with random labels, N in {256, 1024} on CPU and, when CUDA is
available, N in {2048, 16384} on the GPU. Phases, each timed for ours and the naive baseline on the
same inputs in this process:

- ``fwd``: sampled-token log-prob and entropy, no graph.
  ours  = ``logprobs_entropy_topk(logits, ids)``
  naive = ``x = logits.float() / T``; ``log_softmax(x)`` -> gather; entropy ``-(softmax(x) * log_softmax(x)).sum(-1)``
- ``fwd+bwd``: log-prob only, then ``.sum().backward()`` into a bf16 leaf.

Ours runs with its default ``chunk_rows=None`` (a per-buffer byte budget: 3 rows on CPU, ~220 rows
on CUDA at this V).

Timing: ``--warmup`` untimed runs, then the median of ``--reps`` timed runs; ours and naive
alternate within each rep so load from other processes hits both alike. ``time.perf_counter`` on
CPU, CUDA events on GPU.

CPU allocator: glibc serves blocks above its mmap threshold with fresh mappings and unmaps them on
free, so every rep page-faults its large temporaries in again. In a VM that costs more than the
arithmetic (naive fwd at N=1024: ~3-4 s of system time per call vs ~0.9 s of user time), so by
default the script raises glibc's mmap and trim thresholds (``mallopt``) to keep freed memory in the
process, which is what the CUDA caching allocator does on a GPU. This helps naive more than ours
(it frees more). ``--no-reuse-freed-memory`` measures with glibc's defaults.

Peak extra memory (bytes allocated beyond the inputs, at the worst moment of the phase):
- CUDA: ``torch.cuda.max_memory_allocated()`` after ``reset_peak_memory_stats()``, minus what
  was allocated before the phase (the inputs).
- CPU: torch has no CPU allocator statistics, and tracemalloc does not see torch's allocator, so
  the phase runs once under ``torch.profiler.profile(profile_memory=True)``; every allocation and
  free the c10 CPU allocator reports (including temporaries inside an op) is replayed in time order
  and the running total's maximum is the peak. Only memory allocated inside the phase counts, so
  the inputs are excluded by construction. This reads the profiler's event tree through
  ``torch._C._profiler`` (what ``torch.profiler._memory_profiler`` uses).

In ``fwd+bwd`` both variants must produce the bf16 gradient of the logits (N*V*2 bytes); it is part
of both "extra" numbers and sets the floor for ours.

Targets (performance.md B1/B5): memory ratio naive/ours >= 8 (in fwd+bwd, beyond the gradient both return),
time ratio ours/naive <= 1.2 on CPU and <= 1.0 on CUDA. Timing and memory helpers live in bench.common.
Writes bench/results/logprobs.json (meta, rows, and the summary rows ``python -m bench.summary`` prints).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench.common import (
    RESULTS_DIR,
    base_meta,
    paired_medians,
    peak_extra_bytes,
    reuse_freed_memory,
    summary_row,
    write_results,
)
from bench.common import cpu_peak_extra_bytes as cpu_peak_extra_bytes  # re-exported: tests import it from here
from harness.logprobs import _rows_per_chunk, logprobs_entropy_topk, token_logprobs

VOCAB = 151936
CPU_ROWS = (256, 1024)
CUDA_ROWS = (2048, 16384)
TEMPERATURE = 1.0
RESULTS = RESULTS_DIR / "logprobs.json"


# --- the two implementations ------------------------------------------------------------------


def naive_fwd(logits: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = logits.float() / TEMPERATURE
    logp_all = torch.log_softmax(x, dim=-1)
    logp = logp_all.gather(-1, ids[:, None]).squeeze(-1)
    entropy = -(torch.softmax(x, dim=-1) * logp_all).sum(-1)
    return logp, entropy


def naive_logp(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    logp_all = torch.log_softmax(logits.float() / TEMPERATURE, dim=-1)
    return logp_all.gather(-1, ids[:, None]).squeeze(-1)


def ours_fwd(logits: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = logprobs_entropy_topk(logits, ids, temperature=TEMPERATURE)
    return out.logp, out.entropy


def ours_logp(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return token_logprobs(logits, ids, temperature=TEMPERATURE)


def fwd_phase(impl: Callable, logits: torch.Tensor, ids: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        with torch.no_grad():
            impl(logits, ids)

    return run


def fwd_bwd_phase(impl: Callable, leaf: torch.Tensor, ids: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        impl(leaf, ids).sum().backward()
        leaf.grad = None  # freed at the end, so a profiled run starts without last run's gradient

    return run


# --- cases -----------------------------------------------------------------------------------


def bench_case(n: int, device: torch.device, warmup: int, reps: int, seed: int) -> list[dict]:
    gen = torch.Generator(device=device).manual_seed(seed + n)
    logits = torch.randn(n, VOCAB, generator=gen, device=device).mul_(2.0).to(torch.bfloat16)
    ids = torch.randint(0, VOCAB, (n,), generator=gen, device=device)
    leaf = logits.detach().clone().requires_grad_(True)

    with torch.no_grad():
        ours_lp, ours_h = ours_fwd(logits, ids)
        naive_lp, naive_h = naive_fwd(logits, ids)
    max_dlogp = (ours_lp - naive_lp).abs().max().item()
    max_dentropy = (ours_h - naive_h).abs().max().item()
    del ours_lp, ours_h, naive_lp, naive_h

    phases = {
        "fwd": (fwd_phase(ours_fwd, logits, ids), fwd_phase(naive_fwd, logits, ids)),
        "fwd+bwd": (fwd_bwd_phase(ours_logp, leaf, ids), fwd_bwd_phase(naive_logp, leaf, ids)),
    }
    grad_mb = logits.numel() * logits.element_size() / 2**20
    rows = []
    for phase, (ours, naive) in phases.items():
        ours_ms, naive_ms = paired_medians(ours, naive, device, warmup, reps)
        ours_mb = peak_extra_bytes(ours, device) / 2**20
        naive_mb = peak_extra_bytes(naive, device) / 2**20
        rows.append(
            {
                "device": device.type,
                "N": n,
                "V": VOCAB,
                "phase": phase,
                "ours_ms": ours_ms,
                "naive_ms": naive_ms,
                "time_ratio": ours_ms / naive_ms,
                "ours_extra_mb": ours_mb,
                "naive_extra_mb": naive_mb,
                "mem_ratio": naive_mb / ours_mb,
                "ours_chunk_rows": _rows_per_chunk(None, logits),
                # fwd+bwd: the bf16 gradient both must return; what ours holds beyond it is the chunk buffer.
                "grad_mb": grad_mb if phase == "fwd+bwd" else 0.0,
                "max_abs_dlogp_vs_naive": max_dlogp,
                "max_abs_dentropy_vs_naive": max_dentropy,
            }
        )
        print(format_row(rows[-1]), flush=True)
    return rows


HEADER = (
    f"{'device':>6} {'N':>6} {'V':>7} {'phase':>8} {'ours ms':>9} {'naive ms':>9} {'t ours/naive':>12} "
    f"{'ours MB':>9} {'naive MB':>9} {'mem naive/ours':>14}"
)


def format_row(r: dict) -> str:
    return (
        f"{r['device']:>6} {r['N']:>6} {r['V']:>7} {r['phase']:>8} {r['ours_ms']:>9.1f} {r['naive_ms']:>9.1f} "
        f"{r['time_ratio']:>12.2f} {r['ours_extra_mb']:>9.1f} {r['naive_extra_mb']:>9.1f} {r['mem_ratio']:>14.1f}"
    )


def summarize(rows: list[dict]) -> list[dict]:
    """B1's targets per case: time ours/naive (<= 1.2 on CPU, B5's smoke bound; never slower on GPU) and the
    memory ratio naive/ours >= 8. In fwd+bwd the memory ratio is taken beyond the bf16 gradient both return."""
    out = []
    for r in rows:
        case = f"{r['phase']} {r['device']} N={r['N']}"
        time_target = "<= 1.2" if r["device"] == "cpu" else "<= 1.0"
        out.append(summary_row("B1", case, "time ratio ours/naive", r["time_ratio"], time_target))
        if r["grad_mb"]:
            mem = (r["naive_extra_mb"] - r["grad_mb"]) / max(r["ours_extra_mb"] - r["grad_mb"], 1e-9)
            out.append(summary_row("B1", case, "mem ratio naive/ours beyond grad", mem, ">= 8"))
        else:
            out.append(summary_row("B1", case, "mem ratio naive/ours", r["mem_ratio"], ">= 8"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20, help="timed repetitions per variant (median)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per variant first")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the box is shared)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--reuse-freed-memory",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="raise glibc's mmap/trim thresholds so reps do not re-fault their buffers (see docstring)",
    )
    args = parser.parse_args()
    if args.reps < 1 or args.warmup < 0 or args.threads < 1:
        raise ValueError("--reps and --threads must be >= 1 and --warmup >= 0")
    torch.set_num_threads(args.threads)
    reused = reuse_freed_memory() if args.reuse_freed_memory else False

    cases = [(torch.device("cpu"), n) for n in CPU_ROWS]
    if torch.cuda.is_available():
        cases += [(torch.device("cuda"), n) for n in CUDA_ROWS]
    print(HEADER, flush=True)
    rows = []
    t0 = time.perf_counter()
    for device, n in cases:
        rows += bench_case(n, device, args.warmup, args.reps, args.seed)

    print(
        "fwd+bwd extra includes the bf16 gradient of the logits (N*V*2 bytes), which both variants "
        "return; beyond it ours holds "
        + ", ".join(f"{r['ours_extra_mb'] - r['grad_mb']:.1f} MB (N={r['N']})" for r in rows if r["grad_mb"])
    )
    meta = {
        **base_meta(args.threads, args.reps, args.warmup, reused),
        "temperature": TEMPERATURE,
        "cpu_memory_method": "torch.profiler allocation events, running-total peak",
        "wall_s": time.perf_counter() - t0,
    }
    write_results("logprobs", meta, rows, summarize(rows), out=args.out)
    print(f"wrote {args.out} ({meta['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
