"""What would suite v4's design decide with n seeds per arm? A planning estimate from suite v4's three seeds, not a
verdict (CALIBRATION.md section 11, written before suite v5's runs).

For each arm and metric it draws n per-seed values by a smoothed bootstrap of v4's three seeds (a seed drawn with
replacement, plus normal noise of half that arm's spread over the three, so that three points stand for a
distribution), then applies the suite's own per-claim rule (analysis.findings.claim_entry: IQM difference,
stratified bootstrap, the margins of the suite file, parts combined) and counts how often each claim's verdict is
other than inconclusive. A seed keeps its values across metrics (one run), as in a real suite. Crude by design: an
arm that did not collapse in three seeds never collapses here, one that collapsed once does so a third of the time.

Usage: PYTHONPATH=. python findings/calib/plan_v5.py [--trials 200] [--n 3 4 5] [--suite-dir findings/v4]
(--suite-dir: the folder holding suite v4's suite.yaml and runs.csv)
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.findings import METRICS, claim_entry
from analysis.suite import Suite
from analysis.verdicts import INCONCLUSIVE


def draw(v4: pd.DataFrame, n: int, rng: np.random.Generator) -> pd.DataFrame:
    rows = []
    for arm, runs in v4.groupby("arm"):
        values = runs[list(METRICS)].to_numpy(dtype=float)
        spread = 0.5 * np.nanstd(values, axis=0, ddof=1)
        for seed in range(n):
            row = values[rng.integers(len(values))] + rng.normal(0.0, np.nan_to_num(spread))
            rows.append({"arm": arm, "seed": seed, "status": "completed", **dict(zip(METRICS, row, strict=True)),
                         "mismatch_abs_mean_step1": np.nan, "mismatch_abs_max_step1": np.nan})  # fmt: skip
    return pd.DataFrame(rows)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--n", type=int, nargs="+", default=[3, 4, 5])
    p.add_argument("--suite-dir", type=Path, default=Path("findings/v4"))
    args = p.parse_args()
    v4 = pd.read_csv(args.suite_dir / "runs.csv")
    claims = [c for c in Suite.load(args.suite_dir / "suite.yaml").claims if c.get("cpu", True)]
    rng = np.random.default_rng(0)
    print("| claim | " + " | ".join(f"n = {n}: P(decided) (reproduced / contradicted)" for n in args.n) + " |")
    print("|---|" + "---|" * len(args.n))
    table: dict[int, list[str]] = {c["id"]: [] for c in claims}
    expected = []
    for n in args.n:
        counts = {c["id"]: Counter() for c in claims}
        decided = 0
        for _ in range(args.trials):
            runs = draw(v4, n, rng)
            for c in claims:
                verdict = claim_entry(c, runs)["verdict"]
                counts[c["id"]][verdict] += 1
                decided += verdict != INCONCLUSIVE
        expected.append(decided / args.trials)
        for c in claims:
            k = counts[c["id"]]
            t = args.trials
            table[c["id"]].append(
                f"{1 - k[INCONCLUSIVE] / t:.2f} ({k['reproduced'] / t:.2f} / {k['contradicted'] / t:.2f})"
            )
    for cid, cells in table.items():
        print(f"| {cid} | " + " | ".join(cells) + " |")
    print("| expected claims decided (of 9) | " + " | ".join(f"{e:.1f}" for e in expected) + " |")


if __name__ == "__main__":
    main()
