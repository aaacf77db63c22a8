"""Training sets and benchmarks as lists of problems, and prompts as token ids."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from itertools import chain, zip_longest
from typing import Any

from harness.tasks.arith import ArithConfig, Problem, make_splits
from harness.tasks.loaders import load_benchmark_file, load_dapo_math, load_math
from harness.tasks.pool import filter_pool, load_pass_rates
from harness.tasks.rlhf import load_hh_rlhf, load_ultrafeedback
from harness.tasks.templates import render, render_turns

logger = logging.getLogger(__name__)

TRAINING_SETS = ("arith", "dapo_math", "math_lvl3to5", "ultrafeedback", "hh_rlhf")
# Prompt sets without answers, for a reward model to score (harness/tasks/rlhf.py): training sets and benchmarks.
RLHF_SETS = {"ultrafeedback": load_ultrafeedback, "hh_rlhf": load_hh_rlhf}
# The sources each benchmark reads, in order: aime24_25 one per year (harness.config checks it); an RLHF prompt
# set (held-out prompts for the reward model) one.
BENCHMARK_PARTS: dict[str, tuple[str, ...]] = {
    "aime24": ("aime24",),
    "aime25": ("aime25",),
    "aime24_25": ("aime24", "aime25"),
    "ultrafeedback": ("ultrafeedback",),
    "hh_rlhf": ("hh_rlhf",),
}


def arith_config(data: Any) -> ArithConfig:
    return ArithConfig(
        kinds=tuple(data.kinds), add_max=data.add_max, mul_max=data.mul_max, n_eval=data.n_eval, seed=data.seed
    )


def load_problems(data: Any, benchmark: Any) -> tuple[list[Problem], list[Problem]]:
    """(training problems, evaluation problems) for the data and benchmark configs."""
    return load_training_set(data), load_benchmark(benchmark, data)


def load_training_set(data: Any) -> list[Problem]:
    """`data=arith`: the synthetic train split; `dapo_math` / `math_lvl3to5`: deduplicated, gradable problems
    from `data.path` (counts are logged)."""
    if data.name == "arith":
        train = make_splits(arith_config(data))[0]
        if getattr(data, "pool_path", None):  # DPPO's sanity-style pool (harness.tasks.pool)
            train = filter_pool(train, load_pass_rates(data.pool_path), data.pool_min, data.pool_max)
            logger.info("data=arith pool %s: %d problems", data.pool_path, len(train))
        return train
    if data.name == "dapo_math":
        keep = data.dapo_instruction == "keep"
        problems, counts = load_dapo_math(data.path, split=data.split, keep_instruction=keep)
    elif data.name == "math_lvl3to5":
        problems, counts = load_math(data.path, levels=tuple(data.levels), split=data.split)
    elif data.name in RLHF_SETS:
        problems, counts = RLHF_SETS[data.name](data.path, split=data.split)
    else:
        raise ValueError(f"data.name: unknown training set {data.name!r}; allowed: {', '.join(TRAINING_SETS)}")
    logger.info("data=%s from %s: %s", data.name, data.path, ", ".join(f"{k} {v}" for k, v in counts.items()))
    return problems


def load_benchmark(benchmark: Any, data: Any) -> list[Problem]:
    """`benchmark=arith`: the held-out split of data's arith config; `aime24` / `aime25`: `benchmark.path`;
    `aime24_25`: its two sources concatenated (kinds "aime24", "aime25"). Then the first
    `benchmark.max_problems`, taken round-robin over kinds so a prefix keeps the mix."""
    if benchmark.name == "arith":
        problems = make_splits(arith_config(data))[1]
    elif benchmark.name in RLHF_SETS:
        (source,) = benchmark_sources(benchmark)
        problems = RLHF_SETS[benchmark.name](source, split=benchmark.split, key="benchmark.path")[0]
    elif benchmark.name in BENCHMARK_PARTS:
        parts, sources = BENCHMARK_PARTS[benchmark.name], benchmark_sources(benchmark)
        per_part = [load_benchmark_file(s, kind, split=benchmark.split) for s, kind in zip(sources, parts, strict=True)]
        problems = [p for part in per_part for p in part]
        if len({p.id for p in problems}) < len(problems):  # two sources number their rows alike
            problems = [replace(p, id=f"{p.kind}/{p.id}") for p in problems]
    else:
        allowed = ", ".join(["arith", *BENCHMARK_PARTS])
        raise ValueError(f"benchmark.name: unknown benchmark {benchmark.name!r}; allowed: {allowed}")
    if benchmark.max_problems is not None:
        problems = _interleave_kinds(problems)[: benchmark.max_problems]
    return problems


def benchmark_sources(benchmark: Any) -> list[str]:
    """`benchmark.path` as a list with one source per part of the benchmark (a ValueError if it has not):
    a string (comma-separated for several) or a list."""
    parts = BENCHMARK_PARTS.get(benchmark.name, ())
    path = benchmark.path
    if path is None:
        sources = []
    elif isinstance(path, str):
        sources = [s.strip() for s in path.split(",")]
    else:
        sources = [str(s).strip() for s in path]
    if len(sources) != len(parts) or not all(sources):
        raise ValueError(
            f"benchmark.path: benchmark={benchmark.name} needs {len(parts)} source(s) ({', '.join(parts)}), "
            f"each a .jsonl/.parquet file or hub dataset name; got {path!r}"
        )
    return sources


def _interleave_kinds(problems: Sequence[Problem]) -> list[Problem]:
    """Round-robin over kinds, so any prefix is (nearly) balanced: a smaller eval set measures the same mix."""
    by_kind: dict[str, list[Problem]] = {}
    for p in problems:
        by_kind.setdefault(p.kind, []).append(p)
    return [p for p in chain.from_iterable(zip_longest(*by_kind.values())) if p is not None]


def render_prompts(tokenizer: Any, problems: Sequence[Problem], template: str) -> list[list[int]]:
    """Token ids of each problem's prompt: its `messages` through the chat template when it has turns (RLHF
    prompts), else its question through `template`."""
    texts = [
        render_turns(tokenizer, p.messages)
        if p.messages and template == "chat"
        else render(tokenizer, p.question, template)
        for p in problems
    ]
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
