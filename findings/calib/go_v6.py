"""Calibration v6's go/no-go rule (CALIBRATION.md section 12, fixed before its runs): (a) the W4A4 runs' step-1
mean |pi - mu| in [0.003, 0.02]; (b) a suite of 54 such runs two at a time projects to <= 80 min, its quick subset
(9 runs) to <= 18 min; (c) at 4 seeds, DPPO-TV vs PG-IS or the reference vs PG-IS on final held-out accuracy is
decided by the suite's own `greater` rule with margin 0.02 (reproduced or contradicted).
Usage: PYTHONPATH=. python findings/calib/go_v6.py [/tmp/calib_v6]"""

import re
import sys
from pathlib import Path

import numpy as np

from analysis.findings import BROKEN_EVAL, METRICS, load_run
from analysis.suite import run_status
from analysis.verdicts import INCONCLUSIVE, Rule, compare

root = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/calib_v6")
final: dict[str, list[float]] = {}
mismatch, wall = [], []
print("| run | held-out step 0 -> 80 | broke | step-1 mean abs(pi-mu) | wall s | CPU s |\n|---|---|---|---|---|---|")
for d in sorted(p for p in root.iterdir() if p.is_dir() and run_status(p) == "completed"):
    arm = re.match(r"(\w+?)_lr", d.name).group(1)
    m, e = load_run(d)
    f, gain = METRICS["final_eval"][0](m, e), METRICS["eval_gain"][0](m, e)
    broke = METRICS["collapsed"][0](m, e) == 1.0 or f < BROKEN_EVAL
    mis = float(m["mismatch/abs_prob_diff_mean"].dropna().iloc[0])
    user, system, elapsed = map(float, (root / f"{d.name}.cpu.txt").read_text().split()[-3:])
    final.setdefault(arm, []).append(f)
    wall.append(elapsed)
    if arm != "ref":
        mismatch.append(mis)
    cells = [d.name, f"{f - gain:.3f} -> {f:.3f}", "yes" if broke else "no", f"{mis:.4f}", f"{elapsed:.0f}"]
    print("| " + " | ".join([*cells, f"{user + system:.0f}"]) + " |")

a = 0.003 <= np.mean(mismatch) <= 0.02
suite_min, quick_min = np.mean(wall) * 54 / 2 / 60, np.mean(wall) * 9 / 2 / 60
b = suite_min <= 80 and quick_min <= 18
rule = Rule("greater", 0.02)
decided = []
for a_arm in ("dppo", "ref"):
    c = compare(final.get(a_arm), final.get("pgis"), rule)
    decided.append(c.verdict != INCONCLUSIVE)
    ci = f"95% CI [{c.ci_low:+.3f}, {c.ci_high:+.3f}]"
    print(f"{a_arm} vs pgis on final_eval: effect {c.effect:+.3f}, {ci}, seeds {c.seeds} -> {c.verdict}")
print(f"(a) step-1 mean abs(pi-mu) of the W4A4 runs {np.mean(mismatch):.4f} in [0.003, 0.02]: {a}")
print(f"(b) projected suite {suite_min:.1f} min <= 80 and quick {quick_min:.1f} min <= 18: {b}")
print(f"(c) a claim-1 comparison decided at 4 seeds: {any(decided)}")
print(f"GO for suite v5: {a and b and any(decided)}")
