"""A sanity-style training pool: the problems a given model solves some of the time (DPPO section 5).

DPPO's sanity test trains on 1,460 MATH problems the starting model already solves sometimes, so a stable
objective drives training reward towards 1 and a collapse is unambiguous. Here the same filter is applied to the
arith train split: a pass-rate file, measured once per model with `python -m harness.loop.pass_rates`, holds each
problem's warm-start pass rate, and `data.pool_path` + `data.pool_min` / `data.pool_max` keep the problems whose
rate lies in [pool_min, pool_max]. The file is read where the training set is loaded, so the trainer needs no
change; it names the model it was measured on, and the pool never touches the held-out benchmark.

File layout (JSON): {"model": <model folder name>, "samples": n, "max_new_tokens": t, "temperature": T,
"pass_rate": {problem_id: correct / n}}.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from harness.tasks.arith import Problem


def load_pass_rates(path: str | Path) -> dict[str, float]:
    """problem id -> pass rate from a pass-rate file (module docstring)."""
    try:
        data = json.loads(Path(path).expanduser().read_text())
        rates = data["pass_rate"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"data.pool_path: {path!r} is not a readable pass-rate file ({exc})") from None
    return {str(k): float(v) for k, v in rates.items()}


def filter_pool(problems: Sequence[Problem], rates: dict[str, float], low: float, high: float) -> list[Problem]:
    """The problems whose measured pass rate lies in [low, high]; problems without a rate are dropped."""
    if not 0.0 <= low <= high <= 1.0:
        raise ValueError(f"data.pool_min/pool_max: need 0 <= pool_min <= pool_max <= 1, got {low}, {high}")
    kept = [p for p in problems if low <= rates.get(p.id, -1.0) <= high]
    if not kept:
        raise ValueError(f"data.pool_path: no training problem has a pass rate in [{low}, {high}]")
    return kept
