"""How many seeds per arm would the suite's rule need at lr 1e-4? A planning analysis of runs already made, not a
verdict (CALIBRATION.md section 9).

Suite v1's replications R1-R3 ran eight arms on 19 seeds each (seeds 0-2 in findings/v1/runs.csv, 3-18 in
findings/v1/seeds_3-18/runs.csv; lr 1e-4, the whole arith pool). Their final held-out accuracy is bimodal: a run
either keeps ~0.2 or collapses to ~0. This script
1. counts collapses per arm with exact (Clopper-Pearson) 95% intervals, and
2. estimates, for the suite comparisons among those arms (claims 1, 8 and 12), the probability that the suite's own rule
   (analysis.verdicts.compare: IQM difference, stratified bootstrap, the margins of suite.yaml) reaches a verdict
   other than inconclusive with n seeds per arm, by drawing n seeds per arm with replacement from the 19 measured
   ones. A normal-approximation sample size (verdicts.replication_seeds) assumes a unimodal spread; this does not.

Usage: python findings/calib/power.py [--trials 200]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from analysis.suite import Suite
from analysis.verdicts import CONTRADICTED, REPRODUCED, Rule, compare

ROOT = Path(__file__).resolve().parents[1] / "v1"
ARMS = ["pg_is", "pg_tis", "dppo", "dppo_kl", "no_mismatch", "grpo", "drpo", "drpo_2.5"]


def comparisons() -> list[tuple[int, str, str, str, Rule]]:
    """(claim, A, B, metric, rule) of every part of suite v1 whose two arms both have the 19 seeds."""
    return [
        (claim["id"], part["a"], part["b"], part["metric"], Rule(**part["rule"]))
        for claim in Suite.load(ROOT / "suite.yaml").claims
        for part in claim.get("parts", [])
        if part["a"] in ARMS and part["b"] in ARMS
    ]


SEEDS_PER_ARM = [3, 6, 10, 19, 30, 50]
ZERO = 0.05  # held-out accuracy below this counts as "ended at zero" (the warm start scores ~0.25)


def load() -> pd.DataFrame:
    df = pd.concat([pd.read_csv(ROOT / "runs.csv"), pd.read_csv(ROOT / "seeds_3-18" / "runs.csv")])
    df = df[df.arm.isin(ARMS) & (df.status == "completed")]
    assert df.groupby("arm").seed.nunique().eq(19).all(), "expected 19 seeds per arm"
    return df


def collapse_table(df: pd.DataFrame) -> None:
    print("| arm | seeds | collapsed (training reward) | 95% CI | held-out < 0.05 | 95% CI | mean held-out |")
    print("|---|---|---|---|---|---|---|")
    for arm in ARMS:
        d = df[df.arm == arm]
        n = len(d)
        cells = []
        for k in (int(d.collapsed.sum()), int((d.final_eval < ZERO).sum())):
            ci = stats.binomtest(k, n).proportion_ci(method="exact")
            cells += [f"{k} / {n}", f"[{ci.low:.2f}, {ci.high:.2f}]"]
        print(f"| {arm} | {n} | {' | '.join(cells)} | {d.final_eval.mean():.3f} |")


def decision_rates(df: pd.DataFrame, trials: int) -> None:
    print()
    print("| claim | comparison (rule) | " + " | ".join(f"n = {n}" for n in SEEDS_PER_ARM) + " |")
    print("|---|---|" + "---|" * len(SEEDS_PER_ARM))
    rng = np.random.default_rng(0)
    for claim, a, b, metric, rule in comparisons():
        va, vb = df[df.arm == a][metric].to_numpy(), df[df.arm == b][metric].to_numpy()
        cells = []
        for n in SEEDS_PER_ARM:
            verdicts = [
                compare(rng.choice(va, n).tolist(), rng.choice(vb, n).tolist(), rule).verdict for _ in range(trials)
            ]
            rep, con = verdicts.count(REPRODUCED) / trials, verdicts.count(CONTRADICTED) / trials
            cells.append(f"{rep + con:.2f} ({rep:.2f} / {con:.2f})")
        print(f"| {claim} | {a} vs {b}, {metric} ({rule.kind} {rule.margin:g}) | {' | '.join(cells)} |")
    print(f"\ncell: P(decided) (P(reproduced) / P(contradicted)) over {trials} draws per n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    args = parser.parse_args()
    df = load()
    collapse_table(df)
    decision_rates(df, args.trials)


if __name__ == "__main__":
    main()
