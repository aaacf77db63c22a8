"""analysis/geometry.py: the analytic gradient weights against objectives.md §6, and the tokens.parquet figures.

The coefficient c (grad = c * grad(log pi)) comes from autograd through the registered objectives, so these
tests pin the picture to the spec's hand vectors rather than to a second copy of the formulas.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from analysis.__main__ import build_token_figures
from analysis.figures import SkipFigure
from analysis.geometry import (
    fig_gradient_slices,
    fig_gradient_weight,
    fig_masked_token_curves,
    fig_masked_tokens,
    fig_ratio_vs_tv,
    fig_token_weights,
    gradient_coefficient,
    load_tokens,
    masked_token_stats,
    modulation,
    prob_grid,
    token_modulation,
)
from analysis.load import load_runs
from harness.objectives import OBJECTIVE_NAMES

# objectives.md §6: V1 low-prob up, V2 high-prob drop, V3 A>0 with pi fallen, V4 rare token, V5a/V5b either side
# of delta = 0.15, V6 small negative advantage.
MU = np.array([0.01, 0.99, 0.5, 0.001, 0.3, 0.3, 0.9])
PI = np.array([0.05, 0.80, 0.2, 0.02, 0.44, 0.46, 0.6])
ADV = np.array([1.0, -1.0, 1.0, 1.0, 1.0, 1.0, -0.5])
SPEC_C = {
    "pg_is": [5.0, -0.808081, 0.4, 20.0, 1.466667, 1.533333, -0.333333],
    "grpo": [0.0, -0.808081, 0.4, 0.0, 0.0, 0.0, 0.0],
    "dppo": [5.0, 0.0, 0.4, 20.0, 1.466667, 0.0, 0.0],
    "dppo_kl": [5.0, 0.0, 0.4, 20.0, 1.466667, 0.0, 0.0],
    "drpo": [3.666667, 0.215488, 1.2, 17.466667, 0.097778, -0.102222, 0.333333],
    "spo": [-95.0, -0.03265, 1.6, -1880.0, -1.955556, -2.555556, 0.222222],
    "cispo": [5.0, -0.808081, 0.4, 5.0, 1.466667, 1.533333, -0.333333],
    "cispo_minimax": [1.28, -0.808081, 0.4, 1.28, 1.28, 1.28, -0.333333],
}


@pytest.mark.parametrize("name", sorted(SPEC_C))
def test_coefficients_match_the_spec_vectors(name: str) -> None:
    assert gradient_coefficient(name, MU, PI, ADV) == pytest.approx(SPEC_C[name], abs=1e-5)


def test_drpo_and_spo_at_the_released_scale() -> None:
    # §6 columns "DRPO delta=12.5" and "SPO eps=12.5": w stays within 1 +- 1/12.5, never corrective.
    drpo = [4.984, -0.795798, 0.4096, 19.9696, 1.45024, 1.51371, -0.325333]
    spo = [3.4, -0.795674, 0.4192, -10.4, 1.41191, 1.46791, -0.324444]
    assert gradient_coefficient("drpo", MU, PI, ADV, delta=12.5) == pytest.approx(drpo, abs=1e-5)
    assert gradient_coefficient("spo", MU, PI, ADV, eps=12.5) == pytest.approx(spo, abs=1e-5)


def test_pg_is_weight_is_the_ratio() -> None:
    mu, pi = np.meshgrid(prob_grid(25), prob_grid(25))
    assert gradient_coefficient("pg_is", mu, pi, 1.0) == pytest.approx(pi / mu, rel=1e-9)
    assert gradient_coefficient("pg_is", mu, pi, -0.5) == pytest.approx(-0.5 * pi / mu, rel=1e-9)


@pytest.mark.parametrize(("name", "low", "high"), [("grpo", 0.2, 0.28), ("ppo", 0.2, 0.2)])
def test_clip_is_zero_outside_its_region_with_the_right_sign(name: str, low: float, high: float) -> None:
    mu, pi = np.meshgrid(prob_grid(41), prob_grid(41))
    r = pi / mu
    for adv in (1.0, -1.0):
        c = gradient_coefficient(name, mu, pi, adv)
        # Gradient form of PPO-clip: the token is dropped only where the clip binds in the direction of A.
        clipped = (r > 1 + high) if adv > 0 else (r < 1 - low)
        assert clipped.any() and (~clipped).any()
        assert np.all(c[clipped] == 0)
        assert c[~clipped] == pytest.approx(adv * r[~clipped], rel=1e-9)
        assert np.all(np.sign(c[~clipped]) == np.sign(adv))


def test_variants_that_coincide_without_mismatch() -> None:
    mu, pi = np.meshgrid(prob_grid(31), prob_grid(31))
    for adv in (1.0, -1.0):
        # K = 1 Top-K is Binary; anchor=old with pi_old = mu is the behaviour anchor.
        for a, b in [
            ("dppo_topk_tv", "dppo"),
            ("dppo_topk_kl", "dppo_kl"),
            ("dppo_recompute", "dppo"),
            ("minirl", "grpo"),
        ]:
            assert np.array_equal(gradient_coefficient(a, mu, pi, adv), gradient_coefficient(b, mu, pi, adv)), (a, b)


@pytest.mark.parametrize("name", OBJECTIVE_NAMES)
def test_every_objective_is_finite_and_silent_at_zero_advantage(name: str) -> None:
    mu, pi = np.meshgrid(prob_grid(21), prob_grid(21))
    for adv in (1.0, -1.0):
        assert np.isfinite(gradient_coefficient(name, mu, pi, adv)).all()
    assert np.all(gradient_coefficient(name, mu, pi, 0.0) == 0)


def test_sequence_objectives_are_drawn_per_token() -> None:
    # Each point is its own one-token response: GSPO's s is that token's r = pi/mu, clipped above 1 + 4e-4 (A > 0);
    # CPPO's first token has c_1 = delta = 0.2, so it is DPPO-TV at 0.2. (As one response of the whole grid, GSPO
    # would give every point the grid's one s, and CPPO's budget would run across points.)
    mu, pi = np.meshgrid(prob_grid(21), prob_grid(21))
    r = pi / mu
    assert gradient_coefficient("gspo", mu, pi, 1.0) == pytest.approx(np.where(r > 1 + 4e-4, 0.0, r), rel=1e-12)
    assert gradient_coefficient("cppo", mu, pi, 1.0) == pytest.approx(np.where(pi - mu > 0.2, 0.0, r), rel=1e-12)


def test_drpo_modulation_is_its_weight_and_turns_corrective_past_delta() -> None:
    mu, pi = np.meshgrid(prob_grid(41), prob_grid(41))
    for adv in (1.0, -1.0):
        w = modulation("drpo", mu, pi, adv)
        assert w == pytest.approx(1 - np.sign(adv) * (pi - mu) / 0.15, abs=1e-9)
    # A > 0: corrective (w < 0) exactly where pi has moved more than delta above mu.
    w = modulation("drpo", mu, pi, 1.0)
    assert np.array_equal(w < 0, pi - mu > 0.15)
    with pytest.raises(ValueError, match="adv must be non-zero"):
        modulation("drpo", mu, pi, 0.0)


def test_heatmap_figure_shows_the_modulation() -> None:
    fig = fig_gradient_weight(["pg_is", "grpo"], n=21)
    axes = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in axes] == ["pg_is, A > 0", "grpo, A > 0", "pg_is, A < 0", "grpo, A < 0"]
    assert len(fig.axes) == 5  # four panels and the colour bar
    grid = prob_grid(21)
    mu, pi = np.meshgrid(grid, grid)
    grpo_up = np.asarray(axes[1].images[0].get_array())
    # 1 where GRPO keeps the plain IS gradient (pi/mu <= 1.28), 0 where the clip drops it.
    assert grpo_up == pytest.approx(np.where(pi / mu > 1.28, 0.0, 1.0), abs=1e-12)
    assert axes[2].get_xlabel() == "μ (rollout probability of the token)" and axes[0].get_ylabel().startswith("π")
    assert np.asarray(axes[0].images[0].get_array()) == pytest.approx(np.ones((21, 21)))
    with pytest.raises(ValueError, match="unknown objectives"):
        fig_gradient_weight(["nope"])
    (ax0, ax1) = fig_gradient_slices(["pg_is", "drpo"], mus=(0.01, 0.5), n=50).axes
    line = {ln.get_label(): ln for ln in ax0.get_lines()}["pg_is"]
    assert line.get_ydata() == pytest.approx(prob_grid(50) / 0.01)


# --- tokens.parquet -------------------------------------------------------------------------------------------


def _tokens(obj: str) -> pd.DataFrame:
    if obj == "grpo":
        # step 0: r = 2, 1.5, 1, 0.667 -> clip-higher drops tokens 0, 1 (A > 0, r > 1.28) and 3 (A < 0, r < 0.8).
        return pd.DataFrame(
            {
                "step": [0, 0, 0, 0, 5, 5],
                "mu": [0.005, 0.2, 0.5, 0.9, 0.1, 0.4],
                "pi": [0.01, 0.3, 0.5, 0.6, 0.1, 0.2],
                "adv": [1.0, 1.0, -1.0, -1.0, -1.0, 1.0],
                "entropy": [2.0, 1.0, 0.5, 0.25, 1.5, 0.5],
                "kept": [False, False, True, False, True, True],
                # weight = c / A as the trainer writes it: r where kept, 0 where clipped.
                "weight": [0.0, 0.0, 1.0, 0.0, 1.0, 0.5],
                "token_id": [5, 6, 7, 8, 9, 10],
                "pos": [0, 1, 2, 3, 0, 1],
                "row": [0, 0, 0, 0, 1, 1],  # columns the reader does not use are carried along, never as arms
                "pi_old": [math.nan] * 6,
            }
        )
    # DRPO (delta 0.15) at V1 and V2 (objectives.md §6): c = 3.666667 (A = 1) and 0.215488 (A = -1), so c / A =
    # 3.666667 and -0.215488; w = c / (A r) = 1 - 0.04/0.15 = 0.7333 and 1 - 0.19/0.15 = -0.2667. Nothing masked.
    return pd.DataFrame(
        {
            "step": [0, 0],
            "mu": [0.01, 0.99],
            "pi": [0.05, 0.8],
            "adv": [1.0, -1.0],
            "entropy": [1.0, 0.1],
            "kept": [True, True],
            "weight": [3.666667, -0.215488],
            "token_id": [1, 2],
            "pos": [0, 1],
        }
    )


@pytest.fixture()
def token_runs(tmp_path: Path) -> Path:
    root = tmp_path / "outputs"
    for obj, seed, with_tokens in [("grpo", 0, True), ("drpo", 0, True), ("drpo", 1, False)]:
        run_dir = root / "exp_t" / f"objective={obj},seed={seed}"
        (run_dir / ".hydra").mkdir(parents=True)
        cfg = {"name": "exp_t", "seed": seed, "objective": {"name": obj}, "precision": {"name": "fp32"}}
        OmegaConf.save(OmegaConf.create({**cfg, "model": {"name": "tiny"}}), run_dir / ".hydra" / "config.yaml")
        (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
        (run_dir / "summary.json").write_text(json.dumps({"status": "completed"}))
        if with_tokens:
            _tokens(obj).to_parquet(run_dir / "tokens.parquet")
    return root


def _load(root: Path) -> tuple[pd.DataFrame, list[str]]:
    rs = load_runs([root])
    return load_tokens(rs.summaries[["run", "seed", "objective.name", "name"]])


def test_load_tokens_skips_runs_without_the_file(token_runs: Path) -> None:
    tokens, without = _load(token_runs)
    assert len(tokens) == 8 and [Path(w).name for w in without] == ["objective=drpo,seed=1"]
    assert tokens.groupby("objective.name").size().to_dict() == {"drpo": 2, "grpo": 6}
    assert tokens["kept"].dtype == bool


def test_masked_token_stats_hand_values(token_runs: Path) -> None:
    tokens, _ = _load(token_runs)
    stats = masked_token_stats(tokens).set_index(["objective.name", "step"])
    # grpo step 0 masks mu 0.005, 0.2, 0.9 (entropy 2, 1, 0.25): means 0.368333 and 1.083333, 3 of 4 tokens.
    assert stats.loc[("grpo", 0), "tokens/masked_mu_mean"] == pytest.approx(1.105 / 3)
    assert stats.loc[("grpo", 0), "tokens/masked_entropy_mean"] == pytest.approx(3.25 / 3)
    assert stats.loc[("grpo", 0), "tokens/masked_frac"] == pytest.approx(0.75)
    assert stats.loc[("grpo", 5), "tokens/masked_frac"] == 0 and math.isnan(
        stats.loc[("grpo", 5), "tokens/masked_mu_mean"]
    )
    assert stats.loc[("drpo", 0), "tokens/masked_frac"] == 0


def test_token_figures_from_a_synthetic_parquet(token_runs: Path) -> None:
    tokens, _ = _load(token_runs)
    fig = fig_ratio_vs_tv(tokens)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["drpo (n=1 runs)", "grpo (n=1 runs)"]
    grpo_ax = fig.axes[1]
    rare = next(c for c in grpo_ax.collections if c.get_label().startswith("μ < 0.01"))
    # The one rare grpo token: |pi - mu| = 0.005, ratio 2.
    assert np.asarray(rare.get_offsets()) == pytest.approx(np.array([[0.005, 2.0]]))
    assert grpo_ax.get_xlabel() == "|π − μ| (probability gap)" and grpo_ax.get_ylabel() == "importance ratio π / μ"

    # Only grpo masked anything, so the masked-token figures have its column alone.
    masked = fig_masked_tokens(tokens)
    assert [ax.get_title() for ax in masked.axes] == ["grpo (n=1 runs)", ""]
    labels = [t.get_text() for t in masked.axes[0].get_legend().get_texts()]
    assert labels == ["kept (3)", "masked / clipped (3)"]
    (line,) = fig_masked_token_curves(tokens).axes[0].get_lines()
    assert line.get_label() == "grpo (n=1)" and line.get_ydata() == pytest.approx([1.105 / 3])

    w = token_modulation(tokens).groupby(tokens["objective.name"]).apply(list)
    assert w["drpo"] == pytest.approx([1 - 0.04 / 0.15, 1 - 0.19 / 0.15], abs=1e-6)
    assert w["grpo"] == pytest.approx([0, 0, 1, 0, 1, 1])
    weights = fig_token_weights(tokens)
    legends = [[t.get_text() for t in ax.get_legend().get_texts()] for ax in weights.axes]
    assert legends == [
        ["2 tokens: 0.0% w=0, 50.0% w<0, 0.0% w>1"],
        ["6 tokens: 50.0% w=0, 0.0% w<0, 0.0% w>1"],
    ]
    with pytest.raises(SkipFigure, match="differs from plain PG-IS"):
        fig_token_weights(tokens[tokens["step"] == 5])  # grpo's step-5 tokens were all kept: w = 1
    with pytest.raises(SkipFigure, match="no masked or clipped tokens"):
        fig_masked_tokens(tokens[tokens["objective.name"] == "drpo"])


def test_driver_writes_token_figures_and_tolerates_bad_files(
    token_runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    rs = load_runs([token_runs]).experiment("exp_t")
    paths = build_token_figures(rs, "exp_t", tmp_path / "figs")
    assert sorted(p.name for p in paths) == [
        "tokens_masked.png",
        "tokens_masked_curves.png",
        "tokens_ratio_vs_gap.png",
        "tokens_weights.png",
    ]
    assert "note exp_t/tokens_*: 1 of 3 runs have no tokens.parquet" in capsys.readouterr().out

    # A torn parquet and one without mu: each is left out with a warning, and the third run has none at all.
    for run_dir in token_runs.glob("exp_t/*seed=0"):
        (run_dir / "tokens.parquet").write_bytes(b"PAR1 torn")
    grpo = next(token_runs.glob("exp_t/objective=grpo*"))
    _tokens("grpo").drop(columns="mu").to_parquet(grpo / "tokens.parquet")
    with caplog.at_level(logging.WARNING):
        assert build_token_figures(rs, "exp_t", tmp_path / "figs2") == []
    assert capsys.readouterr().out == "skip exp_t/tokens_*: no tokens.parquet in its 3 runs\n"
    messages = [r.getMessage() for r in caplog.records]
    assert any("tokens.parquet: no mu column; its tokens are left out" in m for m in messages)
    assert any("tokens.parquet: unreadable" in m for m in messages)
