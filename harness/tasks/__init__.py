"""Training sets and benchmarks as lists of problems, and prompts as token ids."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain, zip_longest
from typing import Any

from harness.tasks.arith import ArithConfig, Problem, make_splits
from harness.tasks.templates import render


def arith_config(data: Any) -> ArithConfig:
    return ArithConfig(
        kinds=tuple(data.kinds), add_max=data.add_max, mul_max=data.mul_max, n_eval=data.n_eval, seed=data.seed
    )


def load_problems(data: Any, benchmark: Any) -> tuple[list[Problem], list[Problem]]:
    """(training problems, evaluation problems) for the data and benchmark configs."""
    if data.name != "arith" or benchmark.name != "arith":
        raise ValueError(
            f"data={data.name} benchmark={benchmark.name}: only the synthetic 'arith' task is available so far"
        )
    train, held_out = make_splits(arith_config(data))
    if benchmark.max_problems is not None:
        held_out = _interleave_kinds(held_out)[: benchmark.max_problems]
    return train, held_out


def _interleave_kinds(problems: Sequence[Problem]) -> list[Problem]:
    """Round-robin over kinds, so any prefix is (nearly) balanced: a smaller eval set measures the same mix."""
    by_kind: dict[str, list[Problem]] = {}
    for p in problems:
        by_kind.setdefault(p.kind, []).append(p)
    return [p for p in chain.from_iterable(zip_longest(*by_kind.values())) if p is not None]


def render_prompts(tokenizer: Any, problems: Sequence[Problem], template: str) -> list[list[int]]:
    texts = [render(tokenizer, p.question, template) for p in problems]
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
