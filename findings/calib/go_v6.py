"""Calibration v6's go/no-go rule (CALIBRATION.md section 12, fixed before its runs): (a) the W4A4 runs' step-1
mean |pi - mu| in [0.003, 0.02]; (b) a suite of 54 such runs two at a time projects to <= 80 min, its quick subset
(9 runs) to <= 18 min; (c) at 4 seeds, DPPO-TV vs PG-IS or the reference vs PG-IS on final held-out accuracy is
decided by the suite's own `greater` rule with margin 0.02 (reproduced or contradicted).
Usage: PYTHONPATH=. python findings/calib/go_v6.py [/tmp/calib_v6]"""

import re
import sys
from pathlib import Path

import pandas as pd

from analysis.findings import METRICS, load_run, run_broke
from analysis.suite import run_status
from analysis.verdicts import INCONCLUSIVE, Rule, compare

STABLE_DROP = 0.03  # section 10's "stable": not broken, and held-out at step 80 at least step 0's minus this


def runs(root: Path) -> pd.DataFrame:
    """One row per completed run under `root` (folders named ARM_lrLR_sSEED), with the numbers the rules read."""
    rows = []
    for d in sorted(p for p in root.iterdir() if p.is_dir() and run_status(p) == "completed"):
        arm, lr, seed = re.match(r"(\w+?)_lr([\d.e-]+)_s(\d+)", d.name).groups()
        m, e = load_run(d)
        f, gain = METRICS["final_eval"][0](m, e), METRICS["eval_gain"][0](m, e)
        broke = run_broke(m, e)
        user, system, elapsed = map(float, (root / f"{d.name}.cpu.txt").read_text().split()[-3:])
        mismatch = float(m["mismatch/abs_prob_diff_mean"].dropna().iloc[0])
        rows.append({
            "run": d.name, "arm": arm, "lr": lr, "seed": int(seed), "final": f, "gain": gain, "broke": broke,
            "stable": not broke and gain >= -STABLE_DROP, "mismatch": mismatch,
            "wall": elapsed, "cpu": user + system,
        })  # fmt: skip
    return pd.DataFrame(rows)


def table(df: pd.DataFrame) -> None:
    print(
        "| run | held-out step 0 -> 80 | broke | step-1 mean abs(pi-mu) | wall s | CPU s |\n|---|---|---|---|---|---|"
    )
    for r in df.itertuples():
        cells = [r.run, f"{r.final - r.gain:.3f} -> {r.final:.3f}", "yes" if r.broke else "no", f"{r.mismatch:.4f}"]
        print("| " + " | ".join([*cells, f"{r.wall:.0f}", f"{r.cpu:.0f}"]) + " |")


def go(df: pd.DataFrame) -> bool:
    """Section 12's rule (a) and (b) and (c) on one lr's runs."""
    mismatch = df[df.arm != "ref"].mismatch.mean()
    a = 0.003 <= mismatch <= 0.02
    suite_min, quick_min = df.wall.mean() * 54 / 2 / 60, df.wall.mean() * 9 / 2 / 60
    b = suite_min <= 80 and quick_min <= 18
    decided = []
    for a_arm in ("dppo", "ref"):
        c = compare(df[df.arm == a_arm].final.tolist(), df[df.arm == "pgis"].final.tolist(), Rule("greater", 0.02))
        decided.append(c.verdict != INCONCLUSIVE)
        ci = f"95% CI [{c.ci_low:+.3f}, {c.ci_high:+.3f}]"
        print(f"{a_arm} vs pgis on final_eval: effect {c.effect:+.3f}, {ci}, seeds {c.seeds} -> {c.verdict}")
    print(f"(a) step-1 mean abs(pi-mu) of the W4A4 runs {mismatch:.4f} in [0.003, 0.02]: {a}")
    print(f"(b) projected suite {suite_min:.1f} min <= 80 and quick {quick_min:.1f} min <= 18: {b}")
    print(f"(c) a claim-1 comparison decided at 4 seeds: {any(decided)}")
    return bool(a and b and any(decided))


if __name__ == "__main__":
    df = runs(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/calib_v6"))
    table(df)
    print(f"GO for suite v5: {go(df)}")
