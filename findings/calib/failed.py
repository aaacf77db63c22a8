"""Calibration v4's rule (CALIBRATION.md section 10) per run and per lr: failed (the suite's `collapsed` metric,
or held-out below 0.10 at the last evaluation), and for the reference, stable (not failed, and held-out at the
last evaluation at least step 0's minus 0.03); then section 10b's counts and tests where an lr has more seeds.
Usage: PYTHONPATH=. python findings/calib/failed.py [/tmp/calib_v4]"""

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy import stats

from analysis.findings import METRICS, load_run
from analysis.verdicts import effect_interval

FAIL_EVAL, STABLE_DROP = 0.10, 0.03
RULE_SEEDS = {200, 201, 202}  # section 10's rule reads these seeds only

root = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/calib_v4")
state: dict[str, dict[str, dict[int, str]]] = defaultdict(lambda: defaultdict(dict))
gain: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
print("| run | held-out step 0 -> last | collapsed | failed | stable |")
print("|---|---|---|---|---|")
done = root.glob("*/summary.json")
runs = [p.parent for p in done if json.loads(p.read_text())["status"] == "completed"]
for d in sorted(runs, key=lambda p: (p.name.split("_s")[0], int(p.name.rsplit("_s", 1)[1]))):
    arm, lr, seed = re.match(r"(\w+?)_lr([\d.e-]+)_s(\d+)", d.name).groups()
    m, e = load_run(d)
    start, final = METRICS["final_eval"][0](m, e.iloc[:1]), METRICS["final_eval"][0](m, e)
    collapsed = METRICS["collapsed"][0](m, e) == 1.0
    failed = collapsed or final < FAIL_EVAL
    stable = not failed and final >= start - STABLE_DROP
    state[lr][arm][int(seed)] = "failed" if failed else "stable" if stable else "declined"
    gain[lr][arm][int(seed)] = final - start
    print(f"| {d.name} | {start:.3f} -> {final:.3f} | {int(collapsed)} | {failed} | {stable} |")

print()
for lr, arms in sorted(state.items(), key=lambda kv: float(kv[0])):
    ref = [s for k, s in sorted(arms.get("ref", {}).items()) if k in RULE_SEEDS]
    pgis = [s for k, s in sorted(arms.get("pgis", {}).items()) if k in RULE_SEEDS]
    eligible = len(ref) == 3 and all(s == "stable" for s in ref)
    print(f"section 10, lr {lr}: reference {ref} -> eligible {eligible}; PG-IS failed {pgis.count('failed')} of 3")
    n = {arm: len(seeds) for arm, seeds in arms.items()}
    if min(n.values(), default=0) <= len(RULE_SEEDS):
        continue
    print(f"section 10b, lr {lr}:")
    fails = {arm: list(seeds.values()).count("failed") for arm, seeds in arms.items()}
    for arm in ("ref", "pgis"):
        ci = stats.binomtest(fails[arm], n[arm]).proportion_ci(method="exact")
        g = np.array(list(gain[lr][arm].values()))
        print(
            f"  {arm}: failed {fails[arm]} of {n[arm]} (95% CI [{ci.low:.2f}, {ci.high:.2f}]); "
            f"held-out change mean {g.mean():+.3f}, median {np.median(g):+.3f}"
        )
    table = [[fails["ref"], n["ref"] - fails["ref"]], [fails["pgis"], n["pgis"] - fails["pgis"]]]
    print(f"  Fisher's exact test, two-sided: p = {stats.fisher_exact(table).pvalue:.3f}")
    eff, lo, hi = effect_interval(list(gain[lr]["ref"].values()), list(gain[lr]["pgis"].values()))
    print(f"  held-out change, IQM(ref) - IQM(PG-IS): {eff:+.3f}, 95% CI [{lo:+.3f}, {hi:+.3f}]")
