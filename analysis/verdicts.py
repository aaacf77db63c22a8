"""Per-run numbers -> an effect between two arms, its 95% confidence interval, and a verdict by a rule fixed in
advance (findings/suite.yaml). Pure functions over plain arrays: the findings suite and its tests share them.

Statistics follow Agarwal et al. 2021 ("Deep RL at the edge of the statistical precipice"), with scipy rather
than rliable: the effect is the difference of interquartile means (IQM, `scipy.stats.trim_mean(x, 0.25)`; with
fewer than 4 seeds nothing is trimmed and it is the mean), its interval a stratified percentile bootstrap
(`scipy.stats.bootstrap` resamples each arm's seeds independently), and P(A > B) the Mann-Whitney probability
of improvement (pairs of seeds, ties count half).

Rules (`Rule.kind`):
- `greater`: the claim says arm A scores higher than B. Reproduced when the interval lies above `margin`,
  contradicted when it lies below `-margin`, otherwise inconclusive.
- `less`: the mirror image.
- `greater_by`: the claim says A scores higher than B by at least `margin`. Reproduced when the interval lies above
  `margin`, contradicted when it lies below `margin` (an effect as large as the claim's is excluded), otherwise
  inconclusive. Unlike `greater`, which contradicts only past `-margin`, it leaves no band where no seed count
  decides: an effect of 0 contradicts it once the interval is narrow enough (suite v5 onward).
- `less_by`: the mirror image.
- `noninferior`: the claim says A is at least as good as B. Reproduced when the interval lies above `-margin`,
  contradicted when it lies below `-margin`, otherwise inconclusive.
- `equivalent`: the claim says A ~ B. Reproduced when the whole interval lies inside [-margin, margin],
  contradicted when it lies entirely outside it, otherwise inconclusive.
A comparison with a missing or failed arm, or fewer than `min_seeds` finished seeds in either arm, is inconclusive.

Statistic (`Rule.statistic`): `iqm` (the default) as above; `rate` for a 0/1 metric (did the run break?): the
effect is the difference of the two arms' rates and its interval Newcombe's hybrid score interval (Newcombe 1998,
method 10, from scipy's Wilson intervals of each rate). The IQM trims a rate under 25% to 0, and the percentile
bootstrap undercovers at the counts a few dozen seeds give (with 0 of n in one arm it reproduces from 4 of 48).

`replication_seeds` turns an inconclusive comparison into a planning number: the seeds per arm a fresh
replication would need to reproduce the claim (`toward=REPRODUCED`) or to contradict it (`toward=CONTRADICTED`),
were the true effect and spread what these seeds measured. It is a pilot's sample-size estimate, not a verdict: a
replication is a new experiment on new seeds, decided by the same rule on its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

REPRODUCED, CONTRADICTED, INCONCLUSIVE = "reproduced", "contradicted", "inconclusive"
VERDICTS = (REPRODUCED, CONTRADICTED, INCONCLUSIVE)
RULE_KINDS = ("greater", "less", "greater_by", "less_by", "equivalent", "noninferior")
STATISTICS = ("iqm", "rate")


@dataclass(frozen=True)
class Rule:
    kind: str  # one of RULE_KINDS
    margin: float = 0.0  # the smallest effect that counts (greater, less and their _by kinds) or the equivalence band
    min_seeds: int = 3
    statistic: str = "iqm"  # one of STATISTICS: what is compared between the arms

    def __post_init__(self) -> None:
        if self.kind not in RULE_KINDS:
            raise ValueError(f"rule.kind: {self.kind!r} is not one of {', '.join(RULE_KINDS)}")
        if self.statistic not in STATISTICS:
            raise ValueError(f"rule.statistic: {self.statistic!r} is not one of {', '.join(STATISTICS)}")
        if not (self.margin >= 0 and np.isfinite(self.margin)):
            raise ValueError(f"rule.margin: must be a finite number >= 0, got {self.margin!r}")
        if self.min_seeds < 2:  # one seed has no spread: a bootstrap interval needs two or more per arm
            raise ValueError(f"rule.min_seeds: must be >= 2, got {self.min_seeds!r}")


@dataclass(frozen=True)
class Comparison:
    effect: float  # IQM(A) - IQM(B), or rate(A) - rate(B) under the `rate` statistic
    ci_low: float
    ci_high: float
    prob_a_better: float  # P(A > B) over pairs of seeds
    seeds: tuple[int, int]  # finished seeds in A, in B
    verdict: str
    why: str  # one line: how the rule decided


def iqm(x: Sequence[float]) -> float:
    return float(stats.trim_mean(np.asarray(x, dtype=float), 0.25))


def iqm_interval(x: Sequence[float], resamples: int = 5000, seed: int = 0) -> tuple[float, float, float]:
    """(IQM(x), 95% lower, 95% upper) by a percentile bootstrap over one arm's seeds; NaN bounds under 2 seeds."""
    x = np.asarray([v for v in x if np.isfinite(v)], dtype=float)
    if len(x) < 2:
        return (iqm(x) if len(x) else math.nan), math.nan, math.nan
    return (iqm(x), *_percentile_bootstrap((x,), lambda v, axis=-1: _trimmed(v, axis), resamples, seed))


def probability_of_improvement(a: Sequence[float], b: Sequence[float]) -> float:
    """P(X > Y) + P(X = Y) / 2 for X from `a`, Y from `b`: Mann-Whitney's U divided by the number of pairs."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    u = stats.mannwhitneyu(a, b, alternative="two-sided").statistic
    return float(u / (len(a) * len(b)))


def effect_interval(
    a: Sequence[float], b: Sequence[float], resamples: int = 5000, seed: int = 0
) -> tuple[float, float, float]:
    """(IQM(a) - IQM(b), 95% lower, 95% upper) by a stratified percentile bootstrap over each arm's seeds."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)

    def diff(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        return _trimmed(x, axis) - _trimmed(y, axis)

    return (iqm(a) - iqm(b), *_percentile_bootstrap((a, b), diff, resamples, seed))


def rate_difference_interval(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """(rate(a) - rate(b), 95% lower, 95% upper) for two arms of 0/1 values: Newcombe's hybrid score interval,
    which combines each rate's Wilson interval (Newcombe 1998, method 10); scipy has the Wilson interval only."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    for name, x in (("A", a), ("B", b)):
        if not np.isin(x, (0.0, 1.0)).all():
            raise ValueError(f"rate statistic: arm {name} has values other than 0 and 1: {sorted(set(x.tolist()))}")
    p, q = a.mean(), b.mean()
    ci_a = stats.binomtest(int(a.sum()), len(a)).proportion_ci(method="wilson")
    ci_b = stats.binomtest(int(b.sum()), len(b)).proportion_ci(method="wilson")
    lo = (p - q) - math.hypot(p - ci_a.low, ci_b.high - q)
    hi = (p - q) + math.hypot(ci_a.high - p, q - ci_b.low)
    return float(p - q), float(lo), float(hi)


def mean_difference_interval(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """(mean(a) - mean(b), 95% lower, 95% upper): Welch's t interval (unequal variances, Welch-Satterthwaite
    degrees of freedom), from scipy. Unlike a percentile bootstrap it widens with few seeds as it should: at 3 vs 3
    seeds the bootstrap's interval covers ~80% of the time, Welch's ~95% (tests/test_coverage.py)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    effect = float(a.mean() - b.mean())
    if np.ptp(a) == 0 and np.ptp(b) == 0:  # no spread at all: scipy's interval is NaN; the difference is exact
        return effect, effect, effect
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    return effect, float(ci.low), float(ci.high)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (familywise error over the family given). Hand-written: scipy offers
    only the false-discovery-rate adjustment, and statsmodels is not a dependency for four lines."""
    p = np.asarray(pvalues, dtype=float)
    order = np.argsort(p)
    adjusted = np.minimum(1.0, np.maximum.accumulate((len(p) - np.arange(len(p))) * p[order]))
    out = np.empty_like(p)
    out[order] = adjusted
    return out.tolist()


def _center(x: Sequence[float], statistic: str) -> float:
    return float(np.mean(x)) if statistic == "rate" else iqm(x)


def _trimmed(x: np.ndarray, axis: int) -> np.ndarray:
    return stats.trim_mean(x, 0.25, axis=axis)


def _percentile_bootstrap(
    samples: tuple[np.ndarray, ...], statistic: Callable[..., np.ndarray], resamples: int, seed: int
) -> tuple[float, float]:
    """95% percentile-bootstrap bounds of `statistic`, each sample resampled on its own (stratified)."""
    if np.ptp(np.concatenate(samples)) == 0:  # every seed equal: the bootstrap has nothing to resample
        value = float(statistic(*samples))
        return value, value
    res = stats.bootstrap(
        samples, statistic, n_resamples=resamples, confidence_level=0.95, method="percentile", vectorized=True,
        rng=np.random.default_rng(seed),
    )  # fmt: skip
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def compare(a: Sequence[float] | None, b: Sequence[float] | None, rule: Rule) -> Comparison:
    """Apply `rule` to arm A's and arm B's per-seed values (NaN = a failed or missing run, dropped)."""
    a_ok = [float(v) for v in (a or []) if np.isfinite(v)]
    b_ok = [float(v) for v in (b or []) if np.isfinite(v)]
    seeds = (len(a_ok), len(b_ok))
    if min(seeds) < rule.min_seeds:
        why = f"needs {rule.min_seeds} finished seeds per arm, has {seeds[0]} and {seeds[1]}"
        nan = float("nan")
        effect = _center(a_ok, rule.statistic) - _center(b_ok, rule.statistic) if min(seeds) > 0 else nan
        return Comparison(effect, nan, nan, nan, seeds, INCONCLUSIVE, why)
    interval = rate_difference_interval if rule.statistic == "rate" else effect_interval
    effect, lo, hi = interval(a_ok, b_ok)
    verdict, why = decide(lo, hi, rule)
    return Comparison(effect, lo, hi, probability_of_improvement(a_ok, b_ok), seeds, verdict, why)


def replication_seeds(
    a: Sequence[float], b: Sequence[float], rule: Rule, power: float = 0.8, toward: str = REPRODUCED
) -> int | None:
    """Seeds per arm for a replication's 95% interval to clear the boundary of `rule` that gives the verdict
    `toward` with probability `power`, if the true effect were IQM(a) - IQM(b) and the per-seed spread these seeds'
    (normal approximation: the standard two-sample size formula). None when the measured effect lies short of
    that boundary: e.g. an effect inside the margin of a `greater` rule neither reproduces (the interval has to
    clear +margin) nor contradicts (it has to clear -margin) at any seed count."""
    if toward not in (REPRODUCED, CONTRADICTED):
        raise ValueError(f"toward: {toward!r} is not {REPRODUCED!r} or {CONTRADICTED!r}")
    a_ok = np.asarray([v for v in a if np.isfinite(v)], dtype=float)
    b_ok = np.asarray([v for v in b if np.isfinite(v)], dtype=float)
    if min(len(a_ok), len(b_ok)) < 2:
        return None
    effect, m = _center(a_ok, rule.statistic) - _center(b_ok, rule.statistic), rule.margin
    # Distance from the measured effect to the boundary the interval has to clear (`decide`'s boundaries).
    distance = {
        (REPRODUCED, "greater"): effect - m,
        (REPRODUCED, "less"): -effect - m,
        (REPRODUCED, "greater_by"): effect - m,
        (REPRODUCED, "less_by"): -effect - m,
        (REPRODUCED, "noninferior"): effect + m,
        (REPRODUCED, "equivalent"): m - abs(effect),
        (CONTRADICTED, "greater"): -effect - m,
        (CONTRADICTED, "less"): effect - m,
        (CONTRADICTED, "greater_by"): m - effect,
        (CONTRADICTED, "less_by"): effect + m,
        (CONTRADICTED, "noninferior"): -effect - m,
        (CONTRADICTED, "equivalent"): abs(effect) - m,
    }[toward, rule.kind]
    if distance <= 0:
        return None
    variance = float(np.var(a_ok, ddof=1) + (np.var(b_ok, ddof=1) if np.ptp(b_ok) > 0 else 0.0))
    z = stats.norm.ppf(0.975) + stats.norm.ppf(power)
    return max(rule.min_seeds, math.ceil(z**2 * variance / distance**2))


def decide(lo: float, hi: float, rule: Rule) -> tuple[str, str]:
    """The verdict for a 95% interval [lo, hi] of the effect A - B."""
    m = rule.margin
    interval = f"95% CI [{lo:.3g}, {hi:.3g}]"
    if rule.kind == "equivalent":
        if -m <= lo and hi <= m:
            return REPRODUCED, f"{interval} inside ±{m:g}"
        if lo > m or hi < -m:
            return CONTRADICTED, f"{interval} outside ±{m:g}"
        return INCONCLUSIVE, f"{interval} overlaps the edge of ±{m:g}"
    if rule.kind == "noninferior":
        if lo > -m:
            return REPRODUCED, f"{interval} above -{m:g}"
        if hi < -m:
            return CONTRADICTED, f"{interval} below -{m:g}"
        return INCONCLUSIVE, f"{interval} reaches below -{m:g}"
    sign = 1.0 if rule.kind in ("greater", "greater_by") else -1.0
    lo_s, hi_s = sorted((sign * lo, sign * hi))
    side = ">" if sign > 0 else "<"
    if lo_s > m:
        return REPRODUCED, f"{interval} {side} {sign * m:g}"
    if rule.kind in ("greater_by", "less_by"):
        if hi_s < m:
            return CONTRADICTED, f"{interval} excludes an effect {'>=' if sign > 0 else '<='} {sign * m:g}"
    elif hi_s < -m:
        return CONTRADICTED, f"{interval} on the other side of {-sign * m:g}"
    return INCONCLUSIVE, f"{interval} does not clear {sign * m:g}"


def combine(verdicts: Sequence[str]) -> str:
    """A claim with several parts: contradicted if any part is, reproduced if every part is, else inconclusive."""
    if not verdicts:
        return INCONCLUSIVE
    if CONTRADICTED in verdicts:
        return CONTRADICTED
    if all(v == REPRODUCED for v in verdicts):
        return REPRODUCED
    return INCONCLUSIVE
