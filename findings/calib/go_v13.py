"""Calibration v13's rule (CALIBRATION.md section 20, fixed before its runs), all three on its own seeds: (a) PG-IS's
held-out change (avg@2 at step 80 minus step 0) is lower than the reference's, one-sided Mann-Whitney U p <= 0.05;
(b) lower than DPPO-TV's, the same test; (c) at least 2 PG-IS seeds degrade (change <= -0.10) and at most 1
reference seed does. Usage: PYTHONPATH=. python findings/calib/go_v13.py [/tmp/calib_v13]"""

import sys
from pathlib import Path

from go_v6 import runs
from scipy import stats

DEGRADED = -0.10


def main(root: Path) -> bool:
    df = runs(root).sort_values(["arm", "seed"])
    change = {arm: g.set_index("seed").gain for arm, g in df.groupby("arm")}
    degraded = {arm: int((c <= DEGRADED).sum()) for arm, c in change.items()}
    print(
        "| arm | seeds | held-out change per seed | median | degraded (<= -0.10) | wall s |\n|---|---|---|---|---|---|"
    )
    for arm in ("pgis", "dppo", "ref"):
        c, wall = change[arm], df[df.arm == arm].wall
        per_seed = " / ".join(f"{v:+.3f}" for v in c)
        cells = [arm, str(len(c)), per_seed, f"{c.median():+.3f}", str(degraded[arm]),
                 f"{wall.min():.0f}-{wall.max():.0f}"]  # fmt: skip
        print("| " + " | ".join(cells) + " |")
    p_ref = stats.mannwhitneyu(change["pgis"], change["ref"], alternative="less").pvalue
    p_dppo = stats.mannwhitneyu(change["pgis"], change["dppo"], alternative="less").pvalue
    bad_pgis, bad_ref = degraded["pgis"], degraded["ref"]
    checks = {
        f"(a) PG-IS below the reference, Mann-Whitney one-sided p = {p_ref:.4f} <= 0.05": p_ref <= 0.05,
        f"(b) PG-IS below DPPO-TV, Mann-Whitney one-sided p = {p_dppo:.4f} <= 0.05": p_dppo <= 0.05,
        f"(c) PG-IS degraded in {bad_pgis} (>= 2), the reference in {bad_ref} (<= 1)": bad_pgis >= 2 and bad_ref <= 1,
    }
    for what, ok in checks.items():
        print(f"{what}: {ok}")
    return all(checks.values())


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/calib_v13")
    print(f"section 19's setting confirmed (suite v5 owed): {main(root)}")
