"""One markdown row per calibration run: step-1 mismatch, trust-region fractions, reward by window, held-out
avg@n, cost. Usage: python findings/calib/summarize.py [/tmp/calib_runs]"""

import json
import sys
from pathlib import Path


def read(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def mean(key: str, rows: list[dict]) -> float:
    v = [r[key] for r in rows if key in r]
    return sum(v) / len(v) if v else float("nan")


root = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/calib_runs")
print(
    "| run | steps | step-1 mean/max \\|pi-mu\\| | last-20 mean/max | masked % (all / last 20) | bad-update % "
    "| reward per 20 steps | held-out avg@n by step | wall s/step | CPU s (run) |"
)
print("|---|---|---|---|---|---|---|---|---|---|")
for d in sorted(p for p in root.iterdir() if p.is_dir()):
    rows, evals = read(d / "metrics.jsonl"), read(d / "eval.jsonl")
    if not rows:
        continue
    r1, last = rows[0], rows[-20:]
    mis1 = f"{r1.get('mismatch/abs_prob_diff_mean', 0):.4f} / {r1.get('mismatch/abs_prob_diff_max', 0):.2f}"
    last_max = max(r.get("mismatch/abs_prob_diff_max", 0) for r in last)
    misl = f"{mean('mismatch/abs_prob_diff_mean', last):.4f} / {last_max:.2f}"
    mask = f"{100 * mean('objective/masked_frac', rows):.2f} / {100 * mean('objective/masked_frac', last):.2f}"
    rew = " ".join(f"{mean('reward/mean', rows[i : i + 20]):.2f}" for i in range(0, len(rows), 20))
    ev = " ".join(f"{e['step']}:{100 * next(v for k, v in e.items() if k.startswith('avg@')):.1f}" for e in evals)
    wall = mean("perf/rollout_s", rows) + mean("perf/train_s", rows)
    cpu = d.parent / f"{d.name}.cpu.txt"
    cpu_s = f"{sum(map(float, cpu.read_text().split()[:2])):.0f}" if cpu.exists() and cpu.read_text().strip() else ""
    bad = f"{100 * mean('mismatch/bad_update_frac', rows):.2f}"
    print(f"| {d.name} | {len(rows)} | {mis1} | {misl} | {mask} | {bad} | {rew} | {ev} | {wall:.2f} | {cpu_s} |")
