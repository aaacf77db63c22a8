"""The registry and its configs: YAML stems == names, presets as documented, bad configs fail with one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.objectives import FAMILIES, OBJECTIVE_NAMES, get_objective
from harness.objectives.registry import PRESET_DIR

CONF = Path(__file__).resolve().parents[1] / "conf" / "objective"  # a link to harness/objectives/presets

EXPECTED_NAMES = {
    "ppo",
    "grpo",
    "grpo_relax",
    "pg_is",
    "pg_tis",
    "cispo",
    "cispo_minimax",
    "minirl",
    "minirl_tis",
    "dppo",
    "dppo_kl",
    "dppo_topk_tv",
    "dppo_topk_kl",
    "dppo_recompute",
    "dppo_kl_recompute",
    "mask_neg",
    "spo",
    "drpo",
    "drpo_mask",
    "drpo_no_absadv",
    "penalty_tv",
    "penalty_kl",
    "penalty_k3",
    "gspo",
    "cppo",
    "icepop",
}


def test_yaml_stems_are_the_registry():
    assert CONF.resolve() == PRESET_DIR  # Hydra's objective group is the package's presets, not a copy
    assert set(OBJECTIVE_NAMES) == {p.stem for p in CONF.glob("*.yaml")} == EXPECTED_NAMES
    for name in OBJECTIVE_NAMES:
        obj = get_objective(name)
        assert obj.name == obj.cfg.name == name and obj.cfg.family in FAMILIES


@pytest.mark.parametrize(
    "name,field,value",
    [
        ("ppo", "eps_low", 0.2),
        ("ppo", "eps_high", 0.2),
        ("grpo", "eps_high", 0.28),
        ("grpo", "eps_low", 0.2),
        ("grpo_relax", "alpha", 0.1),
        ("grpo_relax", "sides", "both"),
        ("pg_is", "is_cap", 1e4),
        ("pg_tis", "is_cap", 3.0),
        ("cispo", "is_cap", 5.0),
        ("cispo", "family", "pg"),
        ("cispo_minimax", "eps_high", 0.28),
        ("cispo_minimax", "eps_low", None),
        ("minirl", "anchor", "old"),
        ("minirl_tis", "is_cap", 3.0),
        ("dppo", "delta", 0.15),
        ("dppo_kl", "delta", 0.05),
        ("dppo_topk_tv", "topk", 20),
        ("dppo_topk_kl", "delta", 0.05),
        ("dppo_recompute", "anchor", "old"),
        ("mask_neg", "thresholds", (0.5, float("inf"))),
        ("spo", "eps", 0.2),
        ("drpo", "delta", 0.15),
        ("drpo_mask", "mask_delta", 0.15),
        ("drpo_no_absadv", "abs_adv", False),
        ("penalty_tv", "beta", 1.0),
        ("penalty_k3", "penalty", "k3"),
        ("dppo", "anchor", "behavior"),
        ("grpo", "topk", 1),
        ("gspo", "eps_low", 3e-4),
        ("gspo", "eps_high", 4e-4),
        ("gspo", "agg", "seq-mean-token-mean"),
        ("gspo", "anchor", "behavior"),
        ("cppo", "delta", 0.2),
        ("cppo", "w_min", 0.8),
        ("cppo", "delta_b", 0.02),
        ("cppo", "anchor", "behavior"),
        ("icepop", "anchor", "old"),
        ("icepop", "mask_low", 0.5),
        ("icepop", "mask_high", 5.0),
        ("icepop", "eps_low", 0.2),
        ("icepop", "eps_high", 0.2),
    ],
)
def test_documented_defaults(name, field, value):
    assert getattr(get_objective(name).cfg, field) == value


def test_overrides_apply():
    assert get_objective("dppo", delta=0.2).cfg.thresholds == (0.2, 0.2)
    assert get_objective("mask_neg", delta_low=0.8).cfg.thresholds == (0.8, float("inf"))
    assert get_objective("drpo", delta=12.5).cfg.delta == 12.5
    assert get_objective("grpo", eps_high=1).cfg.eps_high == 1.0  # ints are fine where floats are expected


@pytest.mark.parametrize(
    "name,kwargs,message",
    [
        ("dppo", {"detla": 0.2}, r"objective: unknown key 'detla'; allowed keys: .*delta"),
        ("dppo", {"delta": 0.0}, r"objective.delta: must be > 0, got 0.0"),
        ("dppo", {"delta": -1}, r"objective.delta: must be > 0"),
        ("dppo", {"delta": "big"}, r"objective.delta: expected float, got 'big'"),
        ("spo", {"eps": 0}, r"objective.eps: must be > 0"),
        ("grpo", {"eps_high": -0.1}, r"objective.eps_high: must be > 0"),
        ("dppo_topk_tv", {"topk": 0}, r"objective.topk: must be >= 1"),
        ("dppo_topk_tv", {"topk": 2.5}, r"objective.topk: expected int"),
        ("grpo", {"anchor": "rollout"}, r"objective.anchor: expected 'behavior' \| 'old', got 'rollout'"),
        ("dppo_topk_kl", {"anchor": "old"}, r"objective.anchor: a Top-K objective"),
        ("grpo_relax", {"sides": "up"}, r"objective.sides: expected 'both' \| 'high' \| 'low'"),
        ("pg_tis", {"is_cap": 0}, r"objective.is_cap: must be > 0"),
        ("drpo", {"abs_adv": "yes"}, r"objective.abs_adv: expected bool"),
        ("grpo", {"agg": "mean"}, r"objective.agg: expected 'token-mean'"),
        ("dppo", {"family": "clip"}, r"objective.family: preset 'dppo' is family 'dppo'"),
        ("gspo", {"eps_low": 0}, r"objective.eps_low: must be > 0, got 0.0"),
        ("gspo", {"eps_high": -4e-4}, r"objective.eps_high: must be > 0"),
        ("cppo", {"delta": 0}, r"objective.delta: must be > 0"),
        ("cppo", {"w_min": 0}, r"objective.w_min: must be > 0"),
        ("cppo", {"w_min": 1.2}, r"objective.w_min: must be <= 1"),
        ("cppo", {"delta_b": -0.01}, r"objective.delta_b: must be >= 0"),
        ("icepop", {"mask_low": -0.5}, r"objective.mask_low: must be >= 0"),
        ("icepop", {"mask_high": 0}, r"objective.mask_high: must be > 0"),
        (
            "icepop",
            {"mask_low": 5.0, "mask_high": 0.5},
            r"objective.mask_low: must be < objective.mask_high \(0.5\), got 5.0",
        ),
        ("icepop", {"mask_low": 2.0, "mask_high": 2.0}, r"objective.mask_low: must be < objective.mask_high"),
        ("icepop", {"anchor": "behavior"}, r"objective.anchor: icepop supports only 'old'"),
        ("icepop", {"eps_low": 0}, r"objective.eps_low: must be > 0"),
    ],
)
def test_bad_config_one_line_error(name, kwargs, message):
    with pytest.raises(ValueError, match=message) as err:
        get_objective(name, **kwargs)
    assert "\n" not in str(err.value)


def test_unknown_objective_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown objective 'dpo'; valid objectives: .*dppo.*grpo") as err:
        get_objective("dpo")
    assert "\n" not in str(err.value)
