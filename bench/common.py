"""What every benchmark script shares: timing, peak-memory measurement, the allocator setting, results files.

Timing: warm-up runs, then the median of the timed reps; all variants of a case run inside each rep, in an
order that rotates from rep to rep, so load from other processes on a shared machine hits every variant alike
and none always runs on a cache or allocator state left by the same neighbour. ``time.perf_counter`` on CPU,
CUDA events on GPU. On CPU the process's CPU time (``time.process_time``) is recorded beside the wall time:
on a shared box the wall time also counts the time other jobs held the cores, which spreads the medians of
short runs by more than the effects some benchmarks look for; the CPU time does not.

Peak extra memory (bytes allocated beyond what existed before the run, at the worst moment):
- CUDA: ``torch.cuda.max_memory_allocated()`` after ``reset_peak_memory_stats()``, minus what was allocated
  before the run (the inputs).
- CPU: torch has no CPU allocator statistics and tracemalloc does not see torch's allocator, so the run goes
  once under ``torch.profiler.profile(profile_memory=True)``; every allocation and free the c10 CPU allocator
  reports (temporaries inside an op included) is replayed in time order and the running total's maximum is the
  peak. Only memory allocated inside the run counts, so the inputs are excluded by construction. This reads
  the profiler's event tree through ``torch._C._profiler`` (what ``torch.profiler._memory_profiler`` uses).

Results: one JSON per script in bench/results/ (git-ignored) with ``meta``, ``rows`` and ``summary``; the
summary rows (``summary_row``) are what ``python -m bench.summary`` tabulates across scripts.
"""

from __future__ import annotations

import ctypes
import json
import math
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch._C._profiler import _EventType

RESULTS_DIR = Path(__file__).resolve().parent / "results"


# --- allocator ---------------------------------------------------------------------------------


def reuse_freed_memory() -> bool:
    """Keep freed blocks in this process (glibc); returns False where that is not possible.

    glibc serves blocks above its mmap threshold with fresh mappings and unmaps them on free, so every rep
    would page-fault its large temporaries in again; in a VM that can cost more than the arithmetic. Keeping
    freed memory is what the CUDA caching allocator does on a GPU.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
    return bool(libc.mallopt(m_mmap_threshold, 1 << 30) and libc.mallopt(m_trim_threshold, -1))  # -1: never trim


# --- timing ------------------------------------------------------------------------------------


def time_ms(run: Callable[[], None], device: torch.device) -> float:
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)
    t0 = time.perf_counter()
    run()
    return (time.perf_counter() - t0) * 1e3


def paired_medians(
    ours: Callable[[], None], naive: Callable[[], None], device: torch.device, warmup: int, reps: int
) -> tuple[float, float]:
    """Median ms of two variants; they alternate who goes first from rep to rep."""
    medians = interleaved_medians({"ours": ours, "naive": naive}, device, warmup, reps)
    return medians["ours"], medians["naive"]


def interleaved_samples(
    runs: Mapping[str, Callable[[], None]], device: torch.device, warmup: int, reps: int
) -> dict[str, list[tuple[float, float]]]:
    """(wall ms, process CPU ms) of every rep of every variant in ``runs``; each rep runs all of them, starting
    one further along each time. The CPU clock (``time.process_time``, all threads) is NaN on CUDA."""
    names = list(runs)
    for _ in range(warmup):
        for name in names:
            runs[name]()
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for rep in range(reps):
        # Rotate the order so no variant always runs first (cold) or right after the same neighbour.
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            c0 = time.process_time()
            wall = time_ms(runs[name], device)
            cpu = (time.process_time() - c0) * 1e3 if device.type == "cpu" else math.nan
            samples[name].append((wall, cpu))
    return samples


def interleaved_medians(
    runs: Mapping[str, Callable[[], None]], device: torch.device, warmup: int, reps: int, clock: str = "wall"
) -> dict[str, float]:
    """Median ms per variant (``interleaved_samples``) on the ``"wall"`` or the process ``"cpu"`` clock."""
    if clock not in ("wall", "cpu"):
        raise ValueError(f"clock must be 'wall' or 'cpu'; got {clock!r}")
    col = 0 if clock == "wall" else 1
    samples = interleaved_samples(runs, device, warmup, reps)
    return {name: statistics.median(s[col] for s in ts) for name, ts in samples.items()}


# --- memory ------------------------------------------------------------------------------------


def cpu_peak_extra_bytes(run: Callable[[], None]) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    allocations = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        if event.typed[0] == _EventType.Allocation and event.typed[1].device.type == "cpu":
            allocations.append((event.start_time_ns, event.typed[1].alloc_size))
        stack.extend(event.children)
    if not allocations:
        raise RuntimeError("the profiler reported no CPU allocations; cannot measure CPU memory")
    allocations.sort()
    running = peak = 0
    for _, size in allocations:
        running += size
        peak = max(peak, running)
    return peak


def cuda_peak_extra_bytes(run: Callable[[], None], device: torch.device) -> int:
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    run()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


def peak_extra_bytes(run: Callable[[], None], device: torch.device) -> int:
    run()  # settle lazily allocated state (autograd buffers, cuBLAS/allocator init) before measuring
    if device.type == "cuda":
        return cuda_peak_extra_bytes(run, device)
    return cpu_peak_extra_bytes(run)


# --- results -----------------------------------------------------------------------------------


def base_meta(threads: int, reps: int, warmup: int, reused: bool) -> dict[str, Any]:
    """The environment fields every results file records."""
    return {
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "threads": threads,
        "reps": reps,
        "warmup": warmup,
        "glibc_reuse_freed_memory": reused,
    }


def target_met(value: float, target: str) -> bool:
    """``target`` is ``"<= x"`` or ``">= x"``."""
    op, bound = target.split()
    if op == "<=":
        return value <= float(bound)
    if op == ">=":
        return value >= float(bound)
    raise ValueError(f"target must be '<= x' or '>= x'; got {target!r}")


def summary_row(bench_id: str, case: str, metric: str, value: float, target: str) -> dict[str, Any]:
    """One row of the cross-script summary: ``{"id", "case", "metric", "value", "target", "met"}``."""
    return {
        "id": bench_id,
        "case": case,
        "metric": metric,
        "value": round(float(value), 4),
        "target": target,
        "met": target_met(value, target),
    }


def write_results(
    name: str,
    meta: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    summary: Sequence[Mapping[str, Any]],
    out: Path | None = None,
) -> Path:
    """Write ``{"meta", "rows", "summary"}`` to ``out`` (default bench/results/<name>.json); returns the path."""
    path = out if out is not None else RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"meta": dict(meta), "rows": [dict(r) for r in rows], "summary": [dict(s) for s in summary]}
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def format_summary(summary: Sequence[Mapping[str, Any]]) -> str:
    """The summary rows as a fixed-width table (also used by bench.summary)."""
    width = max([len(str(s["case"])) for s in summary] + [4])
    mwidth = max([len(str(s["metric"])) for s in summary] + [6])
    lines = [f"{'id':<4} {'case':<{width}} {'metric':<{mwidth}} {'value':>10} {'target':>9} {'met':>4}"]
    for s in summary:
        lines.append(
            f"{s['id']:<4} {s['case']:<{width}} {s['metric']:<{mwidth}} {s['value']:>10.4g} {s['target']:>9} "
            f"{'yes' if s['met'] else 'NO':>4}"
        )
    return "\n".join(lines)
