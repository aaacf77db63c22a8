"""Side by side: one suite's verdicts from two machines (two findings.json files of the same suite file).

A description for the README, not a verdict: the two reports are not pooled (CALIBRATION.md sections 10c, 23).
Prints a markdown table, one row per part of every claim, then each machine's broken-run count per arm.

    python findings/calib/compare_machines.py findings/v5/first_machine/findings.json findings/findings.json \
        --names "first machine (2026-12-04)" "second machine (2026-12-05)"
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _cell(part: dict) -> str:
    verdict = part["verdict"]
    shown = f"**{verdict}**" if verdict != "inconclusive" else verdict
    return f"{part['effect']:+.3f} [{part['ci_low']:+.3f}, {part['ci_high']:+.3f}] {shown}"


def _rule(part: dict) -> str:
    rule = part["rule"]
    return f"{rule['kind'].replace('_', ' ')} {rule['margin']:g}"


def parts_table(a: dict, b: dict, names: tuple[str, str]) -> list[str]:
    lines = [f"| claim | part (rule) | {names[0]} | {names[1]} |", "|---|---|---|---|"]
    by_id = {c["id"]: c for c in b["claims"]}
    for claim in a["claims"]:
        other = by_id.get(claim["id"])
        if other is None or "parts" not in claim:
            continue
        head = f"{claim['id']}: {claim['verdict']} / {other['verdict']}"
        for i, (pa, pb) in enumerate(zip(claim["parts"], other["parts"], strict=True)):
            if (pa["a"], pa["b"], pa["metric"]) != (pb["a"], pb["b"], pb["metric"]):
                raise SystemExit(f"claim {claim['id']} part {i}: the two files are not the same suite")
            label = f"{pa['a']} vs {pa['b']}, {pa['metric']} ({_rule(pa)})"
            lines.append(f"| {head if i == 0 else ''} | {label} | {_cell(pa)} | {_cell(pb)} |")
    return lines


def broken_table(a: dict, b: dict, names: tuple[str, str]) -> list[str]:
    lines = [f"| arm | broke, {names[0]} | broke, {names[1]} |", "|---|---|---|"]
    arms_b = {row["arm"]: row for row in b["arms"]}
    for row in a["arms"]:
        other = arms_b.get(row["arm"])
        if other is None:
            continue
        lines.append(f"| {row['arm']} | {row['broke']} of {row['seeds']} | {other['broke']} of {other['seeds']} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("--names", nargs=2, default=("first", "second"))
    args = parser.parse_args()
    a, b = (json.loads(p.read_text()) for p in (args.first, args.second))
    names = tuple(args.names)
    decided = [sum(c["verdict"] != "inconclusive" for c in d["claims"] if c.get("cpu", True)) for d in (a, b)]
    print("\n".join(parts_table(a, b, names)))
    print()
    print("\n".join(broken_table(a, b, names)))
    print()
    print(f"decided: {decided[0]} ({names[0]}), {decided[1]} ({names[1]})")


if __name__ == "__main__":
    main()
