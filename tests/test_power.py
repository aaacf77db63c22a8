"""The power analysis (analysis/power.py) against answers worked out without simulation."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from analysis.arm_shapes import SHAPES
from analysis.power import from_shape, power, resample, seeds_for_power
from analysis.verdicts import Rule, _clopper_pearson, rate_difference_interval, replication_seeds


def normal(mean: float, sd: float):
    return lambda rng, size: rng.normal(mean, sd, size)


def test_welch_seeds_match_the_two_sample_formula():
    """Normal arms, s.d. 0.03 each, true difference 0.05, `greater_by` 0.02: the interval must clear 0.02, a distance
    of 0.03 = one s.d. The two-sample formula gives 2 (z_0.975 + z_0.8)^2 = 2 (1.960 + 0.842)^2 = 15.7, so 16 seeds
    per arm; the t distribution's heavier tails add one: the noncentral t with 2n - 2 degrees of freedom and
    noncentrality 1 / sqrt(2 / n) has power 0.781 at 16 and 0.807 at 17. The simulation (Welch, as a report decides)
    must say 17."""
    z_formula = 2 * (stats.norm.ppf(0.975) + stats.norm.ppf(0.8)) ** 2
    assert z_formula == pytest.approx(15.70, abs=0.01)

    def exact(n: int) -> float:
        return stats.nct.sf(stats.t.ppf(0.975, 2 * n - 2), 2 * n - 2, 1 / np.sqrt(2 / n))

    assert exact(16) < 0.8 <= exact(17)
    plan = seeds_for_power(normal(0.30, 0.03), normal(0.25, 0.03), Rule("greater_by", margin=0.02), experiments=20_000)
    assert plan.seeds == 17 and plan.seeds_range == (17, 17)
    assert abs(plan.power - exact(17)) < 3 * plan.se
    assert abs(plan.curve[10] - exact(10)) < 3 * np.sqrt(exact(10) * (1 - exact(10)) / 20_000)


def test_seeds_at_a_holm_level():
    """The same arms, planned as the first of 4 primary parts under Holm: tested at 0.05 / 4, its interval at 98.75%.
    The noncentral t with the 1 - 0.00625 quantile: 0.780 at 23, 0.802 at 24, so 24 seeds (7 more than at 5%)."""

    def exact(n: int) -> float:
        return stats.nct.sf(stats.t.ppf(1 - 0.05 / 8, 2 * n - 2), 2 * n - 2, 1 / np.sqrt(2 / n))

    assert exact(23) < 0.8 <= exact(24)
    rule = Rule("greater_by", margin=0.02)
    plan = seeds_for_power(normal(0.30, 0.03), normal(0.25, 0.03), rule, experiments=20_000, confidence=1 - 0.05 / 4)
    assert plan.seeds == 24 and plan.seeds_range[0] <= 24 <= plan.seeds_range[1]


def test_superiority_seeds_match_the_binomial():
    """A part against a constant c with P(A > c) = 0.85, `greater_by` 0.1 under `superiority`: P_hat is then exactly
    a binomial proportion, the verdict comes when the Clopper-Pearson lower bound of x successes in n clears 0.6, and
    the power at n is P(Bin(n, 0.85) >= the smallest such x). By that sum: 0.744 at 23, 0.713 at 24, 0.682 at 25,
    0.815 at 26, 0.790 at 27 (a sawtooth: each n that adds a success needed lowers it), so 26 seeds, and an n
    past it can fall short again. The simulation must find 26 and follow the sawtooth."""

    def exact(n: int) -> float:
        lower = _clopper_pearson(np.arange(n + 1), n, 0.95)[0]
        need = np.nonzero(lower > 0.6)[0]
        return float(stats.binom.sf(need[0] - 1, n, 0.85)) if len(need) else 0.0

    assert [round(exact(n), 3) for n in (23, 24, 25, 26, 27)] == [0.744, 0.713, 0.682, 0.815, 0.790]
    c = stats.norm.ppf(0.15)  # P(N(0, 1) > c) = 0.85
    rule = Rule("greater_by", margin=0.1, statistic="superiority")
    plan = seeds_for_power(normal(0.0, 1.0), c, rule, experiments=20_000)
    assert plan.seeds == 26 and plan.seeds_range == (26, 26)
    for n, p in plan.curve.items():
        assert abs(p - exact(n)) < 4 * np.sqrt(max(exact(n) * (1 - exact(n)), 1e-4) / 20_000), n


def test_the_break_rate_endpoints_power_by_enumeration():
    """A breaks with probability 0.6, B never: at 8 seeds each, the `rate` rule `greater` reaches "reproduced" for
    each count k of A's breaks whose Newcombe interval against 0 of 8 lies above 0; the power is the binomial
    probability of those k."""
    rule = Rule("greater", statistic="rate")
    ks = [k for k in range(9) if rate_difference_interval([1] * k + [0] * (8 - k), [0] * 8)[1] > 0]
    exact = float(stats.binom.pmf(ks, 8, 0.6).sum())
    est = power(lambda rng, size: (rng.random(size) < 0.6).astype(float), lambda rng, size: np.zeros(size), 8, rule)
    assert abs(est.power - exact) < 4 * est.se and est.seeds == (8, 8)


def test_the_closed_form_replication_seeds_agree_with_the_simulation():
    """`replication_seeds` (a report's normal approximation for a `superiority` part) against this simulation on the
    same eight observed seeds per arm, resampled: within the simulation's Monte Carlo range, give or take one."""
    rng = np.random.default_rng(4)
    a, b = rng.normal(0.30, 0.03, 8), SHAPES["breaks_low"].draw(rng, 8)
    rule = Rule("greater_by", margin=0.1, statistic="superiority")
    plan = seeds_for_power(resample(a), resample(b), rule)
    low, high = plan.seeds_range
    assert low - 1 <= replication_seeds(a, b, rule) <= high + 1


def test_power_on_fitted_shapes_and_bad_input():
    """A `steady` arm against `breaks_low` (20% breaks, the same unbroken mean when shifted by 0.045): at 16 seeds,
    P(A > B) = 0.8 * 0.5 + 0.2 = 0.6 is right on a 0.1 margin, so "reproduced" comes about 2.5% of the time at most
    (the interval's one-sided error), and less for an interval this conservative."""
    rule = Rule("greater_by", margin=0.1, statistic="superiority")
    at_margin = power(from_shape(SHAPES["steady"]), from_shape(SHAPES["breaks_low"], shift=0.045), 16, rule)
    assert at_margin.power <= 0.03
    assert power(from_shape(SHAPES["steady"]), from_shape(SHAPES["tight"]), 2, rule).power == 0.0  # < min_seeds
    with pytest.raises(ValueError, match="toward"):
        power(from_shape(SHAPES["steady"]), 0.2, 8, rule, toward="inconclusive")
    with pytest.raises(ValueError, match="at least 2"):
        resample([0.3, np.nan])
