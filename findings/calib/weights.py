"""How far the mismatch reaches the gradient, per arm of a calibration folder (CALIBRATION.md sections 16a and 17a):
the step's largest IS weight (`objective/ratio_max`, over steps with a token of nonzero advantage), the logged
gradient norm before clipping (`optim/grad_norm`, and the steps above the clip of 1.0), and the median held-out
change. A description, not a rule. Usage: PYTHONPATH=. python findings/calib/weights.py /tmp/calib_v9"""

import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.findings import METRICS, load_run
from analysis.suite import run_status


def main(root: Path) -> None:
    per_arm: dict[str, dict[str, list[float]]] = {}
    for d in sorted(p for p in root.iterdir() if p.is_dir() and run_status(p) == "completed"):
        arm = re.match(r"(\w+?)_lr", d.name).group(1)
        m, e = load_run(d)
        acc = per_arm.setdefault(arm, {"ratio": [], "grad": [], "gain": []})
        acc["ratio"] += m["objective/ratio_max"].dropna().tolist()
        acc["grad"] += m["optim/grad_norm"].dropna().tolist()
        acc["gain"].append(METRICS["eval_gain"][0](m, e))
    rows = []
    for arm, acc in per_arm.items():
        r, g = np.asarray(acc["ratio"]), np.asarray(acc["grad"])
        rows.append({
            "arm": arm, "runs": len(acc["gain"]), "held-out change, median": np.median(acc["gain"]),
            "ratio_max median": np.median(r), "p99": np.percentile(r, 99), "max": r.max(),
            "steps > 10": int((r > 10).sum()),
            "grad_norm p99": np.percentile(g, 99), "steps > 1.0": f"{int((g > 1.0).sum())} of {len(g)}",
        })  # fmt: skip
    df = pd.DataFrame(rows)
    print("| " + " | ".join(df.columns) + " |\n|" + "---|" * len(df.columns))
    for r in df.itertuples(index=False):
        print("| " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in r) + " |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
