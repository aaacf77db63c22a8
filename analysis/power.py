"""Seeds per arm for a rule to reach a verdict, by simulation: draw many experiments of n seeds per arm from two arms'
shapes (analysis/arm_shapes.py, fitted to the runs) or from two arms' observed per-seed values (resampled), decide
each exactly as a report would (`interval_function` of the rule's statistic, then `decide`), and count how often the
verdict comes.

    from analysis.arm_shapes import SHAPES
    from analysis.power import from_shape, seeds_for_power
    plan = seeds_for_power(from_shape(SHAPES["steady"], shift=0.05), from_shape(SHAPES["breaks_low"]),
                           Rule("greater_by", margin=0.1, statistic="superiority"))
    plan.seeds, plan.power, plan.se, plan.seeds_range

`replication_seeds` (analysis/verdicts.py) is the closed-form planning number a report prints for an inconclusive
part; this module is what a suite's preregistered power analysis runs: it needs no normal approximation, sees the
breaks, and says its own Monte Carlo error.

Monte Carlo error: the power at n seeds is a share of `experiments` simulated experiments, standard error
sqrt(p (1 - p) / experiments) (0.0063 at p = 0.8 and 4,000). `seeds` is the first n whose estimated power reaches the
target; `seeds_range` the first n whose power is within 2 standard errors of it (below: the true first n may be this
small) and the first n whose power clears it by 2 standard errors (above: the true first n is at most this).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from analysis.arm_shapes import Shape
from analysis.verdicts import OPPOSITE, REPRODUCED, SMALLER, Rule, decide, interval_function

# A sampler returns an array of the given shape of per-seed values: (experiments, seeds).
Sampler = Callable[[np.random.Generator, tuple[int, int]], np.ndarray]


def from_shape(shape: Shape, shift: float = 0.0) -> Sampler:
    """Seeds drawn from a fitted shape, its unbroken runs moved by `shift`."""
    return lambda rng, size: shape.draw(rng, size, shift)


def resample(values: ArrayLike) -> Sampler:
    """Seeds drawn with replacement from one arm's observed per-seed values (NaN dropped): were the true
    distribution what these seeds show."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if len(x) < 2:
        raise ValueError(f"resample: needs at least 2 finished values, got {len(x)}")
    return lambda rng, size: rng.choice(x, size=size, replace=True)


@dataclass(frozen=True)
class Power:
    seeds: tuple[int, int]  # per arm, A and B (B = A's for a part against a constant)
    power: float  # share of simulated experiments that reach the verdict
    se: float  # its Monte Carlo standard error


@dataclass(frozen=True)
class SeedPlan:
    seeds: int | None  # the first n per arm whose estimated power reaches the target; None: not by n_max
    power: float  # at `seeds` (at n_max when None)
    se: float
    seeds_range: tuple[int | None, int | None]  # first n within 2 s.e. of the target, first n 2 s.e. above it
    experiments: int
    curve: dict[int, float] = field(default_factory=dict)  # every n simulated -> its power


def power(
    a: Sampler,
    b: Sampler | float,
    seeds: int | tuple[int, int],
    rule: Rule,
    toward: str = REPRODUCED,
    experiments: int = 4000,
    seed: int = 0,
    confidence: float = 0.95,
) -> Power:
    """The probability that a comparison of `seeds` seeds per arm (n, or (n_a, n_b)) reaches the verdict `toward`
    under `rule`, arm A drawn from `a`, arm B from `b` (a number: a part against that constant). `confidence`: the
    interval's level, 1 - 0.05 / k for a part that Holm tests first among k."""
    if toward not in (REPRODUCED, SMALLER, OPPOSITE):
        raise ValueError(f"toward: {toward!r} is not one of {REPRODUCED!r}, {SMALLER!r}, {OPPOSITE!r}")
    n_a, n_b = (seeds, seeds) if isinstance(seeds, int) else seeds
    constant = isinstance(b, int | float)
    if constant:
        n_b = n_a
    if min(n_a, n_b) < rule.min_seeds:  # `compare` calls it inconclusive
        return Power((n_a, n_b), 0.0, 0.0)
    rng = np.random.default_rng(seed)
    xa = a(rng, (experiments, n_a))
    xb = np.full((experiments, n_b), float(b)) if constant else b(rng, (experiments, n_b))
    fn, _ = interval_function(rule.statistic, b_constant=constant)
    if rule.statistic == "rate":  # Newcombe's interval takes one experiment at a time
        lo, hi = np.array([fn(x, y, confidence)[1:] for x, y in zip(xa, xb, strict=True)]).T
    else:
        _, lo, hi = fn(xa, xb, confidence=confidence)
    hits = sum(decide(x, y, rule, (n_a, n_b))[0] == toward for x, y in zip(lo, hi, strict=True))
    p = hits / experiments
    return Power((n_a, n_b), p, math.sqrt(p * (1 - p) / experiments))


def seeds_for_power(
    a: Sampler,
    b: Sampler | float,
    rule: Rule,
    target: float = 0.8,
    toward: str = REPRODUCED,
    experiments: int = 4000,
    seed: int = 0,
    n_max: int = 64,
    confidence: float = 0.95,
) -> SeedPlan:
    """Seeds per arm (equal arms) for the rule to reach `toward` with probability `target`, by simulation at
    n = rule.min_seeds, min_seeds + 1, ... up to n_max (every n, in order: a Clopper-Pearson interval's power is
    a sawtooth in n, so a bisection could step over the first n that reaches the target)."""
    curve: dict[int, float] = {}
    se: dict[int, float] = {}
    first = low = high = None
    for n in range(rule.min_seeds, n_max + 1):
        est = power(a, b, n, rule, toward, experiments, seed + n, confidence)
        curve[n], se[n] = est.power, est.se
        if low is None and est.power + 2 * est.se >= target:
            low = n
        if first is None and est.power >= target:
            first = n
        if est.power - 2 * est.se >= target:
            high = n
            break
    at = first if first is not None else max(curve)
    return SeedPlan(first, curve[at], se[at], (low, high), experiments, curve)
