"""analysis/dashboard.py: the W&B comparison workspace, built offline (nothing is saved, no network is touched)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from analysis.dashboard import SECTIONS, build_workspace, main
from harness.objectives import OBJECTIVE_NAMES, get_objective

REPO = Path(__file__).resolve().parents[1]


def _spec(workspace: object) -> dict:
    """The JSON view spec `save()` would send: what W&B will actually show."""
    return workspace._to_model().model_dump(by_alias=True, exclude_none=True)  # type: ignore[attr-defined]


def test_sections_panels_and_grouping() -> None:
    spec = _spec(build_workspace("ent", "proj", experiment="mini_dppo_main"))
    sections = spec["spec"]["section"]["panelBankConfig"]["sections"]
    assert [s["name"] for s in sections] == [
        "Reward and evaluation",
        "Entropy and length",
        "Training-inference mismatch",
        "Trust region",
    ]
    assert [len(s["panels"]) for s in sections] == [4, 3, 5, 7]
    for section in sections:
        for panel in section["panels"]:
            cfg = panel["config"]
            assert panel["viewType"] == "Run History Line Plot"
            # One line per objective (the top-level config field), mean over seeds with a band, against RunLog's step.
            assert (cfg["groupBy"], cfg["groupAgg"], cfg["groupArea"]) == ("objective.value", "mean", "stderr")
            assert cfg["xAxis"] == "step" and cfg["xAxisTitle"] == "training step" and cfg["yAxisTitle"]
            assert cfg["metrics"] or cfg["useMetricRegex"]
    keys = {k for s in sections for p in s["panels"] for k in p["config"]["metrics"]}
    for key in ("reward/mean", "rollout/entropy", "rollout/response_len_mean", "mismatch/k3",
                "mismatch/bad_update_frac", "objective/masked_frac_pos", "objective/masked_frac_neg"):  # fmt: skip
        assert key in keys, key

    run_set = spec["spec"]["section"]["runSets"][0]
    assert run_set["grouping"] == [{"section": "config", "name": "objective.value"}]
    # Training runs only (eval-only runs have job type "eval"), of this experiment (the W&B group).
    assert [(f["key"], f["op"], f["value"]) for f in run_set["filters"]["filters"]] == [
        ({"section": "run", "name": "jobType"}, "=", "train"),
        ({"section": "run", "name": "group"}, "=", "mini_dppo_main"),
    ]
    assert spec["displayName"] == "trust regions: mini_dppo_main"


def test_without_an_experiment_every_training_run_is_shown() -> None:
    (flt,) = _spec(build_workspace("ent", "proj"))["spec"]["section"]["runSets"][0]["filters"]["filters"]
    assert (flt["key"], flt["op"], flt["value"]) == ({"section": "run", "name": "jobType"}, "=", "train")


def test_eval_patterns_match_runlog_keys() -> None:
    # RunLog.log_eval mirrors eval.jsonl fields as eval/<benchmark>/<key>.
    specs = {s.title: s for specs in SECTIONS.values() for s in specs}
    avg, pas = specs["eval accuracy avg@k"].regex, specs["eval pass@k"].regex
    assert avg and pas
    assert re.match(avg, "eval/aime24/avg@32") and re.match(avg, "eval/arith/avg@4")
    assert not re.match(avg, "eval/aime24/pass@32") and not re.match(avg, "eval/aime24/avg@32_std")
    assert re.match(pas, "eval/aime25/pass@16") and not re.match(pas, "eval/aime25/avg@16")


def test_panel_keys_are_keys_the_harness_logs() -> None:
    keys = {k for specs in SECTIONS.values() for s in specs for k in s.keys}
    # objective/* come from the objectives themselves: the union of what every registered objective reports.
    logp = torch.log(torch.tensor([[0.3, 0.5]])).requires_grad_(True)
    mu = torch.log(torch.tensor([[0.4, 0.5]]))
    emitted: set[str] = set()
    for name in OBJECTIVE_NAMES:
        obj = get_objective(name)
        k = obj.topk > 1 or obj.cfg.needs_topk
        out = obj(
            logp=logp,
            behavior_logp=mu,
            advantages=torch.tensor([[1.0, -1.0]]),
            mask=torch.ones(1, 2),
            old_logp=mu if obj.needs_old else None,
            topk_logp=logp.detach().unsqueeze(-1) if k else None,
            topk_behavior_logp=mu.unsqueeze(-1) if k else None,
        )
        emitted |= set(out.metrics)
    assert {k for k in keys if k.startswith("objective/")} <= emitted
    # The training loop's own keys appear literally in its source (train.py, advantages.py).
    source = "".join(p.read_text() for p in (REPO / "harness").rglob("*.py"))
    for key in keys - emitted:
        assert f'"{key}"' in source, key


def test_offline_builds_but_does_not_save(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert main(["--entity", "ent", "--project", "proj", "--experiment", "mini_x"]) == 0
    out = capsys.readouterr().out
    assert out == (
        "built workspace 'trust regions: mini_x': 4 sections, 19 panels; not saved "
        "(W&B mode offline; use --mode online or WANDB_MODE=online to save)\n"
    )
