"""Coverage of the findings' intervals at every seed pair the suite and the testbed map use (`pytest -k coverage`).

Simulated experiments go through the very functions a report uses (`interval_function` for a rule's statistic,
`decide` for its verdict), on two kinds of per-seed data, both at the spread the suites measured:
- normal: final held-out accuracy 0.27 with a per-seed standard deviation of 0.03 (suite v6: 0.032 pooled within
  arms over its runs that did not break);
- a mixture: the same, except that a run breaks with probability 0.16 (suite v6: 17 of its 104 runs broke) and then
  ends uniformly between 0 and 0.1.
Each must cover the true difference of means (for a part against a constant: the true median minus the constant)
at least 93% of the time, and with the true difference exactly on a
`greater_by` margin, the verdict "smaller than claimed" must come at most 3% of the time. The percentile bootstrap
of suites v1-v6 fails both (about 80% coverage at 3 vs 3 seeds, 91% at 8 vs 8).

Below those, the arm shapes this testbed makes (analysis/arm_shapes.py, fitted to v7's and the map's runs): one arm
breaking to ~0 in 12-67% of its runs against one that never breaks, both breaking, tight against wide. Welch's
interval fails there (pinned by a test); the `superiority` statistic is tested on every shape pair, seed pair and
verdict boundary.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import optimize, stats

from analysis.arm_shapes import BROKEN_AT_ZERO, BROKEN_MAX, SHAPES, fit
from analysis.testbed_map import DEFAULT_MAP, Map
from analysis.verdicts import SMALLER, Rule, decide, interval_function, superiority_interval

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "findings" / "suite.yaml"
MEAN, SD, BREAK_RATE = 0.27, 0.03, 0.16
MARGIN = 0.02
EXPERIMENTS = 20_000  # Monte Carlo standard error: 0.15 points of coverage, 0.11 of a 2.5% rate


def suite_pairs(path: Path, statistics: tuple[str, ...] = ("mean",)) -> set[tuple[int, int]]:
    """(seeds in A, seeds in B) of every part of the suite file whose rule's statistic is one of `statistics`; B = 0
    for a part against a constant."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    n_all = len(raw["seeds"])
    per_arm = raw.get("arm_seeds") or {}
    pairs = set()
    for claim in raw["claims"]:
        for part in claim.get("parts", []):
            n_a = per_arm.get(part["a"], n_all)
            n_b = per_arm.get(part["b"], n_all) if isinstance(part["b"], str) else 0
            if part.get("rule", {}).get("statistic", "mean") in statistics:
                pairs.add((n_a, n_b))
    return pairs


def map_pairs() -> set[tuple[int, int]]:
    m = Map.load(DEFAULT_MAP)
    n = {(c.sweep, c.dose, c.objective): len(c.seeds) for c in m.cells()}
    pairs = set()
    for name, rule in m.rules.items():
        sweep = m.sweeps[name]
        for dose in sweep["doses"]:
            if "objective" in rule:
                pairs.add((n[name, dose, rule["objective"]], n[name, str(sweep["reference"]), rule["objective"]]))
            else:
                pairs.add((n[name, dose, rule["a"]], n[name, dose, rule["b"]]))
    return pairs


PAIRS = sorted(suite_pairs(SUITE) | map_pairs())


def draw(rng: np.random.Generator, n: int, shift: float, break_rate: float) -> np.ndarray:
    x = rng.normal(MEAN + shift, SD, size=(EXPERIMENTS, n))
    broke = rng.random((EXPERIMENTS, n)) < break_rate
    return np.where(broke, rng.uniform(0.0, 0.1, size=(EXPERIMENTS, n)), x)


def simulate(n_a: int, n_b: int, break_rate: float, seed: int) -> tuple[float, float]:
    """(coverage of the true difference, rate of "smaller than claimed") with the true difference of means on the
    margin of a `greater_by` rule."""
    rng = np.random.default_rng(seed)
    shift = MARGIN / (1 - break_rate)  # the breaks dilute a shift of the unbroken runs' mean
    rule = Rule("greater_by", margin=MARGIN)
    fn, _ = interval_function(rule.statistic, b_constant=n_b == 0)
    a = draw(rng, n_a, shift, break_rate)
    if n_b == 0:  # against a constant: the statistic is A's median, the constant MARGIN below its true median
        big = draw(np.random.default_rng(1), 100, shift, break_rate).ravel()  # 2 million draws
        b = np.full((EXPERIMENTS, n_a), float(np.median(big)) - MARGIN)
    else:
        b = draw(rng, n_b, 0.0, break_rate)
    _, lo, hi = fn(a, b)  # every experiment at once: the function works over the last axis
    covered = int(np.sum((lo <= MARGIN) & (MARGIN <= hi)))
    smaller = sum(decide(x, y, rule, (n_a, n_b or n_a))[0] == SMALLER for x, y in zip(lo, hi, strict=True))
    return covered / EXPERIMENTS, smaller / EXPERIMENTS


@pytest.mark.parametrize("break_rate", [0.0, BREAK_RATE], ids=["normal", "mixture"])
@pytest.mark.parametrize("pair", PAIRS, ids=[f"{a}v{b}" for a, b in PAIRS])
def test_coverage_of_the_rules_interval_at_every_seed_pair_used(pair, break_rate):
    coverage, smaller = simulate(*pair, break_rate, seed=hash(pair) % 2**32)
    assert coverage >= 0.93, f"{pair}: the 95% interval covered {coverage:.3f}"
    assert smaller <= 0.03, f"{pair}: 'smaller than claimed' {smaller:.3f} with the true effect on the margin"


def test_coverage_pairs_include_every_conclusion_cell_of_the_map():
    assert (8, 8) in PAIRS
    assert all(min(p) >= 2 or p[1] == 0 for p in PAIRS)


# --- the shapes this testbed makes (issue 60) --------------------------------------------------------------------
# The two kinds of data above are one distribution for both arms. This testbed's arms differ in shape: some never
# break and are tight (s.d. 0.007), others break in 17-67% of their runs to ~0 (analysis/arm_shapes.py, fitted to v7's
# and the map's runs). Each pair below is simulated at the seed pairs 5v5, 6v6, 8v8, 16v16 and every two-arm pair
# the suite and the map use. The bar, for a statistic used on such arms: coverage of the true effect >= 93%, and
# the interval wholly on one side of the true effect (a wrong verdict at a boundary placed there) <= 3% per side.

SHAPE_EXPERIMENTS = 10_000  # Monte Carlo standard error: 0.25 points of coverage, 0.17 of a 3% rate
SHAPE_PAIRS = [  # (A, B)
    ("breaks_low", "tight"),  # the pair: a breaking arm (20%) against a tight one
    ("tight", "breaks_low"),  # the same with the tight arm as A
    ("tight", "breaks_half"),  # unequal break rates, 0 vs 0.5
    ("steady", "breaks_most"),  # 0 vs 0.67
    ("breaks_low", "breaks_half"),  # both breaking
    ("breaks_half", "breaks_most"),
    ("rare_break", "steady"),  # one break in 8 from a tight body (overall s.d. 0.10)
    ("wide", "tight"),  # no breaks, unequal spreads
    ("steady", "steady"),
]
NO_BREAKS = [p for p in SHAPE_PAIRS if SHAPES[p[0]].break_rate == 0 and SHAPES[p[1]].break_rate == 0]
USED = suite_pairs(SUITE, ("mean", "superiority")) | map_pairs()
SEED_PAIRS = sorted({(5, 5), (6, 6), (8, 8), (16, 16)} | {p for p in USED if p[1] > 0})


def one_sided(lo: np.ndarray, hi: np.ndarray, truth: float) -> tuple[float, float, float]:
    """(coverage, share of intervals wholly above the truth, share wholly below)."""
    return float(np.mean((lo <= truth) & (truth <= hi))), float(np.mean(lo > truth)), float(np.mean(hi < truth))


def welch_on_shapes(pair: tuple[str, str], seeds: tuple[int, int]) -> tuple[float, float, float]:
    """The v7 method (`statistic: mean`, Welch's t) on a shape pair at the shapes' fitted means. Moving an arm that
    never breaks moves the interval with the effect, so for such an arm one placement stands for every verdict
    boundary; a breaking arm's miss grows with the distance from its unbroken runs down to its breaks."""
    a_shape, b_shape = SHAPES[pair[0]], SHAPES[pair[1]]
    rng = np.random.default_rng(sum(map(ord, "".join(pair))) * 1000 + 10 * seeds[0] + seeds[1])
    a = a_shape.draw(rng, (SHAPE_EXPERIMENTS, seeds[0]))
    b = b_shape.draw(rng, (SHAPE_EXPERIMENTS, seeds[1]))
    fn, _ = interval_function("mean", b_constant=False)
    _, lo, hi = fn(a, b)
    return one_sided(lo, hi, a_shape.true_mean() - b_shape.true_mean())


@pytest.mark.parametrize("pair", [("breaks_low", "tight"), ("rare_break", "steady")], ids=lambda p: f"{p[0]}-{p[1]}")
@pytest.mark.parametrize("seeds", [(5, 5), (6, 6), (6, 5), (6, 8), (8, 8)], ids=lambda s: f"{s[0]}v{s[1]}")
def test_welch_fails_on_a_breaking_arm_against_a_tight_one(seeds, pair):
    """Pinned: the v7 method misses on one side far beyond 2.5% when arm A breaks to ~0 and arm B does not. A's seeds
    show no break 0.8^6 = 26% of the time at 6 seeds (20% breaks), its interval is then narrow around the unbroken
    mean, and the true mean, breaks included, lies below it. Measured at 10,000 experiments: `breaks_low` (20%
    breaks, unbroken 0.20 +- 0.045) against `tight` covered 0.90-0.91 with 7.6-9.2% of intervals wholly above the
    truth; `rare_break` (1 in 8, unbroken 0.283 +- 0.02, the map's PG-IS) against `steady` 0.74-0.85 with 15-28%
    (the issue's 84-86% and 14-15% lie between: the miss grows with the distance from the unbroken runs down to
    the breaks). A "reproduced" call with the breaking arm as A carries that error, not 2.5%. Welch holds only
    where no arm breaks (next test); `statistic: superiority` holds on all of these."""
    coverage, above, below = welch_on_shapes(pair, seeds)
    assert coverage < 0.92, f"{pair} {seeds}: Welch covered {coverage:.3f}: the failure the issue reported is gone"
    assert above > 0.07, f"{pair} {seeds}: Welch's one-sided miss {above:.3f}"


SUITE_TWO_ARM = sorted(p for p in suite_pairs(SUITE, ("mean", "superiority")) if p[1] > 0)


@pytest.mark.parametrize("pair", [("breaks_low", "tight"), ("rare_break", "steady")], ids=lambda p: f"{p[0]}-{p[1]}")
@pytest.mark.parametrize("seeds", SUITE_TWO_ARM, ids=lambda s: f"{s[0]}v{s[1]}")
def test_welch_fails_the_bar_at_every_seed_pair_of_the_suite(seeds, pair):
    """The v7 method at the suite's own seed pairs (v8: 8v8 to 16v16): with more seeds a 20% breaking arm shows a
    break more often and coverage nears 93%, but its interval still lies wholly above the truth 4.7-6.3% of the
    time against a tight arm (the bar: 3%), and 10-20% for the map's PG-IS shape; `superiority` holds at all of
    them (test_superiority_holds_on_the_testbeds_shapes_at_every_boundary)."""
    coverage, above, below = welch_on_shapes(pair, seeds)
    assert coverage < 0.93 or max(above, below) > 0.03, f"{pair} {seeds}: Welch met the bar {coverage:.3f}"


@pytest.mark.parametrize("seeds", SEED_PAIRS, ids=lambda s: f"{s[0]}v{s[1]}")
@pytest.mark.parametrize("pair", NO_BREAKS, ids=lambda p: f"{p[0]}-{p[1]}")
def test_welch_holds_where_no_arm_breaks(pair, seeds):
    coverage, above, below = welch_on_shapes(pair, seeds)
    assert coverage >= 0.93, f"{pair} {seeds}: Welch covered {coverage:.3f}"
    assert max(above, below) <= 0.03, f"{pair} {seeds}: one-sided misses {above:.3f} above, {below:.3f} below"


def test_the_shapes_fit_their_runs():
    """`fit` by hand: 1 of 4 runs broke; the other three are 0.2, 0.3, 0.4 (mean 0.3, s.d. 0.1)."""
    shape = fit([0.2, 0.3, 0.0, 0.4, np.nan], [0, 0, 1, 0, 0])
    assert shape.break_rate == 0.25 and shape.mean == pytest.approx(0.3) and shape.sd == pytest.approx(0.1)
    x = SHAPES["breaks_half"].draw(np.random.default_rng(0), 200_000)
    assert np.mean(x == 0) == pytest.approx(0.5 * BROKEN_AT_ZERO, abs=0.005)
    assert x.mean() == pytest.approx(SHAPES["breaks_half"].true_mean(), abs=0.001)
    assert [s.break_rate for s in SHAPES.values()] == [0, 0, 0, 0.125, 0.2, 0.5, 0.67]  # 0 to ~0.67, as observed


# --- superiority: P(A > B) + P(A = B)/2 - 1/2 against its true value -------------------------------------------
MARGINS = (0.1,)  # superiority margins simulated; a suite file's superiority margin must be one of them
BOUNDARIES = sorted({0.0} | {s * m for m in MARGINS for s in (-1, 1)})  # every verdict boundary of those rules
BODY = (0.12, 0.40)  # where a placed arm's unbroken runs may sit (observed: 0.15-0.31; breaks end below 0.1)


def superiority_of(a: np.ndarray, b: np.ndarray) -> float:
    """P(A > B) + P(A = B)/2 - 1/2 over every pair of two large draws, `b` sorted (exact for the draws)."""
    return float((np.searchsorted(b, a, "left") + np.searchsorted(b, a, "right")).mean() / (2 * len(b)) - 0.5)


@functools.cache
def placed(pair: tuple[str, str], boundary: float | None) -> tuple[float, float] | None:
    """(shift of A's unbroken runs, true effect there) with the true effect on `boundary` (None: no shift, the
    fitted means), or None where no shift keeps A's unbroken runs inside BODY (a breaking A cannot beat a tight B in
    more than its unbroken share). The shift is found on one draw of 200,000 per arm; the truth is measured on
    another of 2 million."""
    a_shape, b_shape = SHAPES[pair[0]], SHAPES[pair[1]]
    big = np.random.default_rng(2)
    if boundary is None:
        return 0.0, superiority_of(a_shape.draw(big, 1_000_000), np.sort(b_shape.draw(big, 1_000_000)))
    rng = np.random.default_rng(1)
    n = 100_000
    b = np.sort(b_shape.draw(rng, n))
    z, broke = rng.standard_normal(n), rng.random(n) < a_shape.break_rate
    low = np.where(rng.random(n) < BROKEN_AT_ZERO, 0.0, rng.uniform(0.0, BROKEN_MAX, n))

    def off(shift: float) -> float:
        a = np.where(broke, low, a_shape.mean + shift + a_shape.sd * z)
        return superiority_of(a, b) - boundary

    lo, hi = BODY[0] - a_shape.mean, BODY[1] - a_shape.mean
    if off(lo) * off(hi) > 0:
        return None
    shift = optimize.brentq(off, lo, hi, xtol=1e-4)
    truth = superiority_of(a_shape.draw(big, 1_000_000, shift), np.sort(b_shape.draw(big, 1_000_000)))
    return shift, truth


def superiority_on_shapes(pair: tuple[str, str], seeds: tuple[int, int], shift: float, truth: float):
    a_shape, b_shape = SHAPES[pair[0]], SHAPES[pair[1]]
    rng = np.random.default_rng(hash((pair, seeds, round(shift, 6))) % 2**32)
    a = a_shape.draw(rng, (SHAPE_EXPERIMENTS, seeds[0]), shift)
    b = b_shape.draw(rng, (SHAPE_EXPERIMENTS, seeds[1]))
    fn, _ = interval_function("superiority", b_constant=False)
    _, lo, hi = fn(a, b)
    return one_sided(lo, hi, truth)


@pytest.mark.parametrize("seeds", SEED_PAIRS, ids=lambda s: f"{s[0]}v{s[1]}")
@pytest.mark.parametrize("pair", SHAPE_PAIRS, ids=lambda p: f"{p[0]}-{p[1]}")
def test_superiority_holds_on_the_testbeds_shapes_at_every_boundary(pair, seeds):
    """The true P(A > B) placed on each verdict boundary (0 and +-margin) by moving A's unbroken runs, and at the
    fitted means: the interval covers it >= 93% of the time and lies wholly on one side of it <= 3% of the time, per
    side. A boundary no placement reaches (an arm that never breaks against one that breaks in 67% of its runs
    beats it in at least 67% of pairs) is left out; it is never the truth there."""
    places = [(b, placed(pair, b)) for b in BOUNDARIES]
    places = [(b, p) for b, p in places if p is not None]
    if pair != ("steady", "breaks_most"):
        assert len(places) >= 1, f"{pair}: no boundary reachable"
    for boundary, (shift, truth) in [*places, (None, placed(pair, None))]:
        assert boundary is None or truth == pytest.approx(boundary, abs=0.003)
        coverage, above, below = superiority_on_shapes(pair, seeds, shift, truth)
        where = f"{pair} {seeds[0]}v{seeds[1]} at P(A>B) - 1/2 = {truth:+.3f}"
        assert coverage >= 0.93, f"{where}: covered {coverage:.3f}"
        assert max(above, below) <= 0.03, f"{where}: wholly above {above:.3f}, wholly below {below:.3f}"


@pytest.mark.parametrize("n", sorted({5, 6, 8} | {p[0] for p in USED if p[1] == 0}))
@pytest.mark.parametrize("shape", ["breaks_low", "breaks_half", "breaks_most", "rare_break", "steady"])
def test_superiority_against_a_constant_holds_at_every_boundary(shape, n):
    """A part against a constant c: P(A > c) + P(A = c)/2 - 1/2, c placed at the quantile that puts the truth on
    each boundary."""
    draw = SHAPES[shape].draw
    big = draw(np.random.default_rng(3), 2_000_000)
    fn, _ = interval_function("superiority", b_constant=True)
    for boundary in BOUNDARIES:
        c = float(np.quantile(big, 0.5 - boundary))
        truth = float(np.mean(big > c) + 0.5 * np.mean(big == c) - 0.5)
        _, lo, hi = fn(draw(np.random.default_rng(n), (SHAPE_EXPERIMENTS, n)), np.full((SHAPE_EXPERIMENTS, n), c))
        coverage, above, below = one_sided(lo, hi, truth)
        assert coverage >= 0.93 and max(above, below) <= 0.03, (shape, n, truth, coverage, above, below)


def test_every_superiority_margin_of_the_suite_is_simulated():
    raw = yaml.safe_load(SUITE.read_text(encoding="utf-8"))
    for claim in raw["claims"]:
        for part in claim.get("parts", []):
            rule = part.get("rule", {})
            if rule.get("statistic") == "superiority":
                assert rule.get("margin", 0.0) in (0.0, *MARGINS), f"claim {claim['id']}: add its margin to MARGINS"


def brunner_munzel_interval(a: np.ndarray, b: np.ndarray, confidence: float = 0.95):
    """The Brunner-Munzel t interval of P(A > B) + P(A = B)/2 - 1/2 (Brunner and Munzel 2000), over the last axis:
    the same estimate as `superiority`, its variance estimated from the placements of each arm's seeds among the
    other's, Student's t on the Brunner-Munzel (Welch-Satterthwaite) degrees of freedom. For reference only: it is
    what the suite does not use (next test)."""
    gt = 0.5 + 0.5 * np.sign(a[..., :, None] - b[..., None, :])
    n_a, n_b = a.shape[-1], b.shape[-1]
    p = gt.mean(axis=(-2, -1))
    v_a, v_b = gt.mean(axis=-1).var(axis=-1, ddof=1) / n_a, gt.mean(axis=-2).var(axis=-1, ddof=1) / n_b
    with np.errstate(divide="ignore", invalid="ignore"):
        df = (v_a + v_b) ** 2 / (v_a**2 / (n_a - 1) + v_b**2 / (n_b - 1))
    df = np.where(np.isfinite(df), df, min(n_a, n_b) - 1)  # no spread in either arm's placements
    half = stats.t.ppf(0.5 + confidence / 2, df) * np.sqrt(v_a + v_b)
    return p - 0.5, p - half - 0.5, p + half - 0.5


def test_the_brunner_munzel_reference_matches_scipy():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=7), rng.normal(0.5, 2.0, size=9)
    effect, lo, hi = brunner_munzel_interval(a, b)
    level = stats.brunnermunzel(a, b).pvalue  # the interval just reaches 0 at that level
    _, lo_p, hi_p = brunner_munzel_interval(a, b, confidence=1 - level)
    assert min(abs(lo_p), abs(hi_p)) == pytest.approx(0.0, abs=1e-9)
    assert lo < effect < hi


@pytest.mark.parametrize("seeds", [(6, 6), (8, 8), (16, 16)], ids=lambda s: f"{s[0]}v{s[1]}")
def test_the_brunner_munzel_t_interval_fails_the_bar(seeds):
    """Pinned: why `superiority` does not estimate the variance from the seeds. Two `steady` arms with the true
    P(A > B) on a greater_by 0.1 boundary (0.6): the Brunner-Munzel interval lies wholly above the truth (a false
    "reproduced") 3.7-5.9% of the time at 5-16 seeds. `wide` against `tight` at the fitted means (P = 0.047): every
    seed of A lies below every seed of B in most experiments, the estimated variance is then 0, the interval a point
    at P_hat = 0, and it misses from below 40-73% of the time (coverage 0.27-0.60). `superiority_interval` on the
    same draws: <= 0.6% on either side."""
    worst = 0.0
    for pair, boundary in ((("steady", "steady"), 0.1), (("wide", "tight"), None)):
        shift, truth = placed(pair, boundary)
        rng = np.random.default_rng(11)
        a = SHAPES[pair[0]].draw(rng, (SHAPE_EXPERIMENTS, seeds[0]), shift)
        b = SHAPES[pair[1]].draw(rng, (SHAPE_EXPERIMENTS, seeds[1]))
        _, lo, hi = brunner_munzel_interval(a, b)
        worst = max(worst, *one_sided(lo, hi, truth)[1:])
        _, lo, hi = superiority_interval(a, b)
        assert max(one_sided(lo, hi, truth)[1:]) <= 0.03
    assert worst > 0.04, f"Brunner-Munzel's worst one-sided miss {worst:.3f}"
