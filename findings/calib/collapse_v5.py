"""How suite v5's runs broke: a description after the runs, not a verdict (no rule reads it).

For each completed run of a suite's run folder: the step from which its mean training reward stayed below 0.05 to
the end (at least 10 steps; none if it never did), the share of its responses that hit the token cap from there
(the end token lost), and the run's peak step-mean |pi - mu| and peak share of "bad update" tokens (A < 0 and
mu - pi >= 0.5) before that step (over all steps if it never came), beside its step-1 |pi - mu|. Read the
healthy runs' peaks beside the broken ones': a peak is only a sign of the collapse if it is higher than theirs.
The suite's `late_mismatch` reads the last quarter of steps, which in a broken run is a frozen policy: once every
reward is 0 the advantages are 0 and no update happens, so it says nothing about the steps before the collapse.

    python findings/calib/collapse_v5.py [findings/runs]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from statistics import median

FLOOR = 0.05  # a broken run's reward: 0 with an occasional 1 in 128 samples (0.008)


def describe(run: Path) -> dict[str, float | int | None]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    zero_from = len(rows)
    while zero_from > 0 and rows[zero_from - 1]["reward/mean"] < FLOOR:
        zero_from -= 1
    lost = rows[zero_from]["step"] if len(rows) - zero_from >= 10 else None
    before = rows[:zero_from] if lost is not None else rows
    mismatch = [r["mismatch/abs_prob_diff_mean"] for r in before if "mismatch/abs_prob_diff_mean" in r]
    bad = [r["mismatch/bad_update_frac"] for r in before if "mismatch/bad_update_frac" in r]
    return {
        "lost_end_token_step": lost,
        "truncated_after": median(r["rollout/truncated_frac"] for r in rows[zero_from:]) if lost else None,
        "mismatch_step1": rows[0].get("mismatch/abs_prob_diff_mean", float("nan")),
        "mismatch_peak_before": max(mismatch) if mismatch else float("nan"),
        "bad_update_peak_before": max(bad) if bad else float("nan"),
    }


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "findings/runs")
    for arm in sorted(p for p in root.iterdir() if p.is_dir()):
        runs = sorted(r for r in arm.glob("seed*") if '"completed"' in _read(r / "summary.json"))
        if not runs:
            continue
        d = [describe(r) for r in runs]
        broke = [
            f"{r.name} from step {x['lost_end_token_step']} (truncated {x['truncated_after']:.2f})"
            for r, x in zip(runs, d, strict=True)
            if x["lost_end_token_step"]
        ]
        peaks = ", ".join(f"{x['mismatch_peak_before']:.4f}" for x in d)
        bad = ", ".join(f"{x['bad_update_peak_before']:.2%}" for x in d)
        print(f"{arm.name:24s} runs {len(d)}  reward < 0.05 to the end: {'; '.join(broke) or 'none'}")
        print(f"{'':24s} step-1 |pi-mu| median {median(x['mismatch_step1'] for x in d):.4f}; peak before: {peaks}")
        print(f"{'':24s} peak bad-update share before: {bad}")


if __name__ == "__main__":
    main()
