"""Suite v8's preregistration checks (analysis/suite_checks.py) and its report fields: a quote per part, arms that
differ in one thing, a rule on every endpoint, a positive control read from the mechanism map, the planned power;
endpoints decided beside the primary part; a claim without a control runs nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from analysis import suite as suite_mod
from analysis.verdicts import NOT_TESTABLE, REPRODUCED
from tests.test_findings import report, write_run

SEEDS = [0, 1, 2, 3, 4, 5]
QUOTE = "Without a trust region the mismatch grows and training collapses."
POWER = {"seeds": 6, "power": 0.8, "effect": 0.3, "spreads": "planted"}


def v8_suite(tmp_path: Path, control: dict[str, bool], finals: dict[str, list[float]]) -> Path:
    """Arms pg (PG-IS) and tr (DPPO) at condition F, whose control is the map model `fixed` (positive or not, as
    `control` says, through a mechanism.json of its own), and arm ref (PG-IS without the dose)."""
    (tmp_path / "mechanism.json").write_text(json.dumps({"models": {
        name: {"positive_control": value, "status": "concluded"} for name, value in control.items()}}))  # fmt: skip
    for arm, values in finals.items():
        for seed, value in zip(SEEDS, values, strict=True):
            write_run(tmp_path / "runs" / arm / f"seed{seed}", [value] * 8, value)
    raw = {
        "version": 8,
        "base": ["rollout=hf"],
        "seeds": SEEDS,
        "arms": {
            "pg": ["objective=pg_is", "precision=w4a4_rollout"],
            "tr": ["objective=dppo", "precision=w4a4_rollout"],
            "ref": ["objective=pg_is"],
        },
        "conditions": {"F": {"what": "fixed-scale W4A4 copy", "control": "fixed", "map": "mechanism.json"}},
        "claims": [{
            "id": 1, "claim": "DPPO keeps it stable", "paper": "DPPO Fig. 3", "condition": "F",
            "parts": [{
                "a": "tr", "b": "pg", "metric": "final_eval", "quote": QUOTE, "power": POWER,
                "rule": {"kind": "greater_by", "margin": 0.05},
                "endpoints": [{"metric": "broke", "rule": {"kind": "less", "statistic": "rate"}}],
            }],
        }],
    }  # fmt: skip
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


FINALS = {"tr": [0.30, 0.31, 0.29, 0.30, 0.32, 0.30], "pg": [0.05, 0.02, 0.20, 0.04, 0.01, 0.22]}


def test_a_v8_part_reports_its_quote_power_endpoints_and_computed_control(tmp_path):
    doc = report(v8_suite(tmp_path, {"fixed": True}, FINALS))
    one = doc["by_id"][1]
    part = one["parts"][0]
    assert doc["version"] == 8
    assert one["verdict"] == REPRODUCED and one["positive_control"] is True
    assert one["control"]["model"] == "fixed" and "concluded" in one["control"]["evidence"]
    assert part["quote"] == QUOTE and part["power"] == POWER
    # pg broke in 4 of 6 runs (final below 0.1), tr in none: a rate difference of -4/6.
    [broke] = part["endpoints"]
    assert broke["metric"] == "broke" and broke["effect"] == pytest.approx(-4 / 6)
    assert broke["method"].startswith("Newcombe") and broke["verdict"] == REPRODUCED
    md = (tmp_path / "FINDINGS.md").read_text()
    assert f'| "{QUOTE}" |' in md and "endpoint `broke` rate (less, margin 0)" in md
    assert "computed by the mechanism map for `fixed`" in md


def test_a_condition_without_a_computed_control_runs_nothing_and_is_not_testable(tmp_path):
    path = v8_suite(tmp_path, {"fixed": False}, FINALS)
    suite = suite_mod.Suite.load(path)
    assert suite.jobs_for(suite.claims, suite.seeds, tmp_path / "runs") == []
    one = report(path)["by_id"][1]
    assert one["verdict"] == NOT_TESTABLE and one["parts"][0]["endpoints"][0]["verdict"] == NOT_TESTABLE


def _edit(path: Path, fn) -> None:
    raw = yaml.safe_load(path.read_text())
    fn(raw)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r["claims"][0]["parts"][0].pop("quote"), r"claim 1: part tr vs pg has no `quote`"),
        (lambda r: r["claims"][0]["parts"][0].update(b="ref"),
         r"part tr vs ref: the arms differ in both objective and condition"),
        (lambda r: r["claims"][0]["parts"][0]["endpoints"][0].pop("rule"), r"endpoint 1 \(broke\) has no rule"),
        (lambda r: r["claims"][0]["parts"][0]["endpoints"][0].update(metric="brok"),
         r"endpoint 1: metric 'brok' is not one of"),
        (lambda r: r["claims"][0]["parts"][0]["endpoints"][0].update(rule={"kind": "bigger"}),
         r"endpoint 1: rule .*'bigger' is not one of"),
        (lambda r: r["claims"][0]["parts"][0].pop("power"), r"`power` must be the preregistered power analysis"),
        (lambda r: r["conditions"]["F"].pop("control"),
         r"claim 1: its rule asks for a positive control, but condition 'F' names no mechanism-map model"),
        (lambda r: r["conditions"]["F"].update(positive_control=True),
         r"conditions.F.positive_control is written by hand"),
    ],
)  # fmt: skip
def test_what_v8_must_state_is_refused_in_one_line_before_any_run(tmp_path, edit, message):
    path = v8_suite(tmp_path, {"fixed": True}, FINALS)
    suite_mod.Suite.load(path)  # the file as written loads
    _edit(path, edit)
    with pytest.raises(SystemExit, match=message) as e:
        suite_mod.Suite.load(path)
    assert "\n" not in str(e.value)


def test_one_change_is_allowed_either_way_and_a_claim_may_declare_it_needs_no_control(tmp_path):
    path = v8_suite(tmp_path, {"fixed": True}, FINALS)
    # the objective alone (tr vs pg) loads; the condition alone (pg vs ref) too
    _edit(path, lambda r: r["claims"][0]["parts"][0].update(a="pg", b="ref"))
    suite_mod.Suite.load(path)
    _edit(path, lambda r: (r["conditions"]["F"].pop("control"), r["claims"][0].update(needs_control=False)))
    assert suite_mod.Suite.load(path).claims[0]["needs_control"] is False


def test_a_staleness_condition_reads_the_staleness_control_and_refuses_a_mismatch_claim(tmp_path):
    """The staleness-only cell's `positive_control` is false by construction ((iii) reads 0): a condition resting
    on it reads its `staleness_control`; claims 1, 2 and 8 are about the mismatch and may not rest on it."""
    path = v8_suite(tmp_path, {"fixed": True}, FINALS)
    (tmp_path / "mechanism.json").write_text(json.dumps({"models": {"stale": {
        "kind": "staleness", "positive_control": False, "staleness_control": True, "status": "decided"}}}))  # fmt: skip
    _edit(path, lambda r: (r["conditions"]["F"].update(control="stale"), r["claims"][0].update(id=3)))
    claim = suite_mod.Suite.load(path).claims[0]
    assert claim["positive_control"] is True
    _edit(path, lambda r: r["claims"][0].update(id=8))
    with pytest.raises(SystemExit, match=r"claim 8 is about the mismatch; condition 'F' rests on the staleness-only"):
        suite_mod.Suite.load(path)


def test_a_part_that_needs_no_control_runs_and_is_decided_while_its_claim_is_not_testable(tmp_path):
    """Claim 3's parts on which tokens a clip selects hold or fail whether or not a trust region changes the score:
    `needs_control: false` runs their arms at a condition without a control, decides them, and leaves the rest
    of the claim not testable (the claim reads `parts differ`)."""
    path = v8_suite(tmp_path, {"fixed": False}, FINALS | {"ref": [0.30, 0.31, 0.29, 0.30, 0.32, 0.30]})
    no_control = {
        "a": "ref", "b": 0.1, "metric": "final_eval", "quote": QUOTE, "power": POWER,
        "rule": {"kind": "greater", "statistic": "superiority"}, "needs_control": False,
        "why_no_control": "a description of one arm",
    }  # fmt: skip
    _edit(path, lambda r: r["claims"][0]["parts"].append(no_control))
    suite = suite_mod.Suite.load(path)
    jobs = suite.jobs_for(suite.claims, suite.seeds, tmp_path / "runs")
    assert {j.arm for j in jobs} == {"ref"} and len(jobs) == 6
    one = report(path)["by_id"][1]
    first, second = one["parts"]
    assert first["verdict"] == NOT_TESTABLE and first["endpoints"][0]["verdict"] == NOT_TESTABLE
    # every one of 6 seeds above 0.1: P(A > c) = 1, Clopper-Pearson lower bound 0.025^(1/6) = 0.54 > 1/2
    assert second["verdict"] == REPRODUCED and second["effect"] == pytest.approx(0.5)
    assert one["verdict"] == "parts differ"
    _edit(path, lambda r: r["claims"][0]["parts"][1].pop("why_no_control"))
    with pytest.raises(SystemExit, match="needs_control may only be false, with `why_no_control`"):
        suite_mod.Suite.load(path)
