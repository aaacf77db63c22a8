"""What suite v5 was expected to decide, written before its runs (CALIBRATION.md section 21).

A pilot, not a verdict: for each repetition, draw 5 seeds per arm with replacement from the 6 suite-v4 runs per arm
that machines A and B made (findings/v4/machine_a/runs.csv, findings/v4/runs.csv), apply v5's rules (v4's parts
with `greater` at a margin above 0 read as `greater_by`), and count the claims decided. Drawing from 6 values
repeats some, which narrows the intervals: the numbers lean optimistic.

    PYTHONPATH=. python findings/calib/plan_suite_v5.py [--seeds 5] [--reps 200]
"""

from __future__ import annotations

import argparse
import csv
from collections import Counter
from pathlib import Path

import numpy as np
import yaml

from analysis.verdicts import INCONCLUSIVE, Rule, combine, decide, effect_interval

V4 = Path(__file__).resolve().parents[1] / "v4"  # suite v4: its suite.yaml, its runs.csv and machine A's


def per_arm() -> dict[tuple[str, str], np.ndarray]:
    values: dict[tuple[str, str], list[float]] = {}
    for path in (V4 / "machine_a" / "runs.csv", V4 / "runs.csv"):
        for row in csv.DictReader(path.open()):
            for key, v in row.items():
                if key not in ("arm", "seed", "status", "run_dir", "error"):
                    values.setdefault((row["arm"], key), []).append(float(v) if v else np.nan)
    return {k: np.array([x for x in v if np.isfinite(x)]) for k, v in values.items()}


def v5_rule(rule: dict) -> Rule:
    kind = "greater_by" if rule["kind"] == "greater" and rule.get("margin", 0) > 0 else rule["kind"]
    return Rule(kind, rule.get("margin", 0.0))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--reps", type=int, default=200)
    args = p.parse_args()
    pool, rng = per_arm(), np.random.default_rng(1)
    claims = [c for c in yaml.safe_load((V4 / "suite.yaml").read_text())["claims"] if "parts" in c]
    verdicts: dict[int, Counter] = {c["id"]: Counter() for c in claims}
    decided = Counter()
    for _ in range(args.reps):
        drawn: dict[tuple[str, str], np.ndarray] = {}  # one draw per arm and metric, shared by the claims
        n = 0
        for c in claims:
            parts = []
            for part in c["parts"]:
                a = drawn.setdefault(
                    (part["a"], part["metric"]), rng.choice(pool[part["a"], part["metric"]], args.seeds)
                )
                if isinstance(part["b"], str):
                    b = drawn.setdefault(
                        (part["b"], part["metric"]), rng.choice(pool[part["b"], part["metric"]], args.seeds)
                    )
                else:
                    b = np.full(args.seeds, float(part["b"]))
                _, lo, hi = effect_interval(a, b, resamples=1000)
                parts.append(decide(lo, hi, v5_rule(part["rule"]))[0])
            verdict = combine(parts)
            verdicts[c["id"]][verdict] += 1
            n += verdict != INCONCLUSIVE
        decided[n] += 1
    for cid, counts in verdicts.items():
        print(f"claim {cid}: {dict(counts)}")
    mean = sum(k * v for k, v in decided.items()) / args.reps
    at_least_5 = sum(v for k, v in decided.items() if k >= 5) / args.reps
    print(f"claims decided per repetition: {sorted(decided.items())}; mean {mean:.2f}; P(>= 5) {at_least_5:.2f}")


if __name__ == "__main__":
    main()
