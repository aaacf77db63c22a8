"""Per-run numbers -> an effect between two arms, its 95% confidence interval, and a verdict by a rule fixed in
advance (findings/suite.yaml). Pure functions over plain arrays: the findings suite, the testbed map and their tests
share them.

Statistics (`Rule.statistic`), chosen for intervals that cover at the few seeds a CPU suite affords
(tests/test_coverage.py simulates every seed pair the suite uses):
- `mean` (the default): the effect is mean(A) - mean(B), its interval Welch's t interval (scipy's `ttest_ind` with
  unequal variances). Against a constant (a part whose `b` is a number) the effect is median(A) - b with the
  distribution-free order-statistic interval of the median (one arm's runs, breaks and all, are far from normal). The
  percentile bootstrap of suites v1-v6 covered ~80% at 3 vs 3 seeds and ~91% at 8 vs 8; Welch's covers >= 93%
  on normal data and on a mixture with the suite's break rate.
  Welch's interval does not hold on the shapes this testbed makes (analysis/arm_shapes.py): an arm that breaks in
  20% of its runs to ~0 shows no break in 6 seeds a quarter of the time, its interval is then narrow around the
  unbroken runs, and against a tight arm (s.d. 0.007) it lies wholly above the true difference 7.6-9.2% of the
  time at 5-8 seeds (coverage 0.90-0.91); for the map's PG-IS shape (1 break in 8 from a body at 0.28) 15-28%.
- `superiority`: the effect is P(A > B) + P(A = B)/2 - 1/2 for a seed of A and a seed of B (0: neither arm tends
  to score higher; +1/2: every seed of A above every seed of B), with the Clopper-Pearson interval of P_hat as a
  binomial proportion of min(n_a, n_b) trials, the largest spread P_hat can have (`superiority_interval`). The
  margin is on the same scale and `decide` reads the interval as for any other statistic: `greater_by` with margin
  0.1 is reproduced when the interval lies above 0.1 (A beats B in more than 60% of seed pairs), opposite below 0,
  smaller than claimed below 0.1; `noninferior` with margin 0.1 is reproduced above -0.1 (A loses to B in fewer
  than 60% of pairs); `equivalent` with margin 0.1 inside ±0.1. A margin must be below 1/2. A break counts as a low
  score: a breaking arm loses pairs instead of widening a spread. Against a constant c the effect is
  P(A > c) + P(A = c)/2 - 1/2, the interval the same on A's seeds (there P_hat is exactly binomial). On every
  shape and seed pair tested it covers >= 97% with <= 1.4% wholly on one side of the truth, at each verdict
  boundary and at the fitted means (tests/test_coverage.py); the Brunner-Munzel t interval (the same estimate, its
  variance estimated from the seeds) lies wholly above a true P of 0.6 up to 5.9% of the time and collapses to a
  point where every A lies below every B. It says which arm tends to score higher, not by how much: report the
  means beside it. Few seeds cannot reach a verdict at all: with every A above every B the lower bound is
  0.025^(1/n), above 1/2 only from n = 6 seeds per arm and above 0.6 (a 0.1 margin) only from n = 8 (8 and 10 at
  Holm's 0.05 / 4).
- `rate`: for a 0/1 metric (did the run break?): the difference of the two arms' rates and Newcombe's hybrid score
  interval (Newcombe 1998, method 10, from scipy's Wilson intervals of each rate). Break rate is its own endpoint,
  never folded into another part's verdict.

Verdicts, per part (`decide`):
- *reproduced*: the interval lies beyond the claim's boundary (above `margin` for `greater`/`greater_by`, inside
  the band for `equivalent`, above `-margin` for `noninferior`);
- *opposite*: a significant effect the other way (for `greater`, the interval below `-margin`; for `greater_by`
  below 0; for `equivalent` entirely outside the band; for `noninferior` below `-margin`);
- *smaller than claimed* (`greater_by`/`less_by` only): an effect as large as the margin is excluded, but no effect
  the other way was seen; said only with at least SMALLER_MIN_SEEDS seeds in each arm, since a few-seed interval
  that happens to fall short of the margin says little;
- *inconclusive*: anything else, and a part with a failed or missing arm or fewer than `min_seeds` seeds;
- *not testable here*: the claim's mechanism has no positive control on this testbed (set by the suite, not here).
A claim's parts are one family: each part's p-value (the smallest level at which its interval clears the boundary
of the verdict it reached) is Holm-adjusted over the claim's parts, a part whose adjusted p is 0.05 or more becomes
inconclusive, and the claim gets a one-word summary only where its adjusted parts agree (`summarize`).

Multiplicity, recommended for a suite (Holm within a claim is what `summarize` does; the rest is for the suite file
to state before its runs):
- Within a claim, its parts are one family: Holm over the parts' p-values, familywise error <= 5% per claim.
- Across claims: one primary part per claim, named in the suite file before any run (the part that says what the
  paper says, on its primary endpoint). The primary parts of all claims are a second family, Holm over the claims,
  so that the chance of any false "reproduced" or "opposite" among the suite's headline verdicts is at most 5%
  whatever the number of claims; a claim's summary word is reported with both adjusted p-values. Seeds are planned
  for that: Holm's first step tests each of k primary parts at 0.05 / k (`analysis.power.seeds_for_power` with
  `confidence=1 - 0.05 / k`), and a claim whose primary part cannot reach 80% power there is cut, not run short.
- Secondary endpoints (break rate, the mechanism's measures, a second metric) are Holm-adjusted within their claim
  and reported beside the primary verdict; they never turn an inconclusive primary part into a verdict, and their
  error is controlled per claim, not jointly with the headline family.
- Anything chosen after seeing runs (a threshold, a subgroup, an arm added) is descriptive: no verdict word.
- Replications on new seeds are separate experiments, decided on their own seeds, never pooled.

`replication_seeds` turns an inconclusive comparison into a planning number: the seeds per arm a fresh replication
would need to reach a verdict, were the true effect and spread what these seeds measured. It is a pilot's
sample-size estimate, not a verdict.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import optimize, stats

REPRODUCED, OPPOSITE, SMALLER = "reproduced", "opposite", "smaller than claimed"
INCONCLUSIVE, NOT_TESTABLE = "inconclusive", "not testable here"
VERDICTS = (REPRODUCED, OPPOSITE, SMALLER, INCONCLUSIVE, NOT_TESTABLE)
MIXED = "parts differ"  # a claim's summary when its parts' verdicts do not agree
RULE_KINDS = ("greater", "less", "greater_by", "less_by", "equivalent", "noninferior")
STATISTICS = ("mean", "rate", "superiority")
SMALLER_MIN_SEEDS = 8  # "smaller than claimed" needs this many finished seeds in each arm
ALPHA = 0.05


@dataclass(frozen=True)
class Rule:
    kind: str  # one of RULE_KINDS
    margin: float = 0.0  # the smallest effect that counts (greater, less and their _by kinds) or the equivalence band
    min_seeds: int = 3
    statistic: str = "mean"  # one of STATISTICS: what is compared between the arms

    def __post_init__(self) -> None:
        if self.kind not in RULE_KINDS:
            raise ValueError(f"rule.kind: {self.kind!r} is not one of {', '.join(RULE_KINDS)}")
        if self.statistic not in STATISTICS:
            raise ValueError(f"rule.statistic: {self.statistic!r} is not one of {', '.join(STATISTICS)}")
        if not (isinstance(self.margin, int | float) and self.margin >= 0 and np.isfinite(self.margin)):
            raise ValueError(f"rule.margin: must be a finite number >= 0, got {self.margin!r}")
        if self.statistic == "superiority" and self.margin >= 0.5:
            raise ValueError(
                f"rule.margin: P(A>B) - 1/2 lies in [-0.5, 0.5]; a margin of {self.margin!r} is unreachable"
            )
        if not isinstance(self.min_seeds, int) or self.min_seeds < 2:  # one seed has no spread
            raise ValueError(f"rule.min_seeds: must be a whole number >= 2, got {self.min_seeds!r}")


@dataclass(frozen=True)
class Comparison:
    effect: float  # mean(A) - mean(B); rate(A) - rate(B) under `rate`; P(A>B) + P(A=B)/2 - 1/2 under `superiority`
    ci_low: float
    ci_high: float
    prob_a_better: float  # P(A > B) over pairs of seeds
    seeds: tuple[int, int]  # finished seeds in A, in B
    verdict: str
    why: str  # one line: how the rule decided
    p: float  # the smallest level at which the interval clears the reached verdict's boundary (1 when inconclusive)
    method: str  # how the interval was computed


# --- intervals ---------------------------------------------------------------------------------------------------


def mean_difference_interval(a: ArrayLike, b: ArrayLike, confidence: float = 0.95) -> tuple[Any, Any, Any]:
    """(mean(a) - mean(b), lower, upper): Welch's t interval (unequal variances, Welch-Satterthwaite degrees of
    freedom), from scipy. Over the last axis: 2-D inputs give one interval per row (the coverage test's
    thousands of simulated experiments in one call)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    effect = a.mean(axis=-1) - b.mean(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ci = stats.ttest_ind(a, b, axis=-1, equal_var=False).confidence_interval(confidence)
    # No spread in either arm: scipy's interval is NaN, and the difference is exact.
    exact = (np.ptp(a, axis=-1) == 0) & (np.ptp(b, axis=-1) == 0)
    return _out(effect, np.where(exact, effect, ci.low), np.where(exact, effect, ci.high))


def mean_minus_constant_interval(a: ArrayLike, c: float, confidence: float = 0.95) -> tuple[Any, Any, Any]:
    """(mean(a) - c, lower, upper): the one-sample t interval, over the last axis."""
    a = np.asarray(a, dtype=float)
    effect = a.mean(axis=-1) - c
    with np.errstate(divide="ignore", invalid="ignore"):
        ci = stats.ttest_1samp(a, c, axis=-1).confidence_interval(confidence)  # an interval of the mean itself
    exact = np.ptp(a, axis=-1) == 0
    return _out(effect, np.where(exact, effect, ci.low - c), np.where(exact, effect, ci.high - c))


def median_minus_constant_interval(a: ArrayLike, c: float, confidence: float = 0.95) -> tuple[Any, Any, Any]:
    """(median(a) - c, lower, upper): the distribution-free interval of the median from order statistics (the sign
    test inverted), over the last axis: [x_(k), x_(n-k+1)] with the largest k whose coverage
    1 - 2 P(Bin(n, 1/2) < k) is at least `confidence`. A part against a constant compares one arm's per-run values,
    whose breaks make them far from normal: the one-sample t interval covered 78% at 8 seeds with the suite's break
    rate, this one at least 95% whatever the distribution. With too few values for the confidence (3 at 95%) the
    interval is unbounded."""
    a = np.sort(np.asarray(a, dtype=float), axis=-1)
    n = a.shape[-1]
    effect = np.median(a, axis=-1) - c
    ks = np.arange(1, n // 2 + 1)
    ok = ks[1 - 2 * stats.binom.cdf(ks - 1, n, 0.5) >= confidence]
    if not len(ok):
        return _out(effect, np.full_like(effect, -np.inf), np.full_like(effect, np.inf))
    k = int(ok.max())
    return _out(effect, a[..., k - 1] - c, a[..., n - k] - c)


def _out(*values: np.ndarray) -> tuple[Any, ...]:
    """Floats for one experiment, arrays for many."""
    return tuple(float(v) if np.ndim(v) == 0 else v for v in values)


def rate_difference_interval(
    a: Sequence[float], b: Sequence[float], confidence: float = 0.95
) -> tuple[float, float, float]:
    """(rate(a) - rate(b), lower, upper) for two arms of 0/1 values: Newcombe's hybrid score interval, which
    combines each rate's Wilson interval (Newcombe 1998, method 10); scipy has the Wilson interval only."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    for name, x in (("A", a), ("B", b)):
        if not np.isin(x, (0.0, 1.0)).all():
            raise ValueError(f"rate statistic: arm {name} has values other than 0 and 1: {sorted(set(x.tolist()))}")
    p, q = a.mean(), b.mean()
    ci_a = stats.binomtest(int(a.sum()), len(a)).proportion_ci(confidence_level=confidence, method="wilson")
    ci_b = stats.binomtest(int(b.sum()), len(b)).proportion_ci(confidence_level=confidence, method="wilson")
    lo = (p - q) - math.hypot(p - ci_a.low, ci_b.high - q)
    hi = (p - q) + math.hypot(ci_a.high - p, q - ci_b.low)
    return float(p - q), float(lo), float(hi)


def superiority_interval(a: ArrayLike, b: ArrayLike, confidence: float = 0.95) -> tuple[Any, Any, Any]:
    """(P(A > B) + P(A = B)/2 - 1/2, lower, upper) over the last axis, for seeds A from `a` and B from `b`.

    The estimate P_hat is Mann-Whitney's U / (n_a n_b) (the Brunner-Munzel estimate). Its interval is the
    Clopper-Pearson interval of x = n P_hat successes in n = min(n_a, n_b) trials (beta quantiles, which
    interpolate for a fractional x): P_hat is treated as a binomial proportion of n trials. No two distributions
    with a given P give P_hat a larger variance than that binomial's, P (1 - P) / n (van Dantzig 1951; Birnbaum and
    Klose 1957), and it is reached when one arm is a point against the other: this testbed's tight trust-region arms
    (s.d. 0.007) against arms that break to ~0 are close to it. The Brunner-Munzel t interval, which estimates the
    variance from the seeds, lies wholly above a true P of 0.6 up to 5.9% of the time at 5-16 seeds and collapses to
    a point when every A lies below every B; Wilson's score interval at the same bound (with a t quantile) still
    misses on one side 5-7% of the time where P is near 0 or 1 (tests/test_coverage.py). This interval depends on
    the seeds only through P_hat and n, stays inside [0, 1], and is conservative where both arms spread.
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    n = min(a.shape[-1], b.shape[-1])
    p = 0.5 + 0.5 * np.sign(a[..., :, None] - b[..., None, :]).mean(axis=(-2, -1))  # ties count 1/2
    lo, hi = _clopper_pearson(p * n, n, confidence)
    return _out(p - 0.5, lo - 0.5, hi - 0.5)


def _clopper_pearson(x: np.ndarray, n: int, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """The Clopper-Pearson interval of x successes (a real number in [0, n]) in n trials."""
    tail = (1 - confidence) / 2
    x = np.asarray(x, dtype=float)
    tiny = 1e-12  # beta's shape parameters must be positive; the bound itself is 0 or 1 there
    lo = np.where(x > 0, stats.beta.ppf(tail, np.maximum(x, tiny), n - x + 1), 0.0)
    hi = np.where(x < n, stats.beta.ppf(1 - tail, x + 1, np.maximum(n - x, tiny)), 1.0)
    return lo, hi


def interval_function(statistic: str, b_constant: bool) -> tuple[Callable[..., tuple[float, float, float]], str]:
    """The interval of a rule's statistic, and its name for the report."""
    if statistic == "rate":
        return rate_difference_interval, "Newcombe hybrid score"
    if statistic == "superiority":
        name = "P(A>B) - 1/2, Clopper-Pearson at min(n) trials"
        if b_constant:  # P(A > c): a proportion of A's seeds, n = A's seeds
            return (
                lambda a, b, confidence=0.95: superiority_interval(
                    a, np.full(np.shape(a), float(np.ravel(b)[0])), confidence
                )
            ), name
        return superiority_interval, name
    if b_constant:
        return (
            lambda a, b, confidence=0.95: median_minus_constant_interval(a, float(np.ravel(b)[0]), confidence)
        ), "median, order statistics"
    return mean_difference_interval, "Welch t"


def mean_interval(x: Sequence[float]) -> tuple[float, float, float]:
    """(mean(x), 95% lower, 95% upper): the Student t interval of one arm's mean; NaN bounds under 2 values."""
    x = np.asarray([v for v in x if np.isfinite(v)], dtype=float)
    if len(x) < 2:
        return (float(x.mean()) if len(x) else math.nan), math.nan, math.nan
    return mean_minus_constant_interval(x, 0.0)


def probability_of_improvement(a: Sequence[float], b: Sequence[float]) -> float:
    """P(X > Y) + P(X = Y) / 2 for X from `a`, Y from `b`: Mann-Whitney's U divided by the number of pairs."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    u = stats.mannwhitneyu(a, b, alternative="two-sided").statistic
    return float(u / (len(a) * len(b)))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (familywise error over the family given). Hand-written: scipy offers
    only the false-discovery-rate adjustment, and statsmodels is not a dependency for four lines."""
    p = np.asarray(pvalues, dtype=float)
    if not len(p):
        return []
    order = np.argsort(p)
    adjusted = np.minimum(1.0, np.maximum.accumulate((len(p) - np.arange(len(p))) * p[order]))
    out = np.empty_like(p)
    out[order] = adjusted
    return out.tolist()


# --- verdicts ----------------------------------------------------------------------------------------------------


def decide(lo: float, hi: float, rule: Rule, seeds: tuple[int, int] = (0, 0)) -> tuple[str, str]:
    """The verdict for a 95% interval [lo, hi] of the effect A - B, with `seeds` finished seeds per arm."""
    m = rule.margin
    interval = f"95% CI [{lo:.3g}, {hi:.3g}]"
    if rule.kind == "equivalent":
        if -m <= lo and hi <= m:
            return REPRODUCED, f"{interval} inside ±{m:g}"
        if lo > m or hi < -m:
            return OPPOSITE, f"{interval} outside ±{m:g}: a difference where the claim says none"
        return INCONCLUSIVE, f"{interval} overlaps the edge of ±{m:g}"
    if rule.kind == "noninferior":
        if lo > -m:
            return REPRODUCED, f"{interval} above -{m:g}"
        if hi < -m:
            return OPPOSITE, f"{interval} below -{m:g}"
        return INCONCLUSIVE, f"{interval} reaches below -{m:g}"
    sign = 1.0 if rule.kind in ("greater", "greater_by") else -1.0
    lo_s, hi_s = sorted((sign * lo, sign * hi))  # on the claim's side: larger is more as claimed
    by = rule.kind.endswith("_by")
    side = ">" if sign > 0 else "<"
    if lo_s > m:
        return REPRODUCED, f"{interval} {side} {sign * m:g}"
    other = 0.0 if by else -m
    if hi_s < other:
        return OPPOSITE, f"{interval} on the other side of {sign * other:g}"
    if by and hi_s < m:
        if min(seeds) >= SMALLER_MIN_SEEDS:
            return SMALLER, f"{interval} excludes an effect {'>=' if sign > 0 else '<='} {sign * m:g}"
        return INCONCLUSIVE, (
            f"{interval} falls short of {sign * m:g}, with fewer than {SMALLER_MIN_SEEDS} seeds in an arm "
            f"({seeds[0]}/{seeds[1]}): too few to call it smaller than claimed"
        )
    return INCONCLUSIVE, f"{interval} does not clear {sign * m:g}"


def _level_p(interval: Callable[[float], tuple[float, float, float]], reached: Callable[[float, float], bool]) -> float:
    """The smallest alpha at which the (1 - alpha) interval still reaches the verdict (`reached(lo, hi)`): the
    interval narrows as alpha grows, so a bisection finds it. 1 when no alpha below 1 reaches it."""
    _, lo, hi = interval(1 - 0.999999)
    if not reached(lo, hi):
        return 1.0
    low, high = 1e-12, 0.999999
    for _ in range(50):
        mid = math.sqrt(low * high)
        _, lo, hi = interval(1 - mid)
        low, high = (low, mid) if reached(lo, hi) else (mid, high)
    return high


def compare(a: Sequence[float] | None, b: Sequence[float] | float | None, rule: Rule) -> Comparison:
    """Apply `rule` to arm A's and arm B's per-seed values (NaN = a failed or missing run, dropped); `b` may be a
    constant (a part against a fixed value)."""
    b_constant = isinstance(b, int | float)
    a_ok = [float(v) for v in (a or []) if np.isfinite(v)]
    b_ok = [float(b)] * max(len(a_ok), 1) if b_constant else [float(v) for v in (b or []) if np.isfinite(v)]
    fn, method = interval_function(rule.statistic, b_constant)
    seeds = (len(a_ok), len(b_ok) if not b_constant else len(a_ok))
    if min(seeds) < rule.min_seeds:
        why = f"needs {rule.min_seeds} finished seeds per arm, has {seeds[0]} and {seeds[1]}"
        nan = math.nan
        effect = nan
        if min(seeds) > 0:
            effect = fn(a_ok, b_ok)[0] if rule.statistic == "superiority" else float(np.mean(a_ok) - np.mean(b_ok))
        return Comparison(effect, nan, nan, nan, seeds, INCONCLUSIVE, why, 1.0, method)
    effect, lo, hi = fn(a_ok, b_ok)
    verdict, why = decide(lo, hi, rule, seeds)
    p = 1.0
    if verdict != INCONCLUSIVE:
        p = _level_p(
            lambda conf: fn(a_ok, b_ok, confidence=conf), lambda lo_, hi_: decide(lo_, hi_, rule, seeds)[0] == verdict
        )
    prob = probability_of_improvement(a_ok, b_ok)
    return Comparison(effect, lo, hi, prob, seeds, verdict, why, p, method)


def summarize(parts: Sequence[Comparison]) -> tuple[str, list[str], list[float]]:
    """(the claim's one-word summary, each part's verdict after Holm's correction over the parts, the adjusted
    p-values). A part whose adjusted p is ALPHA or more becomes inconclusive; the summary is the parts' common
    verdict, or MIXED where they differ."""
    if not parts:
        return INCONCLUSIVE, [], []
    adjusted = holm([c.p for c in parts])
    verdicts = [
        c.verdict if c.verdict != INCONCLUSIVE and p < ALPHA else INCONCLUSIVE
        for c, p in zip(parts, adjusted, strict=True)
    ]
    return common_word(verdicts), verdicts, adjusted


def common_word(verdicts: Sequence[str]) -> str:
    """A claim's one word from its parts' verdicts: their common verdict, or MIXED."""
    return verdicts[0] if len(set(verdicts)) == 1 else MIXED


def replication_seeds(
    a: Sequence[float], b: Sequence[float], rule: Rule, power: float = 0.8, toward: str = REPRODUCED
) -> int | None:
    """Seeds per arm for a replication's 95% interval to clear the boundary of `rule` that gives the verdict
    `toward` (REPRODUCED, SMALLER or OPPOSITE) with probability `power`, if the true effect were mean(a) - mean(b)
    and the per-seed spread these seeds' (normal approximation: the standard two-sample size formula). None when the
    measured effect lies short of that boundary, or the rule has no such verdict.

    Under `superiority` the effect is the measured P(A>B) - 1/2 and the interval the rule's, which depends on the
    seeds only through P_hat and n: at n seeds per arm the verdict comes when P_hat passes a threshold T(n) (where
    the Clopper-Pearson bound meets the boundary), and the seeds are the smallest n with
    |P - T(n)| >= z_power s / sqrt(n), s^2 the two arms' per-seed placement variances var_j(P(a_j > B)) +
    var_k(P(A > b_k)) (normal approximation; analysis/power.py simulates it instead)."""
    if toward not in (REPRODUCED, SMALLER, OPPOSITE):
        raise ValueError(f"toward: {toward!r} is not one of {REPRODUCED!r}, {SMALLER!r}, {OPPOSITE!r}")
    a_ok = np.asarray([v for v in a if np.isfinite(v)], dtype=float)
    b_ok = np.asarray([v for v in b if np.isfinite(v)], dtype=float)
    if min(len(a_ok), len(b_ok)) < 2:
        return None
    superiority = rule.statistic == "superiority"
    if superiority:
        effect = float(superiority_interval(a_ok, b_ok)[0])
    else:
        effect = float(a_ok.mean() - b_ok.mean())
    m = rule.margin
    sign = -1.0 if rule.kind in ("less", "less_by") else 1.0
    e = sign * effect
    by = rule.kind.endswith("_by")
    # Distance from the measured effect to the boundary the interval has to clear (`decide`'s boundaries).
    if rule.kind == "equivalent":
        distance = {REPRODUCED: m - abs(effect), OPPOSITE: abs(effect) - m, SMALLER: -1.0}[toward]
    elif rule.kind == "noninferior":
        distance = {REPRODUCED: effect + m, OPPOSITE: -effect - m, SMALLER: -1.0}[toward]
    else:
        distance = {REPRODUCED: e - m, OPPOSITE: -e - (0.0 if by else m), SMALLER: (m - e) if by else -1.0}[toward]
    if distance <= 0:
        return None
    if superiority:
        # Which side of the boundary the interval must lie on: +1 above it (its lower bound clears it), -1 below.
        up = sign * {REPRODUCED: 1.0, OPPOSITE: -1.0, SMALLER: -1.0}[toward]
        if rule.kind == "equivalent":
            up = (-1.0 if toward == REPRODUCED else 1.0) * (1.0 if effect >= 0 else -1.0)
        elif rule.kind == "noninferior":
            up = 1.0 if toward == REPRODUCED else -1.0
        need = _superiority_seeds(a_ok, b_ok, effect - up * distance, up, power)
        if need is None:
            return None
        need = max(rule.min_seeds, need)
        return max(need, SMALLER_MIN_SEEDS) if toward == SMALLER else need
    variance = float(np.var(a_ok, ddof=1) + (np.var(b_ok, ddof=1) if np.ptp(b_ok) > 0 else 0.0))
    z = stats.norm.ppf(0.975) + stats.norm.ppf(power)
    need = max(rule.min_seeds, math.ceil(z**2 * variance / distance**2))
    return max(need, SMALLER_MIN_SEEDS) if toward == SMALLER else need


def _superiority_seeds(a: np.ndarray, b: np.ndarray, boundary: float, up: float, power: float) -> int | None:
    """The smallest n per arm (up to 10,000) at which the superiority interval lies wholly above (`up` = 1) or below
    (-1) `boundary` (in P - 1/2 units) with probability `power`, were P and the placements' spread these seeds'."""
    gt = 0.5 + 0.5 * np.sign(a[:, None] - b[None, :])
    spread = math.sqrt(float(np.var(gt.mean(axis=1), ddof=1) + np.var(gt.mean(axis=0), ddof=1)))
    # Mirrored so that the interval's lower bound has to clear the boundary: hi(x, n) = 1 - lo(n - x, n).
    p = 0.5 + up * float(gt.mean() - 0.5)
    p_b = 0.5 + up * boundary
    z = stats.norm.ppf(power)

    def meets(n: int) -> bool:
        if _clopper_pearson(n, n, 0.95)[0] <= p_b:  # not even P_hat = 1 clears it
            return False
        x = optimize.brentq(lambda x: _clopper_pearson(x, n, 0.95)[0] - p_b, 1e-9, n)
        return p - x / n >= z * spread / math.sqrt(n)

    if not meets(10_000):
        return None
    lo, hi = 1, 10_000  # meets(hi) holds; the criterion grows with n, so bisect
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if meets(mid) else (mid, hi)
    return hi
