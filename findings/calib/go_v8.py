"""Calibration v8's reading (CALIBRATION.md section 15, fixed before its runs): over seeds 400-403 at 320 steps,
"the premise appears" if PG-IS broke in 4 of 4 and the reference in 0 of 4 (Fisher p = 0.029); "a sign, not shown"
if PG-IS broke in at least two more seeds than the reference; else "no sign at 320 steps". Beside it: DPPO-TV's
breaks, whether each broken run had already broken by step 80, the step its reward went flat for good, and the
mismatch growth.
Usage: PYTHONPATH=. python findings/calib/go_v8.py [/tmp/calib_v8]"""

import re
import sys
from pathlib import Path

import pandas as pd
from failure_modes import flat_from
from scipy import stats

from analysis.findings import BROKEN_EVAL, METRICS, load_run, run_broke
from analysis.suite import run_status

EARLY = 80  # the suites' horizon
LATE = 20  # steps: how near 1 training reward came at the end (calibration v9)


def row(d: Path) -> dict:
    arm, seed = re.match(r"(\w+?)_lr[\d.e-]+_s(\d+)", d.name).groups()
    m, e = load_run(d)
    m = m.sort_values("step").reset_index(drop=True)
    final = METRICS["final_eval"][0](m, e)
    col = next(c for c in e.columns if c.startswith("avg@"))
    held = dict(zip(e["step"].astype(int), e[col], strict=True))
    late_reward = m[(m.step > EARLY - 10) & (m.step <= EARLY)]["reward/mean"].mean()
    mis = m["mismatch/abs_prob_diff_mean"].astype(float)
    return {
        "run": d.name, "arm": arm, "seed": int(seed), "held": held, "final": final,
        "broke": run_broke(m, e),
        "broke_by_80": held.get(EARLY, 1.0) < BROKEN_EVAL or late_reward < 0.05,
        "fall_at": None if (i := flat_from(m["reward/mean"])) is None else int(m["step"].iloc[i]),
        "growth": mis.tail(20).mean() / mis.head(20).mean() if mis.head(20).mean() > 0 else float("nan"),
        "reward": [round(float(x), 2) for x in m["reward/mean"].groupby(m.index // 80).mean()],
        "late": m["reward/mean"].tail(LATE).mean(),
    }  # fmt: skip


def main(root: Path) -> None:
    runs = pd.DataFrame(row(d) for d in sorted(root.iterdir()) if d.is_dir() and run_status(d) == "completed")
    runs = runs.sort_values(["arm", "seed"])
    print("| run | held-out at 0 / 80 / 160 / 240 / 320 | training reward per 80 steps | broke | broken by step 80 "
          "| flat from step | mismatch last-20 / first-20 |\n|---|---|---|---|---|---|---|")  # fmt: skip
    for r in runs.itertuples():
        held = " / ".join(f"{r.held[s]:.3f}" for s in sorted(r.held))
        flat = "-" if pd.isna(r.fall_at) else str(int(r.fall_at))
        growth = "-" if r.arm == "ref" else f"{r.growth:.2f}"
        cells = [r.run, held, " ".join(map(str, r.reward)), "yes" if r.broke else "no",
                 "yes" if r.broke_by_80 else "no", flat, growth]  # fmt: skip
        print("| " + " | ".join(cells) + " |")
    broke = {a: int(g.broke.sum()) for a, g in runs.groupby("arm")}
    n = {a: len(g) for a, g in runs.groupby("arm")}
    print("\nbroke: " + ", ".join(f"{a} {broke[a]} of {n[a]}" for a in ("pgis", "dppo", "ref") if a in n))
    p = stats.fisher_exact([[broke["pgis"], n["pgis"] - broke["pgis"]], [broke["ref"], n["ref"] - broke["ref"]]])[1]
    if broke["pgis"] == n["pgis"] == 4 and broke["ref"] == 0 and n["ref"] == 4:
        reading = "the premise appears at 320 steps"
    elif broke["pgis"] - broke["ref"] >= 2:
        reading = "a sign, not shown"
    else:
        reading = "no sign at 320 steps"
    print(f"PG-IS vs the reference: Fisher two-sided p = {p:.3f} -> {reading}")
    for a in ("pgis", "dppo"):
        g = runs[runs.arm == a].growth
        print(f"{a}: mismatch last-20 / first-20 {g.min():.2f}-{g.max():.2f}, at least 2 in {int((g >= 2).sum())}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/calib_v8"))
