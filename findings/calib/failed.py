"""Calibration v4's rule (CALIBRATION.md section 10) per run and per lr: failed (the suite's `collapsed` metric,
or held-out below 0.10 at the last evaluation), and for the reference, stable (not failed, and held-out at the
last evaluation at least step 0's minus 0.03); then section 10b's counts and tests where an lr has more seeds, or,
for a folder without the reference (section 11), each arm's failures against section 10b's reference.
Usage: PYTHONPATH=. python findings/calib/failed.py [/tmp/calib_v4]"""

import re
import sys
from pathlib import Path

import pandas as pd
from scipy import stats

from analysis.findings import METRICS, load_run, run_broke
from analysis.suite import run_status
from analysis.verdicts import effect_interval

STABLE_DROP = 0.03
RULE_SEEDS = {200, 201, 202}  # section 10's rule reads these seeds only
REF_10B = (1, 13)  # section 10b: the reference failed in 1 of 13 seeds at lr 1e-4, 4 updates


def row(d: Path) -> dict:
    arm, lr, seed = re.match(r"(\w+?)_lr([\d.e-]+)_s(\d+)", d.name).groups()
    m, e = load_run(d)
    final, gain = METRICS["final_eval"][0](m, e), METRICS["eval_gain"][0](m, e)
    failed = run_broke(m, e)
    state = "failed" if failed else "stable" if gain >= -STABLE_DROP else "declined"
    return {"run": d.name, "arm": arm, "lr": lr, "seed": int(seed), "final": final, "gain": gain, "state": state}


root = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/calib_v4")
runs = pd.DataFrame(row(d) for d in root.iterdir() if run_status(d) == "completed")
runs = runs.sort_values(["arm", "lr", "seed"])
print("| run | held-out step 0 -> last | state |\n|---|---|---|")
for r in runs.itertuples():
    print(f"| {r.run} | {r.final - r.gain:.3f} -> {r.final:.3f} | {r.state} |")

print()
for lr, at_lr in sorted(runs.groupby("lr"), key=lambda kv: float(kv[0])):
    if "ref" not in set(at_lr.arm):  # section 11: the reference is section 10b's, not rerun
        print(f"section 11, lr {lr} (each arm against the section-10b reference, failed {REF_10B[0]} of {REF_10B[1]}):")
        for arm, d in at_lr.groupby("arm"):
            k, n = int((d.state == "failed").sum()), len(d)
            ci = stats.binomtest(k, n).proportion_ci(method="exact")
            p = stats.fisher_exact([[k, n - k], [REF_10B[0], REF_10B[1] - REF_10B[0]]]).pvalue
            print(f"  {arm}: failed {k} of {n} (95% CI [{ci.low:.2f}, {ci.high:.2f}]); Fisher two-sided p = {p:.3f}")
        continue
    rule = at_lr[at_lr.seed.isin(RULE_SEEDS)]
    ref, pgis = rule[rule.arm == "ref"].state.tolist(), rule[rule.arm == "pgis"].state.tolist()
    eligible = len(ref) == 3 and all(s == "stable" for s in ref)
    print(f"section 10, lr {lr}: reference {ref} -> eligible {eligible}; PG-IS failed {pgis.count('failed')} of 3")
    if at_lr.groupby("arm").size().min() <= len(RULE_SEEDS):
        continue
    print(f"section 10b, lr {lr}:")
    table, gains = [], {}
    for arm in ("ref", "pgis"):
        d = at_lr[at_lr.arm == arm]
        k, n = int((d.state == "failed").sum()), len(d)
        ci = stats.binomtest(k, n).proportion_ci(method="exact")
        table.append([k, n - k])
        gains[arm] = d.gain.tolist()
        print(
            f"  {arm}: failed {k} of {n} (95% CI [{ci.low:.2f}, {ci.high:.2f}]); "
            f"held-out change mean {d.gain.mean():+.3f}, median {d.gain.median():+.3f}"
        )
    print(f"  Fisher's exact test, two-sided: p = {stats.fisher_exact(table).pvalue:.3f}")
    eff, lo, hi = effect_interval(gains["ref"], gains["pgis"])
    print(f"  held-out change, IQM(ref) - IQM(PG-IS): {eff:+.3f}, 95% CI [{lo:+.3f}, {hi:+.3f}]")
