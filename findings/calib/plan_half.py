"""How many seeds would suite v5's rules need to decide half its claims? A planning analysis (CALIBRATION.md
section 24), not a verdict: it reads runs already made and decides nothing about the claims.

The pool is every completed run of v5's setting (v4's base setting and arms): v4 on machines A and B (seeds 0-2),
v5 on its two machines (seeds 800-804), v5's replication R1 (claim 9's arms, seeds 810-825) and v4's replication
of claim 12 (`drpo`, `drpo_2.5`, seeds 3-26): 16 runs per arm, 32 or 40 for those arms. Unlike section 21's pilot
(six v4 runs per arm, none of them broken where v5's broke), it holds the broken runs the suites met.

Per comparison it prints the pooled effect with its interval and `replication_seeds` (normal approximation: it
reads collapses as variance, which the IQM partly trims, so it leans pessimistic for arms that break). Then, for a
design (seeds per arm), it repeats the suite: draw that many whole runs per arm with replacement from the pool,
apply the suite's parts and rules as written in findings/suite.yaml, and count the claims decided. Drawing many
seeds from 16 repeats runs, which narrows the intervals: those numbers lean optimistic.

    PYTHONPATH=. python findings/calib/plan_half.py [--reps 200] [--seeds 5] [--arm relax_low=16 ...]
"""

from __future__ import annotations

import argparse
import csv
from collections import Counter
from pathlib import Path

import numpy as np
import yaml

from analysis.verdicts import CONTRADICTED, INCONCLUSIVE, Rule, combine, decide, effect_interval, replication_seeds

FINDINGS = Path(__file__).resolve().parents[1]
POOL = [  # every runs.csv of this setting
    "v4/machine_a/runs.csv", "v4/runs.csv", "v5/first_machine/runs.csv", "v5/fresh_clone/runs.csv",
    "seeds_810-825/runs.csv", "v4/seeds_3-26/runs.csv",
    # Added for section 25 (suite v6's allocation); section 24's numbers are from the six files above.
    "seeds_830-853/runs.csv", "r3/runs.csv",
]  # fmt: skip
NOT_METRICS = ("arm", "seed", "status", "run_dir", "error")


def pooled_runs(names: list[str] = POOL) -> dict[str, list[dict[str, float]]]:
    """The completed runs of the runs.csv files `names` (relative to findings/), per arm."""
    runs: dict[str, list[dict[str, float]]] = {}
    for name in names:
        for row in csv.DictReader((FINDINGS / name).open()):
            if row["status"] == "completed":
                metrics = {k: float(v) if v else np.nan for k, v in row.items() if k not in NOT_METRICS}
                runs.setdefault(row["arm"], []).append(metrics)
    return runs


def values(runs: list[dict[str, float]], metric: str) -> np.ndarray:
    x = np.array([r[metric] for r in runs])
    return x[np.isfinite(x)]


def sides(part: dict, runs: dict[str, list[dict[str, float]]]) -> tuple[np.ndarray, np.ndarray]:
    a = values(runs[part["a"]], part["metric"])
    b = values(runs[part["b"]], part["metric"]) if isinstance(part["b"], str) else np.full(len(a), float(part["b"]))
    return a, b


def rule(part: dict) -> Rule:
    return Rule(part["rule"]["kind"], part["rule"].get("margin", 0.0))


def claim_verdicts(claims: list[dict], runs: dict[str, list[dict[str, float]]], resamples: int) -> dict[int, str]:
    """Each claim's verdict under the suite's parts and rules, on these runs (the suite's own, or a draw)."""
    out = {}
    for c in claims:
        parts = []
        for part in c["parts"]:
            _, lo, hi = effect_interval(*sides(part, runs), resamples=resamples)
            parts.append(decide(lo, hi, rule(part))[0])
        out[c["id"]] = combine(parts)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--seeds", type=int, default=5, help="seeds per arm unless --arm says otherwise")
    p.add_argument("--arm", action="append", default=[], help="arm=seeds, e.g. relax_low=16")
    args = p.parse_args()
    suite = yaml.safe_load((FINDINGS / "suite.yaml").read_text())
    claims = [c for c in suite["claims"] if "parts" in c]
    pool = pooled_runs()

    print("pooled comparisons (a description of runs already made):")
    for c in claims:
        for part in c["parts"]:
            a, b = sides(part, pool)
            effect, lo, hi = effect_interval(a, b, resamples=2000)
            need = replication_seeds(a, b, rule(part)), replication_seeds(a, b, rule(part), toward=CONTRADICTED)
            print(f"  claim {c['id']:>2} {part['a']} - {part['b']} {part['metric']} ({rule(part).kind} "
                  f"{rule(part).margin}): n {len(a)}/{len(b)}, {effect:+.4f} [{lo:+.4f}, {hi:+.4f}], seeds to "
                  f"reproduce {need[0]}, to contradict {need[1]}")  # fmt: skip

    design = {arm: args.seeds for arm in suite["arms"]}
    design.update({k: int(v) for k, v in (a.split("=") for a in args.arm)})
    rng = np.random.default_rng(1)
    verdicts = {c["id"]: Counter() for c in claims}
    decided: Counter = Counter()
    for _ in range(args.reps):
        drawn = {arm: [pool[arm][i] for i in rng.integers(0, len(pool[arm]), n)] for arm, n in design.items()}
        drawn_verdicts = claim_verdicts(claims, drawn, resamples=1000)
        for cid, verdict in drawn_verdicts.items():
            verdicts[cid][verdict] += 1
        decided[sum(v != INCONCLUSIVE for v in drawn_verdicts.values())] += 1
    print(f"design: {sum(design.values())} runs, seeds per arm {design}")
    for cid, counts in verdicts.items():
        print(f"  claim {cid}: " + ", ".join(f"{v} {k / args.reps:.1%}" for v, k in counts.most_common()))
    mean = sum(k * v for k, v in decided.items()) / args.reps
    at_least_5 = sum(v for k, v in decided.items() if k >= 5) / args.reps
    print(f"claims decided per repetition: {sorted(decided.items())}; mean {mean:.2f}; P(>= 5) {at_least_5:.2f}")


if __name__ == "__main__":
    main()
