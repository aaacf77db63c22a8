"""Calibration v9's rule (CALIBRATION.md section 16, fixed before its runs), all four: (a) PG-IS broke in more seeds
than the reference, Fisher's exact test one-sided p <= 0.05; (b) DPPO-TV broke in at most 1 of 6; (c) the W4A4 runs'
step-1 mean |pi - mu| in [0.003, 0.02]; (d) a 54-run suite two at a time projects to <= 80 min, its 9-run quick
subset to <= 18 min. Beside it: each run's held-out accuracy, training reward over its last 20 steps, and mismatch
growth. Usage: PYTHONPATH=. python findings/calib/go_v9.py [/tmp/calib_v9]"""

import sys
from pathlib import Path

import pandas as pd
from go_v6 import runs
from go_v8 import row
from scipy import stats


def main(root: Path) -> bool:
    df = runs(root).set_index("run")
    detail = pd.DataFrame(row(root / name) for name in df.index).set_index("run")
    df = df.join(detail[["held", "growth", "late"]]).sort_values(["arm", "seed"])
    print("| run | held-out at 0 / 80 / 160 | training reward, last 20 steps | broke | step-1 mean abs(pi-mu) "
          "| mismatch last-20 / first-20 | wall s |\n|---|---|---|---|---|---|---|")  # fmt: skip
    for name, r in df.iterrows():
        held = " / ".join(f"{r.held[s]:.3f}" for s in sorted(r.held))
        growth = "-" if r.arm == "ref" else f"{r.growth:.2f}"
        cells = [name, held, f"{r.late:.2f}", "yes" if r.broke else "no", f"{r.mismatch:.4f}", growth, f"{r.wall:.0f}"]
        print("| " + " | ".join(cells) + " |")
    broke = {a: int(g.broke.sum()) for a, g in df.groupby("arm")}
    n = {a: len(g) for a, g in df.groupby("arm")}
    print("\nbroke: " + ", ".join(f"{a} {broke[a]} of {n[a]}" for a in ("pgis", "dppo", "ref")))
    table = [[broke["pgis"], n["pgis"] - broke["pgis"]], [broke["ref"], n["ref"] - broke["ref"]]]
    p = stats.fisher_exact(table, alternative="greater")[1]
    mismatch = df[df.arm != "ref"].mismatch.mean()
    suite_min, quick_min = df.wall.mean() * 54 / 2 / 60, df.wall.mean() * 9 / 2 / 60
    checks = {
        f"(a) PG-IS broke more than the reference, Fisher one-sided p = {p:.3f} <= 0.05": p <= 0.05,
        f"(b) DPPO-TV broke in {broke['dppo']} of {n['dppo']}, at most 1": broke["dppo"] <= 1,
        f"(c) step-1 mean abs(pi-mu) of the W4A4 runs {mismatch:.4f} in [0.003, 0.02]": 0.003 <= mismatch <= 0.02,
        f"(d) projected suite {suite_min:.1f} min <= 80 and quick {quick_min:.1f} min <= 18": suite_min <= 80
        and quick_min <= 18,
    }
    for what, ok in checks.items():
        print(f"{what}: {ok}")
    return all(checks.values())


if __name__ == "__main__":
    print(f"GO for suite v5: {main(Path(sys.argv[1] if len(sys.argv) > 1 else '/tmp/calib_v9'))}")
