"""One table of every benchmark's targets: the ``summary`` rows of bench/results/*.json, in file order.

Run: ``python -m bench.summary [--results DIR]``

Each results file (written through bench.common.write_results) carries ``"summary": [{"id", "case", "metric",
"value", "target", "met"}, ...]``; this script only reads and prints them, so it always exits 0: a missed
target is a finding to read, not a failure of the run. Files without a summary block are named and skipped.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.common import RESULTS_DIR, format_summary

ORDER = ("logprobs", "topk", "rollout", "rl_step", "objectives", "async_step")  # B1, B2, B3, B4, B5, B6


def load_summaries(results: Path) -> tuple[list[dict], list[str]]:
    """(all summary rows, notes on files that had none)."""
    files = sorted(results.glob("*.json"), key=lambda p: (ORDER.index(p.stem) if p.stem in ORDER else len(ORDER), p))
    rows, notes = [], []
    for path in files:
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            notes.append(f"{path.name}: unreadable ({e})")
            continue
        summary = result.get("summary")
        if summary:
            rows += summary
        elif "trl" in result.get("meta", {}) and result["meta"]["trl"] is None:
            # B4's targets are ratios to TRL: a run without TRL timed the harness alone and has nothing to check.
            notes.append(f"{path.name}: no target checked: trl was not installed, so no baseline (make bench)")
        elif summary is not None:
            notes.append(f"{path.name}: no target checked (its rows are in the file)")
        else:
            notes.append(f"{path.name}: no summary block (written before bench.common, or by an older script)")
    return rows, notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    rows, notes = load_summaries(args.results)
    if rows:
        print(format_summary(rows))
        met = sum(bool(r["met"]) for r in rows)
        print(f"{met}/{len(rows)} targets met")
    else:
        print(f"no summary rows in {args.results}")
    for note in notes:
        print(note)


if __name__ == "__main__":
    main()
