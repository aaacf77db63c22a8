"""Suite v8's power analysis (findings/suite.yaml, issue 60): every part's `power` block and the seeds per arm, from
committed records only, so anyone can rerun it: `python findings/power_v8.py`.

Each part draws simulated experiments of n seeds per arm from a reference pair of observed cells (resampled per
seed), moves arm A so that it is better than B by the part's planned effect, and decides each experiment by the
part's own rule at Holm's first level for its claim (1 - 0.05 / k, k the claim's decided parts); `seeds` is the first
n up to 16 with >= 80% power (16 with the power reached where none does). Planned effects, fixed here before any v8
run: 0.1 in final held-out accuracy (what the testbed map saw between a trust region and none); one pooled s.d. of
the reference cells for the curves' measures (reward AUC, early reward, late entropy, mismatch slope); half of
what the pilot showed for the token-level measures (a pilot of 3 seeds flatters): against a constant, each pilot
run's value halfway to it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.power import resample, seeds_for_power  # noqa: E402
from analysis.verdicts import Rule  # noqa: E402

MAP = pd.read_csv(ROOT / "findings" / "map" / "mechanism" / "runs.csv")
V7 = pd.read_csv(ROOT / "findings" / "runs.csv")
PILOT_CSV = ROOT / "findings" / "pilot_v8.csv"
N_MAX = 16
# The pilot (`--pilot`, before the suite file was committed): claim 3's token-level arms at condition B on seeds
# 5100-5102, never v8's. Its rows are the record (findings/pilot_v8.csv); no verdict reads them.
PILOT_SEEDS = (5100, 5101, 5102)
PILOT_ARMS = {
    "grpo_b": ["objective=grpo", "precision=fp32", "trainer.minibatches=4"],
    "relax_both_b": ["objective=grpo_relax", "precision=fp32", "trainer.minibatches=4"],
}


def run_pilot() -> None:
    import yaml

    from analysis.run_metrics import METRICS, load_run
    from analysis.suite import Job, run_jobs

    base = yaml.safe_load((ROOT / "findings" / "map" / "mechanism.yaml").read_text(encoding="utf-8"))["base"]
    folder = ROOT / "findings" / "pilot_v8" / "runs"
    jobs = [
        Job(arm, s, (*base, *overrides, f"seed={s}"), folder / arm / f"seed{s}")
        for s in PILOT_SEEDS
        for arm, overrides in PILOT_ARMS.items()
    ]
    status = run_jobs(jobs, 2)
    rows = []
    for job in jobs:
        m, e = load_run(job.run_dir)
        rows.append(
            {"arm": job.arm, "seed": job.seed, "status": status[job]} | {k: fn(m, e) for k, (fn, _) in METRICS.items()}
        )
    pd.DataFrame(rows).to_csv(PILOT_CSV, index=False)


def cell(model: str, dose: str, arm: str, metric: str) -> np.ndarray:
    rows = MAP[(MAP["phase"] == "conclude") & (MAP["model"] == model) & (MAP["dose"] == dose) & (MAP["arm"] == arm)]
    return rows[metric].astype(float).dropna().to_numpy()


def v7(arm: str, metric: str) -> np.ndarray:
    return V7.loc[(V7["arm"] == arm) & (V7["status"] == "completed"), metric].astype(float).dropna().to_numpy()


def pilot(arm: str, metric: str) -> np.ndarray:
    rows = pd.read_csv(PILOT_CSV)
    return rows.loc[rows["arm"] == arm, metric].astype(float).dropna().to_numpy()


def pooled_sd(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt((a.var(ddof=1) + b.var(ddof=1)) / 2))


RULE = Rule(kind="greater", statistic="superiority")
LESS = Rule(kind="less", statistic="superiority")
NONINF = Rule(kind="noninferior", margin=0.1, statistic="superiority")


def part(
    label: str, k: int, a: np.ndarray, b: np.ndarray | float, effect: float | None, rule: Rule, why: str
) -> dict[str, object]:
    """One part's plan: A moved so that mean(A) - mean(B) = `effect` in the rule's favoured direction; for a part
    against a constant with `effect` None, each of A's values halfway to the constant (a ratio or an excess keeps
    its sign and its spread's shape; a shift would carry a pilot value below the constant)."""
    sign = -1.0 if rule.kind == "less" else 1.0
    b_mean = float(np.mean(b)) if isinstance(b, np.ndarray) else float(b)
    shifted = b_mean + (a - b_mean) / 2 if effect is None else a - float(np.mean(a)) + b_mean + sign * effect
    plan = seeds_for_power(
        resample(shifted), resample(b) if isinstance(b, np.ndarray) else b, rule, n_max=N_MAX,
        confidence=1 - 0.05 / k, experiments=2000,
    )  # fmt: skip
    n = plan.seeds or N_MAX
    return {"label": label, "seeds": n, "power": round(plan.curve[n], 2), "effect": why}


def main() -> None:
    w4, st = ("fixed_scales", "w4a4_fixed"), ("staleness_only", "mb8")
    f_tr, f_none = cell(*w4, "tr", "final_eval"), cell(*w4, "none", "final_eval")
    s_tr, s_none = cell(*st, "tr", "final_eval"), cell(*st, "none", "final_eval")
    spreads_f = "the map's fixed_scales W4A4 cells (DPPO-TV as A, PG-IS as B, 16 seeds each)"
    spreads_s = "the map's staleness-only cells (DPPO-TV as A, PG-IS as B, 16 seeds each)"
    slope_a, slope_b = cell(*w4, "none", "mismatch_slope"), cell(*w4, "tr", "mismatch_slope")
    plans = [
        part("1_1", 3, f_tr, f_none, 0.1, RULE, f"0.1 held-out; {spreads_f}"),
        part(
            "1_2",
            3,
            slope_a,
            slope_b,
            pooled_sd(slope_a, slope_b),
            RULE,
            "one pooled s.d. of the within-run slope; the map's fixed_scales cells (PG-IS as A)",
        ),
        part("1_3", 3, f_tr, f_none, 0.1, RULE, f"0.1 held-out; {spreads_f}"),
        part("2_1", 3, f_tr, f_none, 0.1, RULE, f"0.1 held-out; {spreads_f}"),
        part("2_2", 3, f_tr, f_none, 0.1, RULE, f"0.1 held-out; {spreads_f}"),
        part("2_3", 3, f_tr, f_none, 0.1, RULE, f"0.1 held-out; {spreads_f}"),
    ]
    auc_a, auc_b = v7("relax_both_o", "reward_auc"), v7("grpo_o", "reward_auc")
    plans.append(
        part(
            "3_1",
            6,
            auc_a,
            auc_b,
            pooled_sd(auc_a, auc_b),
            RULE,
            "one pooled s.d. of reward AUC; v7's relax_both_o and grpo_o (W4A4, 8 updates)",
        )
    )
    for label, metric in (("3_2", "lowmu_enrichment_pos"), ("3_3", "lowmu_enrichment_neg")):
        x = pilot("grpo_b", metric)
        plans.append(
            part(
                label,
                6,
                x,
                1.0,
                None,
                RULE,
                f"each pilot run's enrichment halfway to 1 (pilot mean {np.mean(x):.2f}, {len(x)} seeds)",
            )
        )
    for label, metric in (("3_4", "clipped_mu_pos"), ("3_5", "clipped_mu_neg")):
        a, b = pilot("relax_both_b", metric), pilot("grpo_b", metric)
        plans.append(
            part(
                label,
                6,
                a,
                b,
                (float(np.mean(a)) - float(np.mean(b))) / 2,
                RULE,
                f"half the pilot's difference ({np.mean(a) - np.mean(b):+.3f}, {len(a)} vs {len(b)} seeds)",
            )
        )
    x = pilot("grpo_b", "clipped_entropy_excess")
    plans.append(
        part(
            "3_6",
            6,
            x,
            0.0,
            None,
            RULE,
            f"each pilot run's excess halved (pilot mean {np.mean(x):.2f}, {len(x)} seeds)",
        )
    )
    er_a, er_b = v7("relax_low_o", "early_reward"), v7("grpo_o", "early_reward")
    en_a, en_b = v7("relax_low_o", "late_entropy"), v7("grpo_o", "late_entropy")
    plans += [
        part("4_1", 3, er_a, er_b, pooled_sd(er_a, er_b), RULE,
             "one pooled s.d. of early reward; v7's relax_low_o and grpo_o"),
        part("4_2", 3, en_a, en_b, pooled_sd(en_a, en_b), LESS,
             "one pooled s.d. of late entropy; v7's relax_low_o and grpo_o"),
        part("4_3", 3, s_tr, s_none, 0.1, RULE, f"0.1 held-out; {spreads_s}"),
        part("8_1", 2, f_tr, f_tr, 0.0, NONINF, "none (non-inferiority, margin 0.1); DPPO-TV's W4A4 cell as both"),
        part("8_2", 2, f_tr, f_none, 0.1, RULE, f"0.1 held-out; {spreads_f}"),
        part("9_1", 1, s_tr, s_none, 0.1, RULE, f"0.1 held-out; {spreads_s}"),
        part("10_1", 1, s_tr, s_none, 0.1, RULE, f"0.1 held-out; {spreads_s}"),
    ]  # fmt: skip
    for p in plans:
        print(f'POWER_{p["label"]}: {{seeds: {p["seeds"]}, power: {p["power"]}, effect: "{p["effect"]}"}}')


if __name__ == "__main__":
    run_pilot() if "--pilot" in sys.argv else main()
