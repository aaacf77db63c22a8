"""How the runs that broke, broke: a description of run folders already made (CALIBRATION.md section 14), not a
verdict. A run broke as in the suite's arms table (`collapsed`, or held-out accuracy ended below 0.10). Its mode is
read from its last 10 steps of rollouts: "length cap" when at least half the responses hit max_new_tokens (the end
token was lost), "no box" when at least half finished without a gradable box, else "finished, wrong". Its fall is
the number of steps from the last step whose 3-step mean training reward was at least 0.2 to the first step of a
run of steps with reward below 0.05 that lasts to the end ("-" when the run has no such ending).
Usage: PYTHONPATH=. python findings/calib/failure_modes.py ROOT... (folders holding run folders, at any depth)"""

import sys
from pathlib import Path

import pandas as pd

from analysis.findings import METRICS, load_run, run_broke
from analysis.suite import run_status

TAIL, DEAD, ALIVE = 10, 0.05, 0.2
NO_TRUST_REGION = ("pg_is", "pgis", "pg_tis", "ref", "no_mismatch")  # the arms' names in suites and calibrations


def flat_from(reward: pd.Series) -> int | None:
    """Position of the first step of the stretch below DEAD training reward that lasts to the end, None without one."""
    dead = (reward < DEAD).to_numpy()
    return next((i for i in range(len(dead)) if dead[i:].all()), None)


def fall(reward: pd.Series) -> int | None:
    """Steps from the last healthy 3-step mean to the start of the terminal dead stretch, None without one."""
    alive = (reward.rolling(3).mean() >= ALIVE).to_numpy()
    start = flat_from(reward)
    if start is None:
        return None
    before = [i for i in range(start) if alive[i]]
    return start - before[-1] if before else None


def describe(run: Path, root: Path) -> dict:
    m, e = load_run(run)
    final = METRICS["final_eval"][0](m, e)
    tail = m.sort_values("step").tail(TAIL)
    if tail["rollout/truncated_frac"].mean() >= 0.5:
        mode = "length cap"
    elif tail["reward/format_fail_frac"].mean() >= 0.5:
        mode = "no box"
    else:
        mode = "finished, wrong"
    name = str(run.relative_to(root))
    return {
        "run": f"{root.name}/{name}",
        "trust region": "no" if name.startswith(NO_TRUST_REGION) else "yes",
        "broke": run_broke(m, e),
        "mode": mode,
        "fall": fall(m.sort_values("step")["reward/mean"].reset_index(drop=True)),
        "truncated": tail["rollout/truncated_frac"].mean(),
        "length": tail["rollout/response_len_mean"].mean(),
        "final": final,
    }


def main(roots: list[Path]) -> None:
    rows = [
        describe(s.parent, root)
        for root in roots
        for s in sorted(root.rglob("summary.json"))
        if run_status(s.parent) == "completed"
    ]
    df = pd.DataFrame(rows)
    broke = df[df.broke]
    print(f"{len(df)} runs, {len(broke)} broke\n")
    print("| run | mode | fall (steps) | truncated, last 10 | response length, last 10 | final held-out |")
    print("|---|---|---|---|---|---|")
    for r in broke.itertuples():
        f = "-" if pd.isna(r.fall) else f"{int(r.fall)}"
        print(f"| {r.run} | {r.mode} | {f} | {r.truncated:.2f} | {r.length:.1f} | {r.final:.3f} |")
    print("\n| trust region | runs | broke | length cap | no box | finished, wrong |\n|---|---|---|---|---|---|")
    for tr, g in df.groupby("trust region"):
        b = g[g.broke]
        counts = [int((b["mode"] == k).sum()) for k in ("length cap", "no box", "finished, wrong")]
        print(f"| {tr} | {len(g)} | {len(b)} | " + " | ".join(map(str, counts)) + " |")


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]])
