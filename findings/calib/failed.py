"""Calibration v4's rule (CALIBRATION.md section 10) per run and per lr: failed (the suite's `collapsed` metric,
or held-out below 0.10 at the last evaluation), and for the reference, stable (not failed, and held-out at the
last evaluation at least step 0's minus 0.03). Usage: python findings/calib/failed.py [/tmp/calib_v4]"""

import re
import sys
from collections import defaultdict
from pathlib import Path

from analysis.findings import METRICS, load_run

FAIL_EVAL, STABLE_DROP = 0.10, 0.03

root = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/calib_v4")
per_lr: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
print("| run | held-out step 0 -> last | collapsed | failed | stable |")
print("|---|---|---|---|---|")
for d in sorted(p for p in root.iterdir() if (p / "summary.json").exists()):
    arm, lr, _seed = re.match(r"(\w+?)_lr([\d.e-]+)_s(\d+)", d.name).groups()
    m, e = load_run(d)
    start = METRICS["final_eval"][0](m, e.iloc[:1])
    final = METRICS["final_eval"][0](m, e)
    collapsed = METRICS["collapsed"][0](m, e) == 1.0
    failed = collapsed or final < FAIL_EVAL
    stable = not failed and final >= start - STABLE_DROP
    per_lr[lr][arm].append("failed" if failed else "stable" if stable else "declined")
    print(f"| {d.name} | {start:.3f} -> {final:.3f} | {int(collapsed)} | {failed} | {stable} |")

print()
for lr, arms in sorted(per_lr.items(), key=lambda kv: float(kv[0])):
    ref, pgis = arms.get("ref", []), arms.get("pgis", [])
    eligible = len(ref) == 3 and all(s == "stable" for s in ref)
    print(f"lr {lr}: reference {ref} -> eligible {eligible}; PG-IS failed {pgis.count('failed')} of {len(pgis)}")
