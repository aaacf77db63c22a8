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
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from analysis.testbed_map import DEFAULT_MAP, Map
from analysis.verdicts import SMALLER, Rule, decide, interval_function

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "findings" / "suite.yaml"
MEAN, SD, BREAK_RATE = 0.27, 0.03, 0.16
MARGIN = 0.02
EXPERIMENTS = 20_000  # Monte Carlo standard error: 0.15 points of coverage, 0.11 of a 2.5% rate


def suite_pairs(path: Path) -> set[tuple[int, int]]:
    """(seeds in A, seeds in B) of every part of the suite file; B = 0 for a part against a constant."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    n_all = len(raw["seeds"])
    per_arm = raw.get("arm_seeds") or {}
    pairs = set()
    for claim in raw["claims"]:
        for part in claim.get("parts", []):
            n_a = per_arm.get(part["a"], n_all)
            n_b = per_arm.get(part["b"], n_all) if isinstance(part["b"], str) else 0
            if part.get("rule", {}).get("statistic", "mean") == "mean":
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
