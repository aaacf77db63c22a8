"""What a v8+ suite file must state before any run, each refused in one line naming the claim and what is allowed
(issue 60): a part quotes the paper sentence it tests, changes one thing, carries the power analysis it was planned
with, and every endpoint has its rule; a claim whose mechanism needs a positive control runs at a condition whose
control the mechanism map computes (`control: <model>`), never at one declared by hand.

Objective and condition are told apart by the override's key: `objective=...` and `objective.*` are the objective,
everything else (precision, rollout.*, trainer.*) the condition. Two arms differing in both compare two things at
once (v7's claim 8: DRPO at delta 12.5 with the dose against PG-IS without it)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from analysis.run_metrics import METRICS
from analysis.verdicts import Rule

# The papers' claims about the mismatch itself (papers.md numbering: PG-IS collapses as mu drifts, the anchor of the
# mask, DRPO under mismatch): they need a mismatch model's positive control; a staleness control does not do.
MISMATCH_CLAIMS = (1, 2, 8)
POWER_KEYS = ("seeds", "power")  # at least: the seeds per arm it gave, and the power it was computed for


def _split(overrides: Sequence[str]) -> tuple[frozenset[str], frozenset[str]]:
    """(objective overrides, condition overrides) of an arm."""
    objective = frozenset(o for o in overrides if o.split("=", 1)[0].lstrip("+~").split(".")[0] == "objective")
    return objective, frozenset(overrides) - objective


def changed(a: Sequence[str], b: Sequence[str]) -> list[str]:
    """What differs between two arms' overrides: "objective", "condition", both or neither."""
    (oa, ca), (ob, cb) = _split(a), _split(b)
    return [name for name, differs in (("objective", oa != ob), ("condition", ca != cb)) if differs]


def check_part(where: str, part: dict[str, Any], arms: dict[str, list[str]]) -> None:
    """A v8 part: a quote, one change between its arms, a power block, and a rule on every endpoint."""
    quote = part.get("quote")
    if not isinstance(quote, str) or not quote.strip():
        raise SystemExit(
            f"{where}: part {part.get('a')} vs {part.get('b')} has no `quote`: quote the paper sentence it tests"
        )
    b = part.get("b")
    if isinstance(b, str) and part.get("a") in arms and b in arms:
        diff = changed(arms[part["a"]], arms[b])
        if len(diff) == 2:
            raise SystemExit(
                f"{where}: part {part['a']} vs {b}: the arms differ in both objective and condition; "
                "allowed: arms that differ in one of them"
            )
    if "needs_control" in part and (part["needs_control"] is not False or not part.get("why_no_control")):
        raise SystemExit(
            f"{where}: part {part.get('a')} vs {b}: needs_control may only be false, with `why_no_control` saying "
            "why the part is decided without the claim's control"
        )
    power = part.get("power")
    if not isinstance(power, dict) or any(k not in power for k in POWER_KEYS):
        raise SystemExit(
            f"{where}: part {part.get('a')} vs {b}: `power` must be the preregistered power analysis, a mapping with "
            f"at least {', '.join(POWER_KEYS)}"
        )
    for i, endpoint in enumerate(part.get("endpoints") or []):
        name = f"{where}: part {part.get('a')} vs {b}: endpoint {i + 1}"
        if not isinstance(endpoint, dict) or endpoint.get("metric") not in METRICS:
            got = endpoint.get("metric") if isinstance(endpoint, dict) else endpoint
            raise SystemExit(f"{name}: metric {got!r} is not one of {', '.join(METRICS)}")
        if not isinstance(endpoint.get("rule"), dict):
            raise SystemExit(f"{name} ({endpoint['metric']}) has no rule: write its `rule:` before any run")
        try:
            Rule(**endpoint["rule"])
        except (TypeError, ValueError) as e:
            raise SystemExit(f"{name}: rule {endpoint['rule']!r}: {e}") from None


def check_claim(
    path: Path, claim: dict[str, Any], conditions: dict[str, dict[str, Any]], arms: dict[str, list[str]]
) -> None:
    """A v8 claim that runs on CPU: its control (computed, when its mechanism needs one) and its parts."""
    where = f"error: {path}: claim {claim.get('id')}"
    if not claim.get("cpu", True):
        return
    needs = claim.get("needs_control", True)
    if needs not in (True, False):
        raise SystemExit(f"{where}: needs_control is {needs!r}; allowed: true, false")
    cond = conditions.get(str(claim.get("condition")))
    if needs and (cond is None or "control" not in cond):
        raise SystemExit(
            f"{where}: its rule asks for a positive control, but condition {claim.get('condition')!r} names no "
            "mechanism-map model (`control: <model>` under conditions); or set needs_control: false"
        )
    for part in claim.get("parts", []):
        check_part(where, part, arms)
