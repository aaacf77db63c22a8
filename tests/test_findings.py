"""The findings suite's statistics and verdicts, on synthetic run directories with planted effects."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import yaml

from analysis import suite as suite_mod
from analysis.verdicts import (
    INCONCLUSIVE,
    MIXED,
    NOT_TESTABLE,
    OPPOSITE,
    REPRODUCED,
    SMALLER,
    Rule,
    compare,
    decide,
    holm,
    mean_difference_interval,
    mean_minus_constant_interval,
    probability_of_improvement,
    rate_difference_interval,
    summarize,
)

SEEDS = [0, 1, 2]


def write_run(run_dir: Path, rewards: list[float], final_eval: float, status: str = "completed") -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "metrics.jsonl", "w") as f:
        for step, r in enumerate(rewards, start=1):
            f.write(json.dumps({"step": step, "reward/mean": r, "mismatch/abs_prob_diff_mean": 0.01,
                                "mismatch/abs_prob_diff_max": 0.6, "rollout/entropy": 1.0}) + "\n")  # fmt: skip
    with open(run_dir / "eval.jsonl", "w") as f:
        f.write(json.dumps({"step": 0, "avg@1": 0.2}) + "\n")
        f.write(json.dumps({"step": len(rewards), "avg@1": final_eval}) + "\n")
    summary = {"status": status, "error": None if status == "completed" else "RuntimeError: boom", "wall_time_s": 60.0}
    (run_dir / "summary.json").write_text(json.dumps(summary))


def make_suite(tmp_path: Path, arms: dict[str, list[float]], failed: tuple[str, int] | None = None) -> Path:
    """Arms with a per-seed final eval; reward curves flat at that value. Returns the suite file."""
    for arm, finals in arms.items():
        for seed, value in zip(SEEDS, finals, strict=True):
            status = "failed" if failed == (arm, seed) else "completed"
            write_run(tmp_path / "runs" / arm / f"seed{seed}", [value] * 8, value, status)
    suite = {
        "base": ["rollout=hf"],
        "seeds": SEEDS,
        "arms": {arm: [f"objective={arm}"] for arm in arms},
        "claims": [
            {"id": 1, "claim": "A beats B", "paper": "Fig. X", "parts": [
                {"a": "a", "b": "b", "metric": "final_eval", "rule": {"kind": "greater", "margin": 0.02}}]},
            {"id": 2, "claim": "A ~ C", "paper": "Fig. Y", "parts": [
                {"a": "a", "b": "c", "metric": "final_eval", "rule": {"kind": "equivalent", "margin": 0.2}}]},
            {"id": 5, "claim": "at scale", "paper": "Fig. 8", "cpu": False, "why": "needs 30B"},
        ],
    }  # fmt: skip
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    return path


def refused_suite(folder: Path) -> Path:
    """A one-run suite whose only arm run.py refuses (an unknown objective): a real run.py process, ended in
    seconds."""
    suite = {
        "base": ["rollout=hf", "logger=none"], "seeds": [0], "arms": {"bad": ["objective=nope"]},
        "claims": [{"id": 1, "claim": "bad > 0", "paper": "Fig. X", "parts": [
            {"a": "bad", "b": 0.0, "metric": "final_eval", "rule": {"kind": "greater", "min_seeds": 2}}]}],
    }  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    return path


def report(path: Path) -> dict:
    code = suite_mod.main(["--suite", str(path), "--report-only"])
    doc = json.loads((path.parent / "findings.json").read_text())
    doc["exit_code"] = code
    return {**doc, "by_id": {c["id"]: c for c in doc["claims"]}}


def test_planted_effect_is_found_and_equivalence_holds(tmp_path):
    doc = report(make_suite(tmp_path, {"a": [0.50, 0.55, 0.60], "b": [0.10, 0.12, 0.09], "c": [0.52, 0.55, 0.57]}))
    one, two = doc["by_id"][1], doc["by_id"][2]
    assert one["verdict"] == REPRODUCED
    assert one["effect"] == pytest.approx(0.55 - (0.10 + 0.12 + 0.09) / 3)
    # Welch: s_a^2 / 3 = 0.0025 / 3, s_b^2 / 3 = 0.000233 / 3, df 2.37, t 3.72: 0.4467 +- 0.1122
    assert (one["ci_low"], one["ci_high"]) == pytest.approx((0.3344, 0.5589), abs=1e-4)
    assert one["parts"][0]["method"] == "Welch t"
    assert one["seeds"] == 3 and one["parts"][0]["prob_a_better"] == 1.0
    assert one["arms"]["a"]["mismatch_abs_mean"] == pytest.approx(0.01)  # the step-1 mismatch is recorded
    assert two["verdict"] == REPRODUCED
    assert doc["by_id"][5]["verdict"] == "not tested"
    assert doc["exit_code"] == 0 and doc["runs_time_s"] == 9 * 60.0  # every run on disk, though this pass ran none
    md = (tmp_path / "FINDINGS.md").read_text()
    assert "| 1. Fig. X | a vs b, `final_eval` (greater 0.02) | base | 0.447 [0.334, 0.559] | 3/3 | reproduced | " in md
    assert "**reproduced**" in md


def test_no_effect_is_inconclusive_and_a_reversed_one_opposite(tmp_path):
    same = report(make_suite(tmp_path / "same", {"a": [0.5, 0.6, 0.4], "b": [0.45, 0.62, 0.5], "c": [0.5, 0.6, 0.4]}))
    assert same["by_id"][1]["verdict"] == INCONCLUSIVE
    rev = report(make_suite(tmp_path / "rev", {"a": [0.1, 0.12, 0.09], "b": [0.5, 0.55, 0.6], "c": [0.9, 0.9, 0.95]}))
    assert rev["by_id"][1]["verdict"] == OPPOSITE
    assert rev["by_id"][2]["verdict"] == OPPOSITE  # far outside the equivalence band: a difference was seen


def test_a_failed_run_makes_its_claims_inconclusive_and_the_suite_fail(tmp_path):
    doc = report(make_suite(tmp_path, {"a": [0.5, 0.55, 0.6], "b": [0.1, 0.12, 0.09], "c": [0.5, 0.55, 0.6]}, ("a", 1)))
    assert doc["by_id"][1]["verdict"] == INCONCLUSIVE and doc["by_id"][2]["verdict"] == INCONCLUSIVE
    assert doc["by_id"][1]["arms"]["a"]["failed"] == [{"seed": 1, "error": "RuntimeError: boom"}]
    assert {a["arm"]: a["seeds"] for a in doc["arms"]} == {"a": 2, "b": 3, "c": 3}  # completed seeds only
    assert doc["exit_code"] == 1 and doc["failed_runs"] == 1 and doc["runs_time_s"] == 8 * 60.0  # completed runs only
    assert "RuntimeError: boom" in (tmp_path / "FINDINGS.md").read_text()


def test_the_arms_table_counts_broken_runs_with_exact_intervals(tmp_path):
    """Arm a ends 0.30 / 0.30 / 0.05: one run broke (held-out below 0.10). Arm c's seed 0 ends at 0.30 but its
    training reward fell to 0 in the last quarter (`collapsed`): it broke too. Arm b never broke.
    a's mean 0.2167 with the t interval 0.2167 +- 4.303 * 0.1443 / sqrt(3) = [-0.1419, 0.5752]; Clopper-Pearson for
    1 of 3 is [0.0084, 0.9057], for 0 of 3 [0, 0.7076]."""
    path = make_suite(tmp_path, {"a": [0.30, 0.30, 0.05], "b": [0.2, 0.2, 0.2], "c": [0.3, 0.31, 0.29]})
    write_run(tmp_path / "runs" / "c" / "seed0", [0.5] * 6 + [0.0] * 2, 0.30)
    doc = report(path)
    arms = {a["arm"]: a for a in doc["arms"]}
    a, b, c = arms["a"], arms["b"], arms["c"]
    assert a["seeds"] == 3 and a["final_eval_mean"] == pytest.approx(0.65 / 3)
    assert a["final_eval_ci"] == pytest.approx([-0.1419, 0.5752], abs=1e-4)
    assert a["final_eval_per_seed"] == {"0": 0.3, "1": 0.3, "2": 0.05}
    assert a["eval_gain_median"] == pytest.approx(0.1)  # step 0 scored 0.2: gains 0.1, 0.1, -0.15
    assert a["broke"] == 1 and a["broke_ci"] == pytest.approx([0.0084, 0.9057], abs=1e-4)
    assert b["broke"] == 0 and b["broke_ci"] == pytest.approx([0.0, 0.7076], abs=1e-4)
    assert b["final_eval_ci"] == pytest.approx([0.2, 0.2])  # no spread: the mean is exact
    assert c["broke"] == 1 and c["broke_seeds"] == [0] and a["broke_seeds"] == [2]
    assert a["mismatch_abs_mean_step1"] == pytest.approx(0.01)
    md = (tmp_path / "FINDINGS.md").read_text()
    assert "| a | 3 | 0.217 | [-0.142, 0.575] | 0.300 / 0.300 / 0.050 | 0.1 | 1 of 3 | [0.0084, 0.91] | 0.01 |" in md
    assert doc["arms_figure"] == "figures/arms.png" and "Figure: [figures/arms.png](figures/arms.png)" in md
    assert (tmp_path / "figures" / "arms.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_rate_statistic_gives_newcombes_worked_intervals():
    """Newcombe (1998), Table II, method 10: 56/70 - 48/80 is 0.2000 [0.0524, 0.3339]; 9/10 - 3/10 is 0.6
    [0.1705, 0.8090]; 5/48 - 0/48 (hand, from Wilson's bounds) clears 0, 4/48 - 0/48 does not."""
    ones = lambda k, n: [1.0] * k + [0.0] * (n - k)  # noqa: E731
    assert rate_difference_interval(ones(56, 70), ones(48, 80)) == pytest.approx((0.2, 0.0524, 0.3339), abs=1e-4)
    assert rate_difference_interval(ones(9, 10), ones(3, 10)) == pytest.approx((0.6, 0.1705, 0.8090), abs=1e-4)
    assert rate_difference_interval(ones(5, 48), ones(0, 48))[1] == pytest.approx(0.00954, abs=1e-5)
    assert rate_difference_interval(ones(4, 48), ones(0, 48))[1] < 0
    with pytest.raises(ValueError, match="other than 0 and 1"):
        rate_difference_interval([0.3, 1.0], [0.0, 1.0])
    with pytest.raises(ValueError, match="rule.statistic: 'median' is not one of mean, rate"):
        Rule("greater", statistic="median")


def test_a_collapse_rate_is_found_by_the_rate_statistic(tmp_path):
    """24 seeds per arm: arm a breaks in 6 (held-out 0.05), b in none. The `rate` part sees 6/24 - 0/24 = 0.25 with
    Newcombe's interval [0.0604, 0.4490] (by hand: Wilson 6/24 is [0.1200, 0.4490], 0/24 is [0, 0.1380]; 0.25 -
    hypot(0.13, 0.138)); the `mean` part, a Welch interval on the 0/1 values, also sees 0.25. With 2 of 24 broken
    the rate's interval reaches below 0: inconclusive."""
    seeds = list(range(24))

    def suite(folder: Path, broken: int) -> Path:
        for arm, k in (("a", broken), ("b", 0)):
            for seed in seeds:
                write_run(folder / "runs" / arm / f"seed{seed}", [0.5] * 8, 0.05 if seed < k else 0.30)
        part = {"a": "a", "b": "b", "metric": "broke"}
        doc = {
            "base": ["rollout=hf"], "seeds": seeds, "arms": {"a": ["objective=pg_is"], "b": ["objective=dppo"]},
            "claims": [
                {"id": 1, "claim": "a breaks more often", "paper": "Fig. 3",
                 "parts": [{**part, "rule": {"kind": "greater", "statistic": "rate"}}]},
                {"id": 2, "claim": "the same, by the mean", "paper": "Fig. 3",
                 "parts": [{**part, "rule": {"kind": "greater"}}]},
            ],
        }  # fmt: skip
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "suite.yaml").write_text(yaml.safe_dump(doc))
        return folder / "suite.yaml"

    six = report(suite(tmp_path / "six", 6))["by_id"]
    rate, by_mean = six[1], six[2]
    assert rate["verdict"] == REPRODUCED and rate["metric"] == "broke" and rate["seeds"] == 24
    assert (rate["effect"], rate["ci_low"], rate["ci_high"]) == pytest.approx((0.25, 0.0604, 0.4490), abs=1e-4)
    assert by_mean["effect"] == pytest.approx(0.25) and by_mean["parts"][0]["method"] == "Welch t"
    header, *rows = (tmp_path / "six" / "runs.csv").read_text().splitlines()
    broke = header.split(",").index("broke")
    assert sorted(r.split(",")[broke] for r in rows if "/a/" in r) == ["0.0"] * 18 + ["1.0"] * 6
    md = (tmp_path / "six" / "FINDINGS.md").read_text()
    assert "- a vs b on `broke` rate (greater, margin 0):" in md and "| 6 of 24 |" in md
    two = report(suite(tmp_path / "two", 2))["by_id"][1]
    assert two["verdict"] == INCONCLUSIVE and two["effect"] == pytest.approx(2 / 24) and two["ci_low"] < 0


def test_statistics_match_hand_values():
    # Welch, equal spreads: se = sqrt(1/3 + 1/3) = 0.8165, df = 4, t_0.975,4 = 2.7764: -3 +- 2.2670
    assert mean_difference_interval([1, 2, 3], [4, 5, 6]) == pytest.approx((-3.0, -5.2670, -0.7330), abs=1e-4)
    # one sample against 0: se = 1 / sqrt(3), df = 2, t = 4.3027: 2 +- 2.4841 (the difference, not the mean)
    assert mean_minus_constant_interval([1, 2, 3], 0.0) == pytest.approx((2.0, -0.4841, 4.4841), abs=1e-4)
    assert mean_minus_constant_interval([1, 2, 3], 1.0) == pytest.approx((1.0, -1.4841, 3.4841), abs=1e-4)
    # Holm over p = 0.01, 0.04, 0.03: sorted 0.01 * 3, 0.03 * 2, 0.04 * 1 -> 0.03, 0.06, then max(0.06, 0.04)
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    # pairs (a > b): 3 > 1, 3 > 2, 2 > 1, and 2 = 2 counts half: 3.5 of 4
    assert probability_of_improvement([3, 2], [1, 2]) == pytest.approx(3.5 / 4)
    r = Rule("greater", margin=0.1)
    assert decide(0.2, 0.5, r)[0] == REPRODUCED
    assert decide(0.05, 0.5, r)[0] == INCONCLUSIVE  # the interval reaches below the margin
    assert decide(-0.5, -0.2, r)[0] == OPPOSITE
    assert decide(-0.5, -0.2, Rule("less", margin=0.1))[0] == REPRODUCED
    assert decide(-0.05, 0.3, Rule("noninferior", margin=0.1))[0] == REPRODUCED  # at worst 0.05 below: within 0.1
    assert decide(-0.3, 0.3, Rule("noninferior", margin=0.1))[0] == INCONCLUSIVE
    assert decide(-0.5, -0.2, Rule("noninferior", margin=0.1))[0] == OPPOSITE
    assert compare([0.5, math.nan], [0.1, 0.2], Rule("greater")).verdict == INCONCLUSIVE  # 1 finished seed < 3
    with pytest.raises(ValueError, match="rule.min_seeds"):  # one seed per arm has no interval
        Rule("greater", min_seeds=1)


def test_greater_by_says_smaller_than_claimed_only_with_eight_seeds_per_arm():
    """`greater_by` says *smaller than claimed* when the interval excludes an effect as large as the margin but not
    a positive one, and only with 8 or more seeds in each arm; below 0 it is *opposite* at any seed count."""
    by, plain = Rule("greater_by", margin=0.02), Rule("greater", margin=0.02)
    assert decide(0.03, 0.05, by, (3, 3))[0] == REPRODUCED
    assert decide(-0.01, 0.015, by, (8, 8)) == (SMALLER, "95% CI [-0.01, 0.015] excludes an effect >= 0.02")
    assert decide(-0.01, 0.015, by, (8, 7))[0] == INCONCLUSIVE  # 7 seeds in B: too few to call it smaller
    assert "fewer than 8 seeds" in decide(-0.01, 0.015, by, (3, 3))[1]
    assert decide(-0.01, 0.015, plain, (8, 8))[0] == INCONCLUSIVE  # `greater` has no size to fall short of
    assert decide(-0.03, -0.01, by, (3, 3))[0] == OPPOSITE  # a significant effect the other way
    assert decide(-0.03, -0.01, plain, (3, 3))[0] == INCONCLUSIVE  # `greater`: the other way only past -margin
    assert decide(-0.01, 0.025, by, (8, 8))[0] == INCONCLUSIVE  # an effect of 0.02 is still inside the interval
    less = Rule("less_by", margin=0.02)
    assert decide(-0.05, -0.03, less)[0] == REPRODUCED
    assert decide(-0.015, 0.01, less, (8, 8))[0] == SMALLER and decide(0.01, 0.03, less)[0] == OPPOSITE
    # Planning: the distance is to +margin either way; 7.84888 * 0.02 / 0.1^2 = 15.7 -> 16.
    from analysis.verdicts import replication_seeds

    a, b = [0.5, 0.6, 0.7], [0.3, 0.4, 0.5]  # effect 0.2
    assert replication_seeds(a, b, Rule("greater_by", margin=0.1)) == 16
    assert replication_seeds(a, b, Rule("greater_by", margin=0.3), toward=SMALLER) == 16  # 0.1 below +0.3
    assert replication_seeds(a, b, Rule("greater", margin=0.3), toward=SMALLER) is None  # no such verdict
    assert replication_seeds(b, a, Rule("less_by", margin=0.1)) == 16
    assert replication_seeds(b, a, Rule("less_by", margin=0.3), toward=SMALLER) == 16
    # never fewer than the 8 seeds "smaller than claimed" needs: 7.849 * 0.02 / 0.2^2 = 3.9
    assert replication_seeds(a, b, Rule("greater_by", margin=0.4), toward=SMALLER) == 8


def test_holm_over_a_claims_parts_and_a_summary_only_where_they_agree():
    """Two parts reproduced alone at p 0.02 and 0.04: Holm makes them 0.04 and 0.04 (both kept); with a third at
    0.03 they become 0.06, 0.06, 0.06 and every part is inconclusive after the correction. Parts that disagree
    get no one-word summary."""
    from analysis.verdicts import Comparison

    def part(verdict: str, p: float) -> Comparison:
        return Comparison(0.1, 0.05, 0.15, 0.9, (8, 8), verdict, "", p, "Welch t")

    assert summarize([part(REPRODUCED, 0.02), part(REPRODUCED, 0.04)]) == (
        REPRODUCED, [REPRODUCED, REPRODUCED], pytest.approx([0.04, 0.04])
    )  # fmt: skip
    three = summarize([part(REPRODUCED, 0.02), part(REPRODUCED, 0.04), part(REPRODUCED, 0.03)])
    assert three[0] == INCONCLUSIVE and three[1] == [INCONCLUSIVE] * 3
    assert summarize([part(REPRODUCED, 0.001), part(OPPOSITE, 0.001)])[0] == MIXED
    assert summarize([part(REPRODUCED, 0.001), part(INCONCLUSIVE, 1.0)])[0] == MIXED
    # compare's p is the level at which the interval just clears the reached boundary: for the hand vector above
    # (-3 +- 2.267 at 95%, df 4) against `less` at margin 0: the two-sided p of t = 3 / 0.8165 = 3.674 on 4 df.
    c = compare([1, 2, 3], [4, 5, 6], Rule("less"))
    assert c.verdict == REPRODUCED and c.p == pytest.approx(0.02131, abs=1e-4)


def test_a_rule_the_report_cannot_apply_stops_the_suite_before_any_run(tmp_path):
    path = make_suite(tmp_path, {"a": [0.5, 0.5, 0.5], "b": [0.4, 0.4, 0.4], "c": [0.5, 0.5, 0.5]})
    suite = yaml.safe_load(path.read_text())
    suite["claims"][0]["parts"][0]["rule"]["kind"] = "greater_than"
    path.write_text(yaml.safe_dump(suite))
    with pytest.raises(SystemExit, match=r"claim 1: rule .*'greater_than' is not one of greater, less, greater_by"):
        suite_mod.Suite.load(path)


def test_metrics_read_keys_logged_as_null_on_some_steps():
    """A key logged as null on some steps (no clipped token that step) reads as an object column of None; the
    per-run metrics take the numbers and ignore the nulls (a full suite run crashed on this before)."""
    import math

    import pandas as pd

    from analysis.run_metrics import METRICS

    m = pd.DataFrame(
        {
            "objective/clipped_mu_mean_pos": [None, 0.2, None],
            "objective/clipped_mu_mean_neg": [None, None, 0.4],
            "objective/clipped_entropy_mean_pos": [None, 1.5, None],
            "objective/clipped_entropy_mean_neg": [None, None, None],
            "rollout/entropy": [1.0, None, 0.5],
            "reward/mean": [0.5, None, 0.7],
        }
    )
    e = pd.DataFrame({"avg@2": [0.25, 0.5]})
    assert METRICS["clipped_mu"][0](m, e) == pytest.approx(0.3)
    assert METRICS["clipped_entropy_excess"][0](m, e) == pytest.approx(1.5 - 0.75)
    assert METRICS["reward_auc"][0](m, e) == pytest.approx(0.6)
    nulls = m.assign(**{"objective/clipped_mu_mean_pos": [None] * 3, "objective/clipped_mu_mean_neg": [None] * 3})
    assert math.isnan(METRICS["clipped_mu"][0](nulls, e))


def test_every_figure_kind_the_suite_names_is_a_figure():
    """claim 3 names clipped_token_curves (Fig. 6); a kind no figure draws used to be skipped in silence."""
    import yaml

    from analysis.figures import METRIC_FIGURES
    from analysis.findings import figure_name

    suite = yaml.safe_load((Path(__file__).parents[1] / "findings" / "suite.yaml").read_text())
    kinds = {kind for claim in suite["claims"] for kind in claim.get("figures", [])}
    assert "clipped_token_curves" in kinds and figure_name("clipped_token_curves") == "clipped_token_curves"
    assert figure_name("reward") == "reward_curves" and figure_name("weights") == "drpo_weights"
    assert all(figure_name(kind) in METRIC_FIGURES for kind in kinds)
    with pytest.raises(ValueError, match="unknown figure kind 'clipped'"):
        figure_name("clipped")


def test_replication_seeds_match_the_two_sample_formula():
    """n = (z_0.975 + z_0.8)^2 (s_a^2 + s_b^2) / d^2, d the distance from the effect to the rule's boundary.
    Here s_a^2 = s_b^2 = 0.01 and (1.95996 + 0.84162)^2 = 7.84888."""
    from analysis.verdicts import replication_seeds

    a, b = [0.5, 0.6, 0.7], [0.3, 0.4, 0.5]  # effect 0.2
    assert replication_seeds(a, b, Rule("greater", margin=0.1)) == 16  # 7.84888 * 0.02 / 0.1^2 = 15.7
    assert replication_seeds(a, [0.4] * 3, Rule("greater", margin=0.1)) == 8  # a constant: only a's spread, 7.85
    assert replication_seeds(b, a, Rule("less", margin=0.1)) == 16
    assert replication_seeds(a, b, Rule("equivalent", margin=0.3)) == 16  # 0.3 - |0.2| = 0.1 to the band's edge
    assert replication_seeds(b, a, Rule("noninferior", margin=0.3)) == 16  # -0.2 is 0.1 above -0.3
    assert replication_seeds(a, b, Rule("greater", margin=0.25)) is None  # the effect lies inside the margin
    assert replication_seeds(a, b, Rule("equivalent", margin=0.15)) is None  # already outside the band
    assert replication_seeds([5.0, 5.1, 4.9], b, Rule("greater")) == 3  # never fewer than the rule's min_seeds


def test_contradiction_seeds_plan_toward_the_other_boundary():
    """The same formula toward the *opposite* boundary: d is the distance past -margin (greater, noninferior),
    past +margin (less), or outside the band (equivalent); s_a^2 + s_b^2 = 0.02 as above."""
    from analysis.verdicts import replication_seeds

    a, b = [0.5, 0.6, 0.7], [0.3, 0.4, 0.5]  # a - b = 0.2, b - a = -0.2
    assert replication_seeds(b, a, Rule("greater", margin=0.1), toward=OPPOSITE) == 16  # -0.2 is 0.1 below -0.1
    assert replication_seeds(a, b, Rule("less", margin=0.1), toward=OPPOSITE) == 16
    assert replication_seeds(b, a, Rule("noninferior", margin=0.1), toward=OPPOSITE) == 16
    assert replication_seeds(a, b, Rule("equivalent", margin=0.1), toward=OPPOSITE) == 16  # 0.1 outside the band
    # d = 0.15: 7.849 * 0.02 / 0.0225 = 6.98
    assert replication_seeds(b, a, Rule("greater", margin=0.05), toward=OPPOSITE) == 7
    # Within +-margin a `greater` rule is undecidable both ways; past +margin only reproduction is planned.
    assert replication_seeds(a, b, Rule("greater", margin=0.25), toward=OPPOSITE) is None
    assert replication_seeds(a, b, Rule("greater", margin=0.1), toward=OPPOSITE) is None
    assert replication_seeds(a, b, Rule("equivalent", margin=0.3), toward=OPPOSITE) is None  # inside the band
    with pytest.raises(ValueError, match="toward: 'inconclusive'"):
        replication_seeds(a, b, Rule("greater"), toward=INCONCLUSIVE)


def test_report_says_why_each_inconclusive_comparison_is_inconclusive(tmp_path):
    """Claim 2 (a ~ c within 0.2): effect 0 with s_a^2 + s_c^2 = 0.01 + 0.0225; Welch's interval at 3 seeds
    (df 3.5) is +-0.31, inconclusive; 7.849 * 0.0325 / 0.2^2 = 6.4 -> 7 seeds per arm to reproduce."""
    doc = report(make_suite(tmp_path, {"a": [0.5, 0.6, 0.7], "b": [0.1, 0.2, 0.3], "c": [0.45, 0.6, 0.75]}))
    one, two = doc["by_id"][1]["parts"][0], doc["by_id"][2]["parts"][0]
    assert one["verdict"] == REPRODUCED and one["replication_seeds"] is None  # decided: nothing to plan
    assert two["verdict"] == INCONCLUSIVE and two["replication_seeds"] == 7
    md = (tmp_path / "FINDINGS.md").read_text()
    assert "| 2 | a vs c | `final_eval` | 0 | equivalent 0.2 | too few seeds to reproduce: ~7 per arm | 0.2 |" in md
    assert two["contradiction_seeds"] is None  # an effect of 0 lies inside the band: never opposite
    inside = report(make_suite(tmp_path / "in", {"a": [0.5, 0.6, 0.7], "b": [0.49, 0.6, 0.7], "c": [0.5, 0.6, 0.7]}))
    part = inside["by_id"][1]["parts"][0]  # effect 0.0033 against a `greater` margin of 0.02: neither way
    assert part["replication_seeds"] is None and part["contradiction_seeds"] is None
    md = (tmp_path / "in" / "FINDINGS.md").read_text()
    assert "effect within ±margin: not a seed-count problem" in md
    assert "no seed count would decide it" in md
    far = report(make_suite(tmp_path / "far", {"a": [0.5, 0.6, 0.7], "b": [0.3, 0.4, 0.5], "c": [0.1, 0.3, 0.5]}))
    part = far["by_id"][2]["parts"][0]  # a - c = 0.3, 0.1 outside the ±0.2 band; spread 0.01 + 0.04
    assert far["by_id"][2]["verdict"] == INCONCLUSIVE and part["replication_seeds"] is None
    assert part["contradiction_seeds"] == 40  # 7.849 * 0.05 / 0.1^2 = 39.2
    md = (tmp_path / "far" / "FINDINGS.md").read_text()
    assert "| 2 | a vs c | `final_eval` | 0.3 | equivalent 0.2 | too few seeds to call it opposite: ~40 per arm |" in md
    assert "would call it opposite with ~40 seeds per arm" in md


def test_a_replication_runs_new_seeds_in_its_own_folder_and_never_pools_them(tmp_path):
    path = make_suite(tmp_path, {"a": [0.5, 0.55, 0.6], "b": [0.1, 0.12, 0.09], "c": [0.52, 0.55, 0.57]})
    before = (tmp_path / "findings.json").read_text() if (tmp_path / "findings.json").exists() else None
    for seed, value in ((3, 0.5), (4, 0.52)):  # a replication's runs on disk for arms a and b only
        for arm in ("a", "b"):
            write_run(tmp_path / "seeds_3-4" / "runs" / arm / f"seed{seed}", [value] * 8, value)
    assert suite_mod.main(["--suite", str(path), "--report-only", "--seeds", "3-4", "--claims", "1"]) == 0
    rep = json.loads((tmp_path / "seeds_3-4" / "findings.json").read_text())
    assert rep["seeds"] == [3, 4] and [c["id"] for c in rep["claims"]] == [1]
    header = f"Written by `python -m analysis.suite --suite {path} --claims 1 --seeds 3-4` from `suite.yaml`"
    assert rep["command"] in header and header in (tmp_path / "seeds_3-4" / "FINDINGS.md").read_text()
    assert rep["runs"] == 4 and rep["claims"][0]["parts"][0]["seeds"] == [2, 2]  # seeds 0-2 are not pooled in
    assert (tmp_path / "findings.json").exists() is (before is not None)  # the suite's own report is untouched
    assert suite_mod.parse_seeds("3,5,8") == [3, 5, 8] and suite_mod.seeds_label([3, 5, 8]) == "3_5_8"
    for bad in ("3-x", "5-3", "1,1", "-2"):
        with pytest.raises(Exception, match="expected distinct seeds"):
            suite_mod.parse_seeds(bad)
    with pytest.raises(SystemExit, match=r"--claims: \[7\] not in suite.yaml \(claims: 1, 2, 5\)"):
        suite_mod.main(["--suite", str(path), "--report-only", "--claims", "7"])


@pytest.mark.slow  # starts run.py
def test_a_run_that_run_py_refuses_is_reported_failed_with_its_error(tmp_path, capsys):
    """A real run.py process refused on a bad override (no run directory, no summary.json): the progress line
    says failed, FINDINGS.md carries run.py's one-line error from the run's log, the suite exits non-zero, and a
    later --report-only still counts it failed, not "not run"."""
    path = refused_suite(tmp_path)
    assert suite_mod.main(["--suite", str(path)]) == 1
    assert "[1/1] arm=bad seed=0 done in" in capsys.readouterr().out
    for args in ([], ["--report-only"]):
        if args:
            assert suite_mod.main(["--suite", str(path), *args]) == 1
        doc = json.loads((tmp_path / "findings.json").read_text())
        assert doc["failed_runs"] == 1 and doc["runs_not_run"] == 0
        failed = doc["claims"][0]["arms"]["bad"]["failed"]
        assert failed[0]["seed"] == 0 and "objective=nope is not an option" in failed[0]["error"]
        assert "objective=nope is not an option" in (tmp_path / "FINDINGS.md").read_text()


SUITE_FILES = sorted((Path(__file__).resolve().parents[1] / "findings").rglob("suite.yaml"))


@pytest.mark.slow  # composes every arm of every suite file
@pytest.mark.parametrize("path", SUITE_FILES, ids=lambda p: str(p.parent.name))
def test_every_arm_of_every_committed_suite_file_is_a_valid_run(path):
    """Each arm's overrides, on its suite's base, compose with Hydra and pass the run config's checks, so an arm of
    an opt-in suite cannot be a typo found only after its runs were paid for."""
    from harness.config import compose, validate

    suite = suite_mod.Suite.load(path)
    for arm, overrides in suite.arms.items():
        run = validate(compose(*suite.base, *overrides, "seed=0"))
        assert run.objective.name == next(o for o in overrides if o.startswith("objective=")).split("=")[1], arm


@pytest.mark.slow  # two suites' reports and figures: over 3 s of CPU
def test_an_optin_suite_extends_the_suite_shares_its_runs_and_is_named_in_its_report(tmp_path, capsys):
    """An opt-in suite inherits the base, seeds and arms, adds an arm, decides its own claims on the shared run
    folder's runs (arm a's are the suite's own), and the suite's FINDINGS.md names it; bad files fail in one line."""
    path = make_suite(tmp_path, {"a": [0.5, 0.55, 0.6], "b": [0.1, 0.12, 0.09], "c": [0.5, 0.55, 0.6]})
    for seed, value in zip(SEEDS, [0.2, 0.22, 0.21], strict=True):
        write_run(tmp_path / "runs" / "d" / f"seed{seed}", [value] * 8, value)
    opt = tmp_path / "optin" / "suite.yaml"
    opt.parent.mkdir()
    claim = {"id": 3, "claim": "A beats D", "paper": "Fig. Z", "parts": [
        {"a": "a", "b": "d", "metric": "final_eval", "rule": {"kind": "greater", "margin": 0.02}}]}  # fmt: skip
    opt.write_text(yaml.safe_dump({"extends": "../suite.yaml", "runs": "../runs", "arms": {"d": ["objective=d"]},
                                   "claims": [claim]}))  # fmt: skip
    assert suite_mod.main(["--suite", str(opt), "--report-only"]) == 0
    doc = json.loads((opt.parent / "findings.json").read_text())
    assert doc["seeds"] == SEEDS and doc["runs"] == 6 and [c["id"] for c in doc["claims"]] == [3]
    part = doc["claims"][0]["parts"][0]
    assert part["verdict"] == REPRODUCED and part["effect"] == pytest.approx(0.55 - 0.21)
    assert not (opt.parent / "runs").exists()  # it read the suite's run folder, made none of its own

    main = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**main, "optin": ["optin/suite.yaml"]}))
    named = report(path)
    assert named["optin"] == ["optin/suite.yaml"]
    md = (tmp_path / "FINDINGS.md").read_text()
    assert f"`python -m analysis.suite --suite {opt}`: more parts of claims 3, on arms d" in md
    assert "its report: [optin/FINDINGS.md](optin/FINDINGS.md)" in md
    # A replication's report lies one folder down (seeds_<seeds>/): its link still reaches the opt-in report.
    for seed in (7, 8, 9):
        for arm in ("a", "b", "c"):
            write_run(tmp_path / "seeds_7-9" / "runs" / arm / f"seed{seed}", [0.5] * 4, 0.5)
    suite_mod.main(["--suite", str(path), "--report-only", "--seeds", "7-9"])
    (opt.parent / "FINDINGS.md").write_text("the opt-in report")
    suite_mod.main(["--suite", str(path), "--report-only", "--seeds", "7-9"])
    md = (tmp_path / "seeds_7-9" / "FINDINGS.md").read_text()
    assert "its report: [../optin/FINDINGS.md](../optin/FINDINGS.md)" in md

    def fails(text: dict, match: str) -> None:
        opt.write_text(yaml.safe_dump(text))
        with pytest.raises(SystemExit, match=match):
            suite_mod.Suite.load(opt)

    fails({"extends": "../suite.yaml", "arms": {"a": ["objective=z"]}, "claims": []}, "arm 'a' is ../suite.yaml's")
    fails({"extends": "suite.yaml", "claims": []}, "extends itself through suite.yaml")
    path.write_text(yaml.safe_dump({**main, "optin": ["nowhere.yaml"]}))
    with pytest.raises(SystemExit, match="optin names .*nowhere.yaml, which is not a file"):
        suite_mod.Suite.load(path)
    # A broken opt-in file fails the suite's own load, before any run, not its report after them.
    path.write_text(yaml.safe_dump({**main, "optin": ["optin/suite.yaml"]}))
    bad = {**claim, "parts": [{**claim["parts"][0], "b": "zz"}]}
    opt.write_text(yaml.safe_dump({"extends": "../suite.yaml", "claims": [bad]}))
    shutil.rmtree(tmp_path / "runs" / "c" / "seed0")  # a run the suite would start
    capsys.readouterr()
    with pytest.raises(SystemExit, match="optin/suite.yaml: claim 3 names arm 'zz', not in arms"):
        suite_mod.main(["--suite", str(path)])
    assert "findings:" not in capsys.readouterr().out  # no run was started


@pytest.mark.slow  # starts run.py
def test_a_run_made_with_other_settings_is_stale_not_passed_off_as_the_suite_files(tmp_path, capsys):
    """A completed run whose `.hydra/overrides.yaml` differs from what the suite file asks (the file edited after
    its runs) is reported failed, saying how it differs, and a pass runs it again (a real run.py, refused here
    on an unknown objective) instead of skipping it as complete; a run that matches is kept."""
    path = make_suite(tmp_path, {"a": [0.5, 0.55, 0.6], "b": [0.1, 0.12, 0.09], "c": [0.5, 0.55, 0.6]})
    hydra = tmp_path / "runs" / "a" / "seed1" / ".hydra"
    hydra.mkdir()
    same = ["rollout=hf", "objective=a", "seed=1", "trainer.threads=1", "name=findings"]
    (hydra / "overrides.yaml").write_text(yaml.safe_dump(same))
    kept = report(path)
    assert kept["failed_runs"] == 0 and kept["by_id"][1]["verdict"] == REPRODUCED
    (hydra / "overrides.yaml").write_text(yaml.safe_dump(["rollout=hf", "trainer.lr=2e-4", *same[1:]]))
    stale = report(path)
    assert stale["failed_runs"] == 1 and stale["exit_code"] == 1
    assert stale["by_id"][1]["verdict"] == INCONCLUSIVE and stale["by_id"][1]["parts"][0]["seeds"] == [2, 3]
    failed = stale["by_id"][1]["arms"]["a"]["failed"]
    assert failed == [{"seed": 1, "error": "stale: made with trainer.lr=2e-4 where the suite file now says nothing; "
                       "a pass of the suite (not --report-only) runs it again"}]  # fmt: skip

    path = refused_suite(tmp_path / "real")
    run_dir = tmp_path / "real" / "runs" / "bad" / "seed0"
    write_run(run_dir, [0.5] * 4, 0.5)
    (run_dir / ".hydra").mkdir()
    made = ["rollout=hf", "logger=none", "objective=grpo", "seed=0", "trainer.threads=1", "name=findings"]
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(made))
    capsys.readouterr()
    assert suite_mod.main(["--suite", str(path)]) == 1
    out = capsys.readouterr().out
    assert "1 runs, 0 already complete, 1 to run, 1 of them made with other settings than the suite file's" in out
    assert "objective=nope is not an option" in (run_dir.parent / "seed0.log").read_text()


@pytest.mark.slow  # starts run.py
def test_a_run_made_over_other_defaults_is_stale(tmp_path):
    """The same overrides over edited defaults (conf/'s YAML or the schemas') are another setting: a completed run
    whose composed config differs from what its overrides compose to now is stale, named by key; the config
    a real run.py wrote for those overrides is not."""
    import os
    import subprocess
    import sys

    suite = {
        "base": ["rollout=hf", "logger=none", "trainer.eval_every=0"], "seeds": [0], "arms": {"a": ["objective=grpo"]},
        "claims": [{"id": 1, "claim": "a > 0", "paper": "Fig. X", "parts": [
            {"a": "a", "b": 0.0, "metric": "final_eval", "rule": {"kind": "greater"}}]}],
    }  # fmt: skip
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    loaded = suite_mod.Suite.load(path)
    [job] = loaded.jobs_for(loaded.claims, [0], tmp_path / "runs")
    # run.py writes .hydra/ and then refuses the run (eval_every must be >= 1): Hydra's own record, in seconds.
    run_py = str(suite_mod.ROOT / "run.py")
    cmd = [sys.executable, run_py, *suite_mod.job_overrides(job), f"hydra.run.dir={job.run_dir}"]
    subprocess.run(cmd, cwd=suite_mod.ROOT, env={**os.environ, "WANDB_MODE": "offline"}, capture_output=True)
    config = job.run_dir / ".hydra" / "config.yaml"
    assert config.is_file(), "run.py no longer writes .hydra/ before it validates: record the config another way"
    write_run(job.run_dir, [0.5] * 4, 0.5)  # as if it had completed
    assert suite_mod.settings_differ(job) is None and suite_mod.job_status(job) == "completed"

    made = yaml.safe_load(config.read_text())
    lr = made["trainer"]["lr"]
    made["trainer"]["lr"] = 2 * lr  # as if the default lr had been lr * 2 when it ran
    config.write_text(yaml.safe_dump(made))
    assert suite_mod.settings_differ(job) == f"made with trainer.lr={2 * lr!r} (the defaults now give {lr!r})"
    assert suite_mod.job_status(job) == "stale"
    doc = report(path)
    assert doc["failed_runs"] == 1 and doc["by_id"][1]["verdict"] == INCONCLUSIVE
    assert "stale: made with trainer.lr=" in doc["by_id"][1]["arms"]["a"]["failed"][0]["error"]


@pytest.mark.slow  # starts run.py
def test_a_run_another_suite_process_holds_is_left_to_it(tmp_path, capsys):
    """Two suites on one run folder (`runs:`): a job another live process has claimed is not started again
    (which would first delete the directory that process writes); it counts as not run yet, and once the lock is
    gone the next pass runs it (a real run.py, refused on an unknown objective)."""
    import fcntl

    path = refused_suite(tmp_path)
    log = tmp_path / "runs" / "bad" / "seed0.log"
    log.parent.mkdir(parents=True)
    with open(log.parent / ".seed0.claim", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # what run_one holds while its run goes
        assert suite_mod.main(["--suite", str(path)]) == 0
    out = capsys.readouterr().out
    assert "1 runs, 0 already complete, 0 to run, 1 running in another process, left to it" in out
    assert "[1/" not in out and not (tmp_path / "runs" / "bad" / "seed0").exists()
    doc = json.loads((tmp_path / "findings.json").read_text())
    assert doc["runs_not_run"] == 1 and doc["failed_runs"] == 0
    assert suite_mod.main(["--suite", str(path)]) == 1  # the lock is gone: this pass runs it
    assert "[1/1] arm=bad seed=0 done in" in capsys.readouterr().out
    assert "objective=nope is not an option" in log.read_text()


def test_a_job_claimed_or_completed_after_the_pass_began_is_left_as_it_is(tmp_path):
    """The pass checks which jobs are taken when it starts; a second suite may claim a job, or finish it, while
    this pass works through the others. run_one checks again under its own claim: it neither deletes the other
    process's run directory nor runs a job that has completed since."""
    import fcntl

    run_dir = tmp_path / "runs" / "bad" / "seed0"
    job = suite_mod.Job("bad", 0, ("rollout=hf", "objective=nope"), run_dir)
    write_run(run_dir, [0.5] * 4, 0.5, status="running")  # the other process's run, half written
    with open(suite_mod.claim_path(job), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert suite_mod.running(job) and suite_mod.disk_status(job) == "not run"
        assert suite_mod.run_one(job)[1] == suite_mod.ELSEWHERE
    assert (run_dir / "metrics.jsonl").exists() and not (run_dir.parent / "seed0.log").exists()

    write_run(run_dir, [0.5] * 4, 0.5)  # it completed, with the job's own overrides
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(suite_mod.job_overrides(job)))
    assert suite_mod.run_one(job)[1:] == ("completed", 0.0)
    assert (run_dir / "metrics.jsonl").exists() and not (run_dir.parent / "seed0.log").exists()


def test_report_only_beside_a_live_run_counts_it_not_run_and_a_dead_one_failed(tmp_path):
    """`--report-only` while the suite still runs: a run whose summary says "running" and whose lock a live process
    holds is unfinished, not failed; once nobody holds the lock, the same summary is a run that died."""
    from harness.rundir.lock import RunDirLock

    path = make_suite(tmp_path, {"a": [0.5, 0.55, 0.6], "b": [0.1, 0.12, 0.09], "c": [0.5, 0.55, 0.6]})
    run_dir = tmp_path / "runs" / "a" / "seed1"
    write_run(run_dir, [0.5] * 4, 0.5, status="running")
    lock = RunDirLock(run_dir)
    lock.acquire()
    try:
        live = report(path)
    finally:
        lock.release()
    assert live["failed_runs"] == 0 and live["runs_not_run"] == 1 and live["exit_code"] == 0
    dead = report(path)
    assert dead["failed_runs"] == 1 and dead["runs_not_run"] == 0 and dead["exit_code"] == 1


@pytest.mark.slow  # starts run.py
def test_report_only_counts_a_run_in_its_first_seconds_not_run(tmp_path):
    """Before run.py takes its run directory's lock (imports, config checks) only the suite's log of the run
    exists; the suite holds its claim on the run until it ends, so a report beside it reads the run as unfinished. Here
    the run is refused (an unknown objective) and, once it has ended, counts as failed."""
    import threading
    import time

    make_suite(tmp_path, {"a": [0.5, 0.55, 0.6], "b": [0.1, 0.12, 0.09], "c": [0.5, 0.55, 0.6]})
    run_dir = tmp_path / "runs" / "a" / "seed9"  # a seed the suite's completed runs lack
    job = suite_mod.Job("a", 9, ("rollout=hf", "objective=no_such_objective"), run_dir)
    thread = threading.Thread(target=suite_mod.run_one, args=(job,))
    thread.start()
    seen = []
    while thread.is_alive():
        if (run_dir.parent / "seed9.log").exists():
            seen.append(suite_mod.disk_status(job))
        time.sleep(0.01)  # leave the other core to run.py
    thread.join()
    log = (run_dir.parent / "seed9.log").read_text()
    assert "no_such_objective" in log and not (run_dir / "summary.json").exists()
    # Unfinished from the moment the log appears; failed only once the run has ended and let go of it.
    going = seen.index("failed") if "failed" in seen else len(seen)
    assert going > 10 and set(seen[:going]) == {"not run"} and set(seen[going:]) <= {"failed"}
    assert suite_mod.disk_status(job) == "failed"


def test_runs_csv_names_run_folders_inside_the_repository_relative_to_it(tmp_path):
    from analysis.findings import repo_path

    inside = suite_mod.ROOT / "findings" / "runs" / "pg_is" / "seed800"
    assert repo_path(inside) == Path("findings/runs/pg_is/seed800")  # the default suite's absolute path
    assert repo_path(Path("findings/runs/pg_is/seed800")) == Path("findings/runs/pg_is/seed800")  # cwd is the repo
    assert repo_path(tmp_path / "runs" / "a" / "seed0") == tmp_path / "runs" / "a" / "seed0"  # outside: as given


def test_claims_on_the_suites_seeds_runs_their_arms_and_keeps_every_claim_in_the_report(tmp_path, capsys):
    """`--claims 2` on the suite's own seeds runs only claim 2's arms (a, c: arm b's missing run is not started)
    and still writes every claim to the suite folder's report, claim 1 from the runs on disk, so rerunning one
    claim never shrinks FINDINGS.md to it; a claim with no CPU runs is refused before anything is written."""
    path = make_suite(tmp_path, {"a": [0.5, 0.55, 0.6], "b": [0.1, 0.12, 0.09], "c": [0.5, 0.55, 0.6]})
    shutil.rmtree(tmp_path / "runs" / "b" / "seed0")
    capsys.readouterr()
    assert suite_mod.main(["--suite", str(path), "--claims", "2"]) == 0
    assert "findings: 6 runs, 6 already complete, 0 to run" in capsys.readouterr().out
    doc = json.loads((tmp_path / "findings.json").read_text())
    verdicts = {c["id"]: c["verdict"] for c in doc["claims"]}
    # Claim 1 from the runs on disk: b's seed 0 is missing, so 2 seeds, under min_seeds 3.
    assert verdicts == {1: INCONCLUSIVE, 2: REPRODUCED, 5: "not tested"}, verdicts
    assert doc["claims"][0]["parts"][0]["seeds"] == [3, 2]
    before = (tmp_path / "FINDINGS.md").read_text()
    with pytest.raises(SystemExit, match=r"--claims: \[5\] has no runs in suite.yaml .*claims with runs: 1, 2$"):
        suite_mod.main(["--suite", str(path), "--claims", "5"])
    assert (tmp_path / "FINDINGS.md").read_text() == before


def test_report_only_with_no_run_on_disk_is_refused_and_writes_nothing(tmp_path):
    """A mistyped replication's seeds (`--report-only --seeds 900-901`), or a suite folder whose runs were removed:
    one line naming the run folder, and no report folder made nor an existing report replaced."""
    path = make_suite(tmp_path, {"a": [0.5, 0.55, 0.6], "b": [0.1, 0.12, 0.09], "c": [0.5, 0.55, 0.6]})
    with pytest.raises(SystemExit, match=r"--report-only: no run of this selection is on disk under .*seeds_900-901"):
        suite_mod.main(["--suite", str(path), "--report-only", "--seeds", "900-901"])
    assert not (tmp_path / "seeds_900-901").exists()

    report(path)
    before = (tmp_path / "FINDINGS.md").read_text()
    shutil.rmtree(tmp_path / "runs")
    with pytest.raises(SystemExit, match="without --report-only first"):
        suite_mod.main(["--suite", str(path), "--report-only"])
    assert (tmp_path / "FINDINGS.md").read_text() == before


def test_arm_seeds_runs_an_arm_on_the_first_seeds_only_and_a_replication_on_all(tmp_path):
    """`arm_seeds: {b: 2}`: arm b's jobs are seeds 0 and 1 (no "not run" seed 2 counted against it), the part
    compares 3 seeds of a with 2 of b (too few to decide), and the report says so; a replication (--seeds) runs
    every arm on every seed; a count outside 1..len(seeds) or an unknown arm fails in one line when the file loads."""
    path = make_suite(tmp_path, {"a": [0.5, 0.55, 0.6], "b": [0.1, 0.12, 0.09], "c": [0.5, 0.55, 0.6]})
    shutil.rmtree(tmp_path / "runs" / "b" / "seed2")
    raw = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**raw, "arm_seeds": {"b": 2}}))
    suite = suite_mod.Suite.load(path)
    jobs = suite.jobs_for(suite.claims, suite.seeds, tmp_path / "runs")
    assert sorted((j.arm, j.seed) for j in jobs if j.arm == "b") == [("b", 0), ("b", 1)] and len(jobs) == 8
    doc = report(path)
    assert doc["runs"] == 8 and doc["runs_not_run"] == 0 and doc["arm_seeds"] == {"b": 2}
    # Two seeds are below the rules' min_seeds (3): the planted effect stays undecided on them.
    assert doc["by_id"][1]["parts"][0]["seeds"] == [3, 2] and doc["by_id"][1]["verdict"] == INCONCLUSIVE
    assert "(seeds 0, 1, 2; b on the first 2; 8 runs" in (tmp_path / "FINDINGS.md").read_text()

    for seed in (7, 8):
        for arm in ("a", "b"):
            write_run(tmp_path / "seeds_7-8" / "runs" / arm / f"seed{seed}", [0.5] * 4, 0.5)
    suite_mod.main(["--suite", str(path), "--report-only", "--seeds", "7-8", "--claims", "1"])
    rep = json.loads((tmp_path / "seeds_7-8" / "findings.json").read_text())
    assert rep["runs"] == 4 and rep["arm_seeds"] == {} and rep["claims"][0]["parts"][0]["seeds"] == [2, 2]

    for bad, match in (({"b": 0}, r"arm_seeds.b is 0; allowed: a whole number of seeds, 1 to 3"),
                       ({"b": 4}, "arm_seeds.b is 4"), ({"b": True}, "arm_seeds.b is True"),
                       ({"z": 2}, "arm_seeds names 'z', not in arms")):  # fmt: skip
        path.write_text(yaml.safe_dump({**raw, "arm_seeds": bad}))
        with pytest.raises(SystemExit, match=match):
            suite_mod.Suite.load(path)


def test_a_claim_without_a_positive_control_is_not_testable_here_never_negative(tmp_path):
    """Claim 1 (a > b) with a reversed effect is `opposite`; the same runs with `positive_control: false` (the
    testbed map found no dose at which the mechanism shows) give every part "not testable here", and the report
    carries the claim's condition."""
    path = make_suite(tmp_path, {"a": [0.1, 0.12, 0.09], "b": [0.5, 0.55, 0.6], "c": [0.1, 0.12, 0.09]})
    assert report(path)["by_id"][1]["verdict"] == OPPOSITE
    suite = yaml.safe_load(path.read_text())
    suite["conditions"] = {"W": {"what": "W4A4 rollouts, 4 updates per rollout", "positive_control": False}}
    suite["claims"][0].update(condition="W", positive_control=False)
    path.write_text(yaml.safe_dump(suite))
    one = report(path)["by_id"][1]
    assert one["verdict"] == NOT_TESTABLE and [p["verdict"] for p in one["parts"]] == [NOT_TESTABLE]
    # Its arms run nothing (b is no other claim's arm): the part reads no seed of b, so no interval decides it.
    assert one["parts"][0]["verdict_alone"] == INCONCLUSIVE and one["parts"][0]["seeds"] == [3, 0]
    assert one["condition"] == "W: W4A4 rollouts, 4 updates per rollout" and one["positive_control"] is False
    md = (tmp_path / "FINDINGS.md").read_text()
    assert "positive control there: no: every part is not testable here" in md


def test_the_quick_subset_writes_its_own_folder_and_leaves_the_full_report(tmp_path):
    """`--quick` reports into <suite folder>/quick/ from the suite folder's runs: a fresh clone's quick pass
    must never replace the committed full report."""
    path = make_suite(tmp_path, {"a": [0.5, 0.55, 0.6], "b": [0.1, 0.12, 0.09], "c": [0.5, 0.55, 0.6]})
    suite = yaml.safe_load(path.read_text())
    suite["quick"] = {"claims": [1], "arms": ["a", "b"], "seeds": [0, 1, 2]}
    path.write_text(yaml.safe_dump(suite))
    full = report(path)
    before = (tmp_path / "findings.json").read_text()
    assert suite_mod.main(["--suite", str(path), "--quick", "--report-only"]) == 0
    assert (tmp_path / "findings.json").read_text() == before
    quick = json.loads((tmp_path / "quick" / "findings.json").read_text())
    assert quick["quick"] is True and [c["id"] for c in quick["claims"]] == [1]
    assert quick["claims"][0]["effect"] == pytest.approx(full["by_id"][1]["effect"])
    assert len(full["claims"]) == 3 and not (tmp_path / "quick" / "runs").exists()
    assert quick["suite_sha"] == full["suite_sha"] and len(quick["suite_sha"]) == 64


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"condition": "Z"}, r"claim 1: condition 'Z' is not one of the file's conditions \(M\)"),
        ({"positive_control": "yes"}, r"claim 1: positive_control is 'yes'; allowed: true, false"),
        ({"parts": [{"a": "a", "b": "b", "metric": "final_evl", "rule": {"kind": "greater"}}]},
         r"claim 1: metric 'final_evl' is not one of final_eval, "),
    ],
)  # fmt: skip
def test_a_suite_naming_an_unknown_condition_or_metric_is_refused_before_any_run(tmp_path, edit, message):
    path = make_suite(tmp_path, {"a": [0.5, 0.5, 0.5], "b": [0.4, 0.4, 0.4], "c": [0.5, 0.5, 0.5]})
    suite = yaml.safe_load(path.read_text())
    suite["conditions"] = {"M": {"what": "logit noise 2", "positive_control": True}}
    suite["claims"][0].update(edit)
    path.write_text(yaml.safe_dump(suite))
    with pytest.raises(SystemExit, match=message):
        suite_mod.Suite.load(path)
    suite["claims"][0].update(condition="M", positive_control=True, parts=suite["claims"][1]["parts"])
    path.write_text(yaml.safe_dump(suite))
    assert suite_mod.Suite.load(path).conditions["M"]["what"] == "logit noise 2"


def test_a_setting_added_since_a_run_at_its_off_value_leaves_the_run_current():
    """A run made before trainer.save_batches existed is still the setting a suite asks for (the new switch is off
    by default); a run made with it on, or a value the run lacks that is not off, is another setting."""
    from harness.rundir.record import differences

    made = {"trainer": {"lr": 1e-4}}
    assert differences(made, {"trainer": {"lr": 1e-4, "save_batches": []}}) == {}
    assert differences(made, {"trainer": {"lr": 1e-4, "save_batches": [2]}}) == {"trainer.save_batches": (None, [2])}
    assert differences(made, {"trainer": {"lr": 1e-4, "engine": "policy"}}) == {"trainer.engine": (None, "policy")}
    assert differences({"trainer": {"save_batches": [2]}}, {"trainer": {"save_batches": []}}) != {}
    # A logged metric's threshold, added since at the value runs used before: neither a new setting nor a refused
    # resume, at any value (it changes what is watched, not what is trained).
    assert differences(made, {"trainer": {"lr": 1e-4, "bad_update_gap": 0.5}}) == {}
    assert differences({"trainer": {"bad_update_gap": 0.5}}, {"trainer": {"bad_update_gap": 0.3}}) == {}


def test_the_superiority_statistic_by_hand():
    """P(A > B) + P(A = B)/2 - 1/2 with the Clopper-Pearson interval of n P_hat successes in n = min(n_a, n_b)."""
    from scipy import stats

    from analysis.verdicts import replication_seeds, superiority_interval

    # Every A above every B at 6 seeds: P_hat = 1, x = 6 of 6, lower bound 0.025^(1/6) = 0.5407 (the exact binomial
    # bound), so the interval of the effect is [0.0407, 0.5].
    effect, lo, hi = superiority_interval([1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 0, -1])
    assert (effect, hi) == (0.5, 0.5) and lo == pytest.approx(0.025 ** (1 / 6) - 0.5)
    # Ties count 1/2: [0, 1] against [0, 0] wins 2 pairs and ties 2 of 4, P_hat = 3/4, x = 1.5 of n = 2.
    assert superiority_interval([0, 1], [0, 0])[0] == 0.25
    # Against a constant: P(A > c), here 3 of 6, exactly the binomial interval of 3 in 6 (scipy's Clopper-Pearson).
    ci = stats.binomtest(3, 6).proportion_ci()
    c = compare([1, 2, 3, 0, 0, 0], 0.5, Rule("greater", statistic="superiority"))
    assert (c.effect, c.ci_low, c.ci_high) == pytest.approx((0.0, ci.low - 0.5, ci.high - 0.5))
    # Unequal arms: n = min(8, 5) = 5; every A above every B gives 0.025^(1/5) = 0.478 < 0.5 + 0.1: inconclusive
    # at 5 seeds, reproduced at 8 vs 8 (0.025^(1/8) = 0.631 > 0.6). The margin is on P: greater_by 0.1 = P > 0.6.
    rule = Rule("greater_by", margin=0.1, statistic="superiority")
    assert compare(list(range(10, 18)), [0, 1, 2, 3, 4], rule).verdict == INCONCLUSIVE
    eight = compare(list(range(10, 18)), list(range(8)), rule)
    assert eight.verdict == REPRODUCED and eight.ci_low == pytest.approx(0.025 ** (1 / 8) - 0.5)
    assert eight.method.startswith("P(A>B)") and 0 < eight.p < 0.05
    # p: the level at which the interval's lower bound just reaches 0.1: alpha/2 = 0.6^8 (P_hat = 1, x = n = 8).
    assert eight.p == pytest.approx(2 * 0.6**8, rel=1e-6)
    # Seeds for a replication, by hand for P_hat = 1 (no spread): the smallest n with 0.025^(1/n) > 0.6 is 8
    # (ln 0.025 / ln 0.6 = 7.2); toward opposite from P_hat = 0, the smallest n with 1 - 0.025^(1/n) < 0.5 is 6.
    assert replication_seeds([1, 2, 3], [0, 0, 0], rule) == 8
    assert replication_seeds([0, 0, 0], [1, 2, 3], rule, toward=OPPOSITE) == 6
    assert replication_seeds([1, 2, 3], [0, 0, 0], rule, toward=OPPOSITE) is None  # the effect lies the other way
    with pytest.raises(ValueError, match="unreachable"):
        Rule("greater_by", margin=0.5, statistic="superiority")


def test_a_superiority_part_in_a_report(tmp_path):
    """A suite part with `statistic: superiority`: 8 seeds of a all above 8 of b, P_hat = 1, effect +0.5 with the
    Clopper-Pearson bound 0.025^(1/8) - 1/2 = 0.131 > 0.1: reproduced; the report names the statistic and says
    what its margin means. A report without such a part (v7's) has no such sentence."""
    seeds = list(range(8))
    for arm, base in (("a", 0.30), ("b", 0.20)):
        for seed in seeds:
            write_run(tmp_path / "runs" / arm / f"seed{seed}", [0.5] * 8, base + 0.001 * seed)
    rule = {"kind": "greater_by", "margin": 0.1, "statistic": "superiority"}
    doc = {
        "base": ["rollout=hf"], "seeds": seeds, "arms": {"a": ["objective=dppo"], "b": ["objective=pg_is"]},
        "claims": [{"id": 1, "claim": "a beats b", "paper": "Fig. 1",
                    "parts": [{"a": "a", "b": "b", "metric": "final_eval", "rule": rule}]}],
    }  # fmt: skip
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(doc))
    one = report(tmp_path / "suite.yaml")["by_id"][1]
    assert one["verdict"] == REPRODUCED and one["effect"] == 0.5
    assert one["ci_low"] == pytest.approx(0.025 ** (1 / 8) - 0.5)
    md = (tmp_path / "FINDINGS.md").read_text()
    assert "- a vs b on `final_eval` P(A>B) - 1/2 (greater_by, margin 0.1):" in md
    assert "0.1: A beats B in more than 60% of seed pairs" in md
    plain = make_suite(tmp_path / "plain", {"a": [0.5, 0.55, 0.6], "b": [0.1, 0.12, 0.09], "c": [0.5, 0.55, 0.6]})
    report(plain)
    assert "statistic: superiority" not in (tmp_path / "plain" / "FINDINGS.md").read_text()
