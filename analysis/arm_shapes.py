"""The shapes of this testbed's arms: how a seed's final held-out accuracy is distributed, fitted to suite v7's runs
(findings/runs.csv, 98 runs in 16 arms) and the testbed map's (findings/map/runs.csv, 120 runs in 28 cells).

An arm's per-seed values are a mixture: with probability `break_rate` the run breaks and ends near 0 (in a share
BROKEN_AT_ZERO exactly at 0, otherwise uniform on (0, BROKEN_MAX)); otherwise it ends normal with `mean` and `sd`.
The coverage test (tests/test_coverage.py) draws simulated experiments from these shapes, and the power analysis
(analysis/power.py) plans seeds on them. `fit` fits one arm's runs the same way.

What the runs show (unbroken s.d. is the s.d. of the runs that did not break; overall s.d. includes the breaks):

| arm or cell (runs)                          | breaks | unbroken mean | unbroken s.d. | overall s.d. |
|---------------------------------------------|--------|---------------|---------------|--------------|
| v7 ref_m (6)                                | 0/6    | 0.297         | 0.0074        | 0.0074       |
| map mismatch none pg_is (8)                 | 0/8    | 0.302         | 0.0050        | 0.0050       |
| map offpolicy 1 dppo_tv (4)                 | 0/4    | 0.313         | 0.0059        | 0.0059       |
| v7 dppo_kl_recompute_m (5)                  | 0/5    | 0.245         | 0.0104        | 0.0104       |
| v7 relax_both_o (8), relax_low_o (5)        | 0      | 0.245, 0.249  | 0.028, 0.030  | same         |
| map offpolicy 8 dppo_tv (8)                 | 0/8    | 0.260         | 0.023         | 0.023        |
| v7 grpo_o (8), penalty_kl_o (5)             | 0      | 0.204, 0.232  | 0.055, 0.051  | same         |
| map pg_is noise_1, w4a4, offpolicy 4 (8)    | 1/8    | 0.282-0.285   | 0.015-0.025   | 0.101-0.103  |
| v7 dppo_kl_m (6), drpo_m (6), mask_neg_m (6) | 1/6    | 0.174-0.197   | 0.028-0.043   | 0.080-0.087  |
| v7 drpo015_o (6), drpo_o (5)                | 1/6, 1/5 | 0.212, 0.204 | 0.030, 0.070  | 0.056, 0.110 |
| v7 pg_is_m (8)                              | 2/8    | 0.217         | 0.047         | 0.108        |
| v7 grpo_m (5), dppo_m (8)                   | 2/5, 4/8 | 0.174, 0.154 | 0.033, 0.041 | 0.064, 0.072 |
| map pg_is noise_2 (8), offpolicy 8 (8)      | 3/8    | 0.218, 0.204  | 0.021, 0.069  | 0.114, 0.107 |
| v7 pg_tis_m (5), drpo_no_absadv015_o (6)    | 3/5, 4/6 | 0.173, 0.178 | 0.051, 0.058 | 0.090, 0.070 |
| map pg_is offpolicy 16 (8)                  | 5/8    | 0.150         | 0.057         | 0.069        |

Broken runs: 6 of v7's 20 end at exactly 0.000 and 13 of the other 14 below 0.1 (the highest 0.160); 11 of the
map's 33 at 0.000, and all but the collapsed-by-reward runs of the noise-4 dose (where every objective broke) below
0.1. The lowest unbroken run in either file is 0.108. Cells of 2-3 seeds (the map's screening) are left out of the
presets; the map's noise-4 cells (every run broke) have no unbroken spread to fit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

BROKEN_AT_ZERO = 0.4  # share of broken runs that end at exactly 0 (v7: 6 of 20; the map: 11 of 33)
BROKEN_MAX = 0.1  # the other broken runs end uniformly on (0, BROKEN_MAX)


@dataclass(frozen=True)
class Shape:
    break_rate: float  # probability that a run breaks
    mean: float  # mean of the runs that do not break
    sd: float  # standard deviation of the runs that do not break

    def draw(self, rng: np.random.Generator, size: int | tuple[int, ...], shift: float = 0.0) -> np.ndarray:
        """Per-seed values; `shift` moves the unbroken runs only (a better arm breaks to ~0 all the same)."""
        ok = rng.normal(self.mean + shift, self.sd, size)
        broken = np.where(rng.random(size) < BROKEN_AT_ZERO, 0.0, rng.uniform(0.0, BROKEN_MAX, size))
        return np.where(rng.random(size) < self.break_rate, broken, ok)

    def true_mean(self, shift: float = 0.0) -> float:
        return (1 - self.break_rate) * (self.mean + shift) + self.break_rate * (1 - BROKEN_AT_ZERO) * BROKEN_MAX / 2


# Presets, rounded from the table above. Each names the arms it stands for.
SHAPES: dict[str, Shape] = {
    # v7 ref_m (s.d. 0.0074), the map's mu = pi PG-IS (0.0050) and 1-update DPPO-TV (0.0059): no breaks, tight.
    "tight": Shape(0.0, 0.297, 0.007),
    # v7 relax_both_o / relax_low_o (0.028 / 0.030), the map's 8-update DPPO-TV (0.023): no breaks.
    "steady": Shape(0.0, 0.245, 0.03),
    # v7 grpo_o (0.055), penalty_kl_o (0.051): no breaks, the widest unbroken arms.
    "wide": Shape(0.0, 0.204, 0.055),
    # The map's PG-IS at sigma 1, W4A4 and 4 updates: 1 of 8 breaks from a tight body (overall s.d. 0.10).
    "rare_break": Shape(0.125, 0.283, 0.02),
    # v7 dppo_kl_m, drpo_m, mask_neg_m, drpo015_o (1/6), drpo_o (1/5), pg_is_m (2/8): 17-25% breaks.
    "breaks_low": Shape(0.2, 0.20, 0.045),
    # v7 dppo_m (4/8), grpo_m (2/5); the map's PG-IS at sigma 2 and 8 updates (3/8).
    "breaks_half": Shape(0.5, 0.18, 0.045),
    # v7 drpo_no_absadv015_o (4/6), pg_tis_m (3/5); the map's PG-IS at 16 updates (5/8).
    "breaks_most": Shape(0.67, 0.165, 0.06),
}


def fit(values: ArrayLike, broke: ArrayLike) -> Shape:
    """One arm's shape from its finished runs' values and 0/1 break flags (NaN values dropped): the break rate, and
    the mean and s.d. of the runs that did not break (NaN where fewer than 2 did)."""
    values, broke = np.asarray(values, dtype=float), np.asarray(broke, dtype=float)
    keep = np.isfinite(values) & np.isfinite(broke)
    values, broke = values[keep], broke[keep] > 0.5
    if not len(values):
        raise ValueError("fit: no finished runs")
    ok = values[~broke]
    mean = float(ok.mean()) if len(ok) else float("nan")
    sd = float(ok.std(ddof=1)) if len(ok) >= 2 else float("nan")
    return Shape(float(broke.mean()), mean, sd)
