"""The testbed map's figures: per sweep, final held-out accuracy and break rate against the dose, one line per
objective. Bands stay inside [0, 1]: an interval of a mean accuracy or a rate is clipped to the metric's range."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def draw_map(m: Any, table: pd.DataFrame, out: Path) -> list[str]:
    """figures/<sweep>.png for every sweep with a finished cell; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, sweep in m.sweeps.items():
        rows = table[(table["sweep"] == name) & (table["seeds"] > 0)] if "seeds" in table else table.iloc[:0]
        if rows.empty:
            continue
        doses = list(sweep["doses"])
        fig, (ax_eval, ax_broke) = plt.subplots(1, 2, figsize=(11, 4))
        for obj, g in rows.groupby("objective", sort=False):
            g = g.set_index("dose").reindex(doses).dropna(subset=["final_eval"])
            x = np.array([doses.index(d) for d in g.index])
            mean = g["final_eval"].to_numpy(float)
            lo = np.clip(g["final_lo"].fillna(g["final_eval"]).to_numpy(float), 0, 1)
            hi = np.clip(g["final_hi"].fillna(g["final_eval"]).to_numpy(float), 0, 1)
            line = ax_eval.plot(x, mean, marker="o", label=f"{obj}")[0]
            ax_eval.fill_between(x, lo, hi, color=line.get_color(), alpha=0.15)
            rate = g["broke"].to_numpy(float) / g["seeds"].to_numpy(float)
            ax_broke.errorbar(
                x, rate, yerr=[rate - g["broke_lo"].to_numpy(float), g["broke_hi"].to_numpy(float) - rate],
                marker="o", capsize=3, color=line.get_color(), label=obj,
            )  # fmt: skip
        labels = [_dose_label(d, rows) for d in doses]
        for ax in (ax_eval, ax_broke):
            ax.set_xticks(range(len(doses)), labels, fontsize=8)
            ax.set_xlabel(sweep.get("label", name))
            ax.set_ylim(0, 1 if ax is ax_broke else None)
            ax.grid(alpha=0.3)
        ax_eval.set_ylabel("final held-out accuracy (policy), mean, 95% t")
        ax_broke.set_ylabel("break rate, 95% Wilson")
        ax_eval.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))
    return written


def _dose_label(dose: str, rows: pd.DataFrame) -> str:
    """The dose's name and its measured step-1 mean |pi - mu| (averaged over the objectives' runs)."""
    mm = rows.loc[rows["dose"] == dose, "step1_mismatch_mean"].dropna()
    return f"{dose}\n{mm.mean():.3f}" if len(mm) else dose
