"""analysis/: synthetic run directories with hand-chosen values -> frames, figures and tables with known numbers.

Experiment exp_a: grpo and dppo x seeds 0, 1, 2, steps 1..10, evaluations at steps 0, 5, 10:
    reward/mean(step k)  = a + 0.05 k + 0.01 seed        a = 0.1 (grpo), 0.2 (dppo)
    mismatch/k3          = m (seed + 1)                   m = 0.001 (grpo), 0.002 (dppo)
    avg@4 at 0 / 5 / 10  = 0.1 / b5 + 0.1 seed / b10 + 0.1 seed,  (b5, b10) = (0.5, 0.3) grpo, (0.6, 0.7) dppo
plus a failed dppo run (seed 3, rewards of 100 that must not show) and a torn last line in grpo seed 2.
Experiment sweep_b (under multirun/): dppo with delta 0.05 / 0.15 / 0.5 x seeds 0, 1; one run has no
summary.json (kept, with a warning), one has a corrupt middle line in metrics.jsonl (left out, listed).
"""

from __future__ import annotations

import json
import logging
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PolyCollection
from omegaconf import OmegaConf
from scipy.ndimage import gaussian_filter1d

from analysis.__main__ import main
from analysis.figures import (
    METRIC_FIGURES,
    SkipFigure,
    draw,
    fig_delta_sweep,
    fig_eval_curves,
    fig_final_scores,
    save_figure,
)
from analysis.load import find_run_dirs, load, load_runs, parse_wandb_source, runset_from_wandb, split_wandb_history
from analysis.stats import arm_columns, mean_ci, t_critical
from analysis.tables import clipped_token_table, clipped_tokens_markdown, experiment_table, to_markdown

REPO = Path(__file__).resolve().parents[1]
A = {"grpo": 0.1, "dppo": 0.2}
M = {"grpo": 0.001, "dppo": 0.002}
B = {"grpo": (0.5, 0.3), "dppo": (0.6, 0.7)}
DELTA = {"grpo": 0.2, "dppo": 0.15}  # preset defaults: they vary, but only together with the objective


def _config(name: str, objective: str, seed: int, delta: float) -> dict:
    return {
        "name": name,
        "seed": seed,
        "objective": {"name": objective, "family": objective, "delta": delta},
        "precision": {"name": "fp32"},
        "model": {"name": "tiny"},
        "trainer": {"lr": 1e-4, "total_steps": 10},
        "data": {"seed": seed, "kinds": ["add", "mul"]},  # a relabelled seed and a list: neither is an arm
        "eval": {"n": 4},
    }


def _write_run(
    run_dir: Path,
    cfg: dict,
    metrics: list[dict],
    evals: list[dict],
    status: str | None = "completed",
    error: str | None = None,
) -> None:
    (run_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(cfg), run_dir / ".hydra" / "config.yaml")
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    (run_dir / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    if status is not None:
        (run_dir / "summary.json").write_text(json.dumps({"status": status, "error": error, "wandb": {"id": None}}))


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("runs")
    outputs, multirun = base / "outputs", base / "multirun"
    for obj in ("grpo", "dppo"):
        for seed in range(3):
            run_dir = outputs / "exp_a" / "2025-01-01_00-00-00" / f"objective={obj},seed={seed}"
            metrics = [
                {
                    "step": k,
                    "reward/mean": A[obj] + 0.05 * k + 0.01 * seed,
                    "mismatch/k3": M[obj] * (seed + 1),
                    "mismatch/abs_prob_diff_mean": None,  # JSON null, as RunLog writes a NaN
                }
                for k in range(1, 11)
            ]
            b5, b10 = B[obj]
            evals = [
                {"step": s, "benchmark": "arith", "avg@4": v, "pass@4": 1.0}
                for s, v in ((0, 0.1), (5, b5 + 0.1 * seed), (10, b10 + 0.1 * seed))
            ]
            _write_run(run_dir, _config("exp_a", obj, seed, DELTA[obj]), metrics, evals)
            if (obj, seed) == ("grpo", 2):
                with open(run_dir / "metrics.jsonl", "a") as f:
                    f.write('{"step": 11, "reward/me')  # a crash mid-write
    failed = outputs / "exp_a" / "2025-01-01_00-00-00" / "objective=dppo,seed=3"
    bad = [{"step": k, "reward/mean": 100.0, "mismatch/k3": 100.0} for k in (1, 2, 3)]
    _write_run(failed, _config("exp_a", "dppo", 3, 0.15), bad, [], status="failed", error="RuntimeError: boom\nstack")

    for delta in (0.05, 0.15, 0.5):
        for seed in range(2):
            run_dir = multirun / "sweep_b" / "x" / f"objective.delta={delta},seed={seed}"
            metrics = [{"step": k, "reward/mean": delta + 0.1 * seed} for k in (1, 2, 3)]
            evals = [{"step": s, "benchmark": "arith", "avg@4": delta * s / 3 + 0.1 * seed} for s in (0, 3)]
            status = None if (delta, seed) == (0.5, 1) else "completed"
            _write_run(run_dir, _config("sweep_b", "dppo", seed, delta), metrics, evals, status=status)
    corrupt = multirun / "sweep_b" / "x" / "objective.delta=0.5,seed=7"
    _write_run(corrupt, _config("sweep_b", "dppo", 7, 0.5), [{"step": 1, "reward/mean": 9.0}], [])
    (corrupt / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    return outputs, multirun


# --- statistics ---------------------------------------------------------------------------------------------


def _t_cdf_mass(t: float, dof: int) -> float:
    """P(|T| < t) for Student t by the trapezoid rule on its density."""
    x = np.linspace(-t, t, 200_001)
    log_c = math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2) - 0.5 * math.log(dof * math.pi)
    pdf = np.exp(log_c - (dof + 1) / 2 * np.log1p(x**2 / dof))
    return float(np.sum((pdf[1:] + pdf[:-1]) / 2) * (x[1] - x[0]))


@pytest.mark.parametrize("dof", [1, 2, 4, 10, 30, 31, 100])
def test_t_critical_holds_95_percent(dof: int) -> None:
    assert _t_cdf_mass(t_critical(dof), dof) == pytest.approx(0.95, abs=3e-4)


def test_mean_ci_hand_values() -> None:
    # x = 0: seeds 1, 2, 3 -> mean 2, sd 1, half-width t_{0.975,2} / sqrt(3) = 4.3026527 / 1.732 = 2.4841.
    # x = 1: one seed -> its value, no band.
    wide = pd.DataFrame({"r0": [1.0, 5.0], "r1": [2.0, None], "r2": [3.0, None]})
    st = mean_ci(wide)
    assert st["mean"].tolist() == [2.0, 5.0]
    assert st["n"].tolist() == [3, 1]
    assert st.loc[0, "lo"] == pytest.approx(2 - 4.3026527 / math.sqrt(3))
    assert st.loc[0, "hi"] == pytest.approx(2 + 4.3026527 / math.sqrt(3))
    assert math.isnan(st.loc[1, "lo"]) and math.isnan(st.loc[1, "hi"])


# --- loading --------------------------------------------------------------------------------------------------


def test_load_frames(roots: tuple[Path, Path], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        rs = load_runs(roots)
    assert rs.experiments == ["exp_a", "sweep_b"]
    a = rs.experiment("exp_a")
    # 6 good runs x 10 steps: the failed run's 3 rows are not there, the torn step 11 is not there.
    assert len(a.metrics) == 60 and a.metrics["step"].max() == 10
    assert a.metrics.groupby("run").size().tolist() == [10] * 6
    assert (a.metrics["reward/mean"] < 100).all()
    assert len(a.evals) == 18 and sorted(a.evals["step"].unique()) == [0, 5, 10]
    for col in ("run", "name", "seed", "objective.name", "precision.name", "trainer.lr", "objective.delta"):
        assert col in a.metrics.columns and col in a.evals.columns and col in a.summaries.columns
    assert a.metrics["trainer.lr"].eq(1e-4).all() and a.metrics["data.kinds"].eq('["add", "mul"]').all()
    assert sorted(a.metrics["seed"].unique()) == [0, 1, 2]
    assert a.metrics["mismatch/abs_prob_diff_mean"].isna().all()
    # The step-3 value of grpo seed 1 is the one written: a + 0.05 * 3 + 0.01 * 1.
    row = a.metrics[(a.metrics["objective.name"] == "grpo") & (a.metrics["seed"] == 1) & (a.metrics["step"] == 3)]
    assert row["reward/mean"].item() == pytest.approx(0.26)

    # Every run is listed in summaries; the failed one says why and is the only one left out.
    assert len(a.summaries) == 7
    assert a.failed["run"].str.endswith("objective=dppo,seed=3").tolist() == [True]
    assert a.failed["error"].item().startswith("RuntimeError: boom")
    assert any("torn last line" in r.getMessage() for r in caplog.records)

    b = rs.experiment("sweep_b")
    assert len(b.summaries) == 7 and len(b.metrics) == 18  # the corrupt run is listed but has no rows
    assert b.failed["load_error"].str.contains("line 2 is not valid JSON").tolist() == [True]
    assert (b.summaries["status"] == "missing").sum() == 1
    assert any("summary.json missing" in r.getMessage() for r in caplog.records)

    with pytest.raises(ValueError, match="experiments found: exp_a, sweep_b"):
        rs.experiment("nope")
    assert len(load_runs(roots, include_failed=True).experiment("exp_a").metrics) == 63


def test_find_run_dirs_skips_missing_roots(roots: tuple[Path, Path], tmp_path: Path) -> None:
    assert len(find_run_dirs([roots[0], tmp_path / "absent"])) == 7
    assert load_runs([tmp_path / "absent"]).summaries.empty


def test_arm_columns(roots: tuple[Path, Path]) -> None:
    rs = load_runs(roots)
    # objective.family and the preset deltas follow objective.name; data.seed is the seed again.
    assert arm_columns(rs.experiment("exp_a").metrics) == ["objective.name"]
    assert arm_columns(rs.experiment("sweep_b").metrics) == ["objective.delta"]


# --- figures --------------------------------------------------------------------------------------------------


def test_reward_curves_one_line_per_objective(roots: tuple[Path, Path], tmp_path: Path) -> None:
    metrics = load_runs(roots).experiment("exp_a").metrics
    fig = draw("reward_curves", metrics, title="exp_a")
    (ax,) = fig.axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert sorted(lines) == ["dppo (n=3)", "grpo (n=3)"]
    # Step 1, grpo: mean over seeds of 0.1 + 0.05 + 0.01 seed = 0.16; dppo 0.26.
    assert lines["grpo (n=3)"].get_ydata()[0] == pytest.approx(0.16)
    assert lines["dppo (n=3)"].get_ydata()[0] == pytest.approx(0.26)
    assert list(lines["grpo (n=3)"].get_xdata()) == list(range(1, 11))
    assert sum(isinstance(c, PolyCollection) for c in ax.collections) == 2  # one CI band per arm
    (png,) = save_figure(fig, tmp_path / "figs", "reward_curves")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_precision_gets_its_own_panels(roots: tuple[Path, Path]) -> None:
    metrics = load_runs(roots).experiment("exp_a").metrics
    bf16 = metrics.assign(run=metrics["run"] + "-bf16", **{"precision.name": "bf16"})
    fig = draw("reward_curves", pd.concat([metrics, bf16], ignore_index=True))
    assert [ax.get_title() for ax in fig.axes] == ["precision = bf16", "precision = fp32"]
    assert [len(ax.get_lines()) for ax in fig.axes] == [2, 2]


def test_missing_columns_skip_with_a_reason(roots: tuple[Path, Path]) -> None:
    rs = load_runs(roots).experiment("exp_a")
    with pytest.raises(SkipFigure, match="objective/neg_weight_frac"):
        draw("drpo_weights", rs.metrics)
    # abs_prob_diff_mean is all null: the mismatch figure keeps only its k3 panel.
    assert len(draw("mismatch", rs.metrics).axes) == 1
    with pytest.raises(SkipFigure, match="no arm has more than one objective.delta"):
        fig_delta_sweep(rs.evals)


def test_eval_figures(roots: tuple[Path, Path]) -> None:
    rs = load_runs(roots)
    a = rs.experiment("exp_a").evals
    (ax,) = fig_eval_curves(a).axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    # grpo at steps 0 / 5 / 10: 0.1, then 0.5 + 0.1 seed and 0.3 + 0.1 seed averaged over seeds 0..2.
    assert lines["grpo (n=3)"].get_ydata() == pytest.approx([0.1, 0.6, 0.4])
    assert len(fig_final_scores(a).axes[0].patches) == 2  # one bar per objective

    (ax,) = fig_delta_sweep(rs.experiment("sweep_b").evals).axes
    (line,) = ax.get_lines()
    # final avg@4 = delta + 0.1 seed at step 3, averaged over seeds 0 and 1 (the corrupt seed 7 is left out).
    assert list(line.get_xdata()) == [0.05, 0.15, 0.5]
    assert line.get_ydata() == pytest.approx([0.1, 0.2, 0.55])


# --- tables ---------------------------------------------------------------------------------------------------


def test_table_matches_hand_means(roots: tuple[Path, Path]) -> None:
    rs = load_runs(roots).experiment("exp_a")
    table = experiment_table(rs.metrics, rs.evals).set_index("objective.name")
    assert table.attrs["score"] == "avg@4"
    assert table["n"].tolist() == [3, 3]
    # final: grpo 0.3/0.4/0.5, dppo 0.7/0.8/0.9; best: grpo 0.5 + 0.1 seed, dppo 0.7 + 0.1 seed.
    assert table.loc["grpo", "final_mean"] == pytest.approx(0.4)
    assert table.loc["grpo", "final_std"] == pytest.approx(0.1)
    assert table.loc["dppo", "final_mean"] == pytest.approx(0.8)
    assert table.loc["grpo", "best_mean"] == pytest.approx(0.6) and table.loc["dppo", "best_mean"] == pytest.approx(0.8)
    # final reward = the last 10% of 10 steps = step 10: a + 0.5 + 0.01 seed -> 0.61 (grpo), 0.71 (dppo), sd 0.01.
    assert table.loc["grpo", "final_reward_mean"] == pytest.approx(0.61)
    assert table.loc["dppo", "final_reward_mean"] == pytest.approx(0.71)
    assert table.loc["dppo", "final_reward_std"] == pytest.approx(0.01)
    # mismatch k3 = m (seed + 1) averaged over seeds = 2 m.
    assert table.loc["grpo", "mismatch_k3_mean"] == pytest.approx(0.002)
    assert table.loc["dppo", "mismatch_k3_mean"] == pytest.approx(0.004)
    # 95% CI half-width over 3 seeds = t_{0.975,2} sd / sqrt(3) = 4.3026527 sd / 1.7321 = 2.4841 sd.
    assert table.loc["grpo", "final_ci"] == pytest.approx(4.3026527 * 0.1 / math.sqrt(3))
    assert table.loc["dppo", "final_reward_ci"] == pytest.approx(4.3026527 * 0.01 / math.sqrt(3))
    md = to_markdown(table.reset_index())
    assert "| objective | benchmark | n | final avg@4 | best avg@4 | final reward | mismatch k3 |" in md
    # final 0.4 ± 0.248, best 0.6 ± 0.248, reward 0.61 ± 0.0248, mismatch 0.002 ± 2.4843 * 0.001.
    assert "| grpo | arith | 3 | 0.400 ± 0.248 | 0.600 ± 0.248 | 0.610 ± 0.025 | 0.002 ± 0.00248 |" in md


# --- the command ----------------------------------------------------------------------------------------------


@pytest.mark.slow  # starts python -m analysis
def test_cli_writes_every_experiment(
    roots: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "figs"
    cmd = [sys.executable, "-m", "analysis", "--roots", *map(str, roots), "--out", str(out)]
    cmd += ["--geometry-objectives", "pg_is", "drpo"]  # two objectives keep the analytic part quick
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    for rel in ("exp_a/reward_curves.png", "exp_a/eval_curves.png", "exp_a/table.md", "exp_a/table.csv",
                "exp_a/table.tex", "exp_a/final_scores.png", "sweep_b/delta_sweep.png",
                "geometry/gradient_weight_overview.png", "geometry/gradient_slices.png",
                "geometry/gradient_weight_pg_is.png", "geometry/gradient_weight_drpo.png", "index.md"):  # fmt: skip
        assert (out / rel).is_file(), rel
        assert f"wrote {out / rel}" in res.stdout
    assert not (out / "geometry" / "gradient_weight_grpo.png").exists()
    # Progress: the runs read, then a line as each experiment starts (before its files), then the geometry.
    lines = res.stdout.splitlines()
    assert re.fullmatch(r"read 14 runs of 2 experiments in \d+ s", lines[0]), lines[0]
    starts = [i for i, line in enumerate(lines) if re.fullmatch(r"\[\d/2\] \w+: \d+ runs \(elapsed \d+ s\)", line)]
    assert [lines[i].split(":")[0] for i in starts] == ["[1/2] exp_a", "[2/2] sweep_b"]
    assert lines.index(f"wrote {out / 'exp_a/table.md'}") > starts[0] and lines[starts[1] - 1].startswith("wrote")
    assert "skip exp_a/drpo_weights: no values for objective/neg_weight_frac" in res.stdout
    assert "skip exp_a/tokens_*: no tokens.parquet in its 6 runs" in res.stdout
    # The paper figures whose keys these runs did not log are skipped with their reason.
    assert "skip exp_a/mismatch_range: no values for mismatch/mu_minus_pi_max / mismatch/mu_minus_pi_min" in res.stdout
    assert "skip exp_a/clipped_token_curves: no values for objective/clipped_mu_mean_pos|neg" in res.stdout
    assert "skip exp_a/rollout_probability: no values for rollout/topk_mass / rollout/low_prob_frac" in res.stdout
    assert "skip exp_a/clipped_tokens: no clipped_tokens.csv in its 6 runs" in res.stdout
    table_md = (out / "exp_a" / "table.md").read_text()
    assert "objective=dppo,seed=3` (failed): RuntimeError: boom" in table_md
    assert r"0.400 $\pm$ 0.248" in (out / "exp_a" / "table.tex").read_text()
    index = (out / "index.md").read_text()
    assert "0.400 ± 0.248" in index
    assert "[gradient_weight_overview.png](geometry/gradient_weight_overview.png)" in index
    assert "[reward_curves.png](exp_a/reward_curves.png)" in index

    # One experiment by name; a name that does not exist lists the valid ones.
    assert (
        main(["--roots", *map(str, roots), "--out", str(tmp_path / "f3"), "--experiment", "sweep_b", "--no-geometry"])
        == 0
    )
    assert (tmp_path / "f3" / "sweep_b" / "table.md").is_file() and not (tmp_path / "f3" / "exp_a").exists()
    assert main(["--roots", *map(str, roots), "--out", str(tmp_path / "f4"), "--experiment", "nope"]) == 2
    assert "experiments found: exp_a, sweep_b" in capsys.readouterr().err

    # No runs: one line, exit 0, nothing written (in-process: the subprocess above already covers the entry point).
    assert main(["--roots", str(tmp_path / "none"), "--out", str(tmp_path / "f2")]) == 0
    assert capsys.readouterr().out == f"no runs found under {tmp_path / 'none'}: nothing to plot\n"
    assert not (tmp_path / "f2").exists()


# --- the tidy frame and W&B as a second source ----------------------------------------------------------------


def test_tidy_frame_one_row_per_run_and_step(roots: tuple[Path, Path]) -> None:
    tidy = load_runs(roots).experiment("exp_a").tidy()
    # 6 runs x (steps 1..10 from metrics.jsonl + the step-0 evaluation) = 66 rows; the failed run is not there.
    assert len(tidy) == 66 and not tidy.duplicated(["run", "step"]).any()
    for col in ("experiment", "objective", "precision", "seed", "objective.name", "reward/mean", "eval/arith/avg@4"):
        assert col in tidy.columns, col
    assert set(tidy["experiment"]) == {"exp_a"} and set(tidy["objective"]) == {"grpo", "dppo"}
    one = tidy[(tidy["objective"] == "dppo") & (tidy["seed"] == 1)].set_index("step")
    # Step 0 has only the evaluation; step 5 has both: reward 0.2 + 0.25 + 0.01 = 0.46 and avg@4 0.6 + 0.1 = 0.7.
    assert math.isnan(one.loc[0, "reward/mean"]) and one.loc[0, "eval/arith/avg@4"] == pytest.approx(0.1)
    assert one.loc[5, "reward/mean"] == pytest.approx(0.46) and one.loc[5, "eval/arith/avg@4"] == pytest.approx(0.7)
    assert math.isnan(one.loc[4, "eval/arith/avg@4"])
    # `load` is the one-call spelling of the same frame; outputs/ holds exp_a only.
    pd.testing.assert_frame_equal(load(roots[0]), tidy)


def _wandb_record(obj: str, seed: int, state: str, redo_last: bool = False) -> dict:
    """What the W&B API gives for one exp_a run mirrored by RunLog: sparse history rows, each log call its own."""
    history: list[dict] = []

    def log(row: dict) -> None:
        history.append({"_step": len(history), "_runtime": 0.5 * len(history), "_timestamp": 1.7e9, **row})

    b5, b10 = B[obj]
    log({"step": 0, "eval/arith/avg@4": 0.1, "eval/arith/pass@4": 1.0})
    for k in range(1, 11):
        if redo_last and k == 9:  # a first session logged 9 and 10 with other values, then resumed from step 8
            log({"step": 9, "reward/mean": 99.0, "mismatch/k3": 99.0})
            log({"step": 10, "reward/mean": 99.0, "mismatch/k3": 99.0})
        log({"step": k, "reward/mean": A[obj] + 0.05 * k + 0.01 * seed, "mismatch/k3": M[obj] * (seed + 1)})
        if k in (5, 10):
            v = (b5 if k == 5 else b10) + 0.1 * seed
            log({"step": k, "eval/arith/avg@4": v, "eval/arith/pass@4": 1.0})
            log({"step": k, "samples": {"_type": "table-file", "path": "media/table.json"}})
    cfg = _config("exp_a", obj, seed, DELTA[obj])
    # RunLog's layout (harness/loop/wandb_run.py): filter fields on top, the config under `cfg`, job type train.
    # Seed 0's runs keep the layout of earlier versions: the config on top, the objective as the job type.
    legacy = seed == 0
    fields = {"objective": obj, "precision": "fp32", "model": "tiny", "seed": seed, "experiment": "exp_a"}
    return {
        "id": f"{obj}-{seed}",
        "entity": "ent",
        "project": "proj",
        "group": "exp_a",
        "job_type": obj if legacy else "train",
        "tags": ["tiny", "fp32"],
        "state": state,
        "config": {**(cfg if legacy else {**fields, "cfg": cfg}), "_wandb": {"cli_version": "0.31.0"}},
        "summary": {"status": "completed", "_step": len(history) - 1} if state == "finished" else {},
        "history": history,
    }


def test_wandb_source_gives_the_same_frame(roots: tuple[Path, Path]) -> None:
    records = [
        _wandb_record(obj, seed, "finished", redo_last=(obj, seed) == ("dppo", 0)) for obj in A for seed in range(3)
    ]
    records.append(_wandb_record("dppo", 3, "crashed"))  # killed hard: no RunLog status in the W&B summary
    remote = runset_from_wandb(records)
    assert remote.experiments == ["exp_a"]
    assert remote.failed["run"].tolist() == ["wandb:ent/proj/dppo-3"]
    assert len(remote.summaries) == 7 and len(remote.metrics) == 60 and len(remote.evals) == 18

    local = load_runs(roots).experiment("exp_a").tidy()
    wb = remote.tidy()
    # Keys W&B never saw (the all-null abs_prob_diff_mean) are the only extra columns of the run directories.
    assert set(local.columns) - set(wb.columns) == {"mismatch/abs_prob_diff_mean"}
    assert local["mismatch/abs_prob_diff_mean"].isna().all()
    order = ["objective.name", "seed", "step"]
    cols = [c for c in wb.columns if c != "run"]
    a = local[cols].sort_values(order).reset_index(drop=True)
    b = wb[cols].sort_values(order).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b, check_dtype=False)
    # The redone steps kept the resumed session's values, as the run directory does.
    redo = wb[(wb["objective"] == "dppo") & (wb["seed"] == 0) & (wb["step"] == 10)]
    assert redo["reward/mean"].item() == pytest.approx(0.7)


def test_wandb_history_rows_are_split_by_key() -> None:
    rows = [
        {"_step": 0, "step": 0, "eval/aime24/avg@32": 0.25, "eval/aime24/acc/int": 0.5},
        {"_step": 1, "step": 1, "reward/mean": 0.5, "rollout/entropy": float("nan"), "flag": True},
        {"_step": 2, "step": 1, "samples": {"_type": "table-file"}},
        {"_step": 3, "step": 1, "eval/avg@4": 0.75},  # an evaluation logged without a benchmark name
        {"_step": 4, "reward/mean": 1.0},  # no step: not a RunLog row
    ]
    metrics, evals = split_wandb_history(rows)
    assert metrics == [{"step": 1, "reward/mean": 0.5}]
    assert evals == [
        {"step": 0, "benchmark": "aime24", "avg@32": 0.25, "acc/int": 0.5},
        {"step": 1, "avg@4": 0.75},
    ]


@pytest.mark.parametrize("source", ["wandb:ent", "wandb:ent/proj/extra", "wandb:/proj", "ent/proj"])
def test_wandb_source_spelling(source: str) -> None:
    with pytest.raises(ValueError, match="expected wandb:<entity>/<project>"):
        parse_wandb_source(source)
    assert parse_wandb_source("wandb:ent/proj") == ("ent", "proj")


# --- bad input: each loads with a warning and still plots ------------------------------------------------------


def _bad_input_run(tmp_path: Path, cfg: dict, summary: bool = True) -> Path:
    run_dir = tmp_path / "outputs" / "old_exp" / "2024-01-01_00-00-00"
    metrics = [{"step": k, "reward/mean": 0.1 * k} for k in (1, 2, 3)]
    _write_run(
        run_dir, cfg, metrics, [{"step": 3, "benchmark": "arith", "avg@4": 0.5}], "completed" if summary else None
    )
    return run_dir


def test_torn_last_line_warns_and_plots(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run_dir = _bad_input_run(tmp_path, _config("old_exp", "grpo", 0, 0.2))
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "reward/mean": 0.')
    with caplog.at_level(logging.WARNING):
        rs = load_runs([tmp_path / "outputs"])
    assert [r.getMessage() for r in caplog.records] == [
        f"{run_dir / 'metrics.jsonl'}: skipped a torn last line (run still writing, or it crashed)"
    ]
    assert rs.metrics["step"].tolist() == [1, 2, 3] and rs.failed.empty
    (line,) = draw("reward_curves", rs.metrics).axes[0].get_lines()
    assert line.get_ydata() == pytest.approx([0.1, 0.2, 0.3])


def test_missing_summary_warns_and_plots(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run_dir = _bad_input_run(tmp_path, _config("old_exp", "grpo", 0, 0.2), summary=False)
    with caplog.at_level(logging.WARNING):
        rs = load_runs([tmp_path / "outputs"])
    assert any(r.getMessage().startswith(f"{run_dir / 'summary.json'} missing") for r in caplog.records)
    assert rs.summaries["status"].tolist() == ["missing"] and rs.failed.empty
    assert len(draw("reward_curves", rs.metrics).axes[0].get_lines()) == 1
    table = experiment_table(rs.metrics, rs.evals)
    assert table["final_mean"].tolist() == [0.5]


def test_older_config_warns_and_plots(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # An older layout: no experiment name, the objective as a bare name, no precision or model group.
    old = {"seed": 4, "objective": "grpo", "trainer": {"lr": 1e-4}}
    run_dir = _bad_input_run(tmp_path, old)
    with caplog.at_level(logging.WARNING):
        rs = load_runs([tmp_path / "outputs"])
    messages = [r.getMessage() for r in caplog.records]
    assert f"{run_dir}: no `name` in the config (older version?); experiment 'old_exp' from the path" in messages
    assert (
        f"{run_dir}: config from an older version: `objective: <name>` read as objective.name; "
        "no precision.name, model.name (shown as <missing>)"
    ) in messages
    assert rs.experiments == ["old_exp"]
    m = rs.metrics
    assert m["objective.name"].eq("grpo").all() and m["objective"].eq("grpo").all() and m["precision.name"].isna().all()
    (line,) = draw("reward_curves", m).axes[0].get_lines()
    assert line.get_label() == "grpo (n=1)"
    assert experiment_table(m, rs.evals)["final_mean"].tolist() == [0.5]


# --- the paper's figure set (P-DPPO v3 figure numbers), on synthetic frames ---------------------------------------


def _frame(runs: dict[tuple[str, int], dict[str, list[float]]], steps: list[int]) -> pd.DataFrame:
    """One row per run and step, as load_runs gives it: `run`, `step`, objective.name, seed, then the values."""
    rows = []
    for (obj, seed), cols in runs.items():
        for i, step in enumerate(steps):
            rows.append({"run": f"{obj}-{seed}", "step": step, "objective.name": obj, "seed": seed,
                         **{k: v[i] for k, v in cols.items()}})  # fmt: skip
    return pd.DataFrame(rows)


def _lines(ax) -> dict[str, object]:
    return {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}


def _aime_evals() -> pd.DataFrame:
    # grpo / dppo x seeds 0, 1 at steps 0, 5, 10; acc/aime24 = a24 + 0.1 step/5 + 0.02 seed, acc/aime25 = half.
    a24 = {"grpo": 0.1, "dppo": 0.2}
    runs = {}
    for obj in a24:
        for seed in (0, 1):
            acc24 = [a24[obj] + 0.1 * k + 0.02 * seed for k in range(3)]
            runs[(obj, seed)] = {"acc/aime24": acc24, "acc/aime25": [v / 2 for v in acc24],
                                 "avg@32": [0.75 * v for v in acc24]}  # fmt: skip
    return _frame(runs, [0, 5, 10]).assign(benchmark="aime24_25")


def test_aime24_and_aime25_get_their_own_panels() -> None:
    evals = _aime_evals()
    fig = fig_eval_curves(evals)
    assert [ax.get_title() for ax in fig.axes] == ["AIME24", "AIME25"]
    assert [ax.get_ylabel() for ax in fig.axes] == ["AIME24 avg@32", "AIME25 avg@32"]
    # dppo on AIME25 at steps 0 / 5 / 10: (0.2 + 0.1 k + 0.02 seed) / 2 averaged over seeds 0, 1 = 0.105, 0.155, 0.205.
    assert _lines(fig.axes[1])["dppo (n=2)"].get_ydata() == pytest.approx([0.105, 0.155, 0.205])
    assert _lines(fig.axes[0])["grpo (n=2)"].get_ydata() == pytest.approx([0.11, 0.21, 0.31])

    bars = fig_final_scores(evals)
    assert [ax.get_title() for ax in bars.axes] == ["AIME24", "AIME25"]
    # Bars in sorted label order (dppo, grpo); final AIME24 = 0.2 + 0.2 + 0.01 (dppo), 0.1 + 0.2 + 0.01 (grpo).
    assert [b.get_height() for b in bars.axes[0].patches] == pytest.approx([0.41, 0.31])

    # Arithmetic keeps one avg@k panel per benchmark, its acc/<kind> columns notwithstanding.
    arith = evals.rename(columns={"acc/aime24": "acc/add", "acc/aime25": "acc/mul"}).assign(benchmark="arith")
    (ax,) = fig_eval_curves(arith).axes
    assert ax.get_title() == "" and ax.get_ylabel() == "arith avg@32"
    both = fig_eval_curves(pd.concat([arith, evals], ignore_index=True))
    assert [ax.get_title() for ax in both.axes] == ["AIME24", "AIME25", ""]


def test_gaussian_smoothing_is_drawn_over_the_faded_raw_curve() -> None:
    raw = [0.0, 1.0, 0.2, 0.9, 0.1, 0.8, 0.5, 0.4, 1.0, 0.0]
    metrics = _frame({("dppo", 0): {"reward/mean": raw}}, list(range(1, 11)))
    (ax,) = draw("reward_curves", metrics, sigma=2).axes
    faded, smoothed = ax.get_lines()
    assert faded.get_alpha() < 0.5 and faded.get_label().startswith("_")
    assert list(faded.get_ydata()) == pytest.approx(raw)
    assert smoothed.get_label() == "dppo (n=1)"
    assert list(smoothed.get_ydata()) == pytest.approx(gaussian_filter1d(np.array(raw), 2.0))
    # Two seeds: each run is smoothed, then averaged (the filter is linear, so = the smoothed mean).
    other = [1.0 - v for v in raw]
    two = _frame({("dppo", 0): {"reward/mean": raw}, ("dppo", 1): {"reward/mean": other}}, list(range(1, 11)))
    (ax,) = draw("reward_curves", two, sigma=2).axes
    mean = (np.array(raw) + np.array(other)) / 2
    assert _lines(ax)["dppo (n=2)"].get_ydata() == pytest.approx(gaussian_filter1d(mean, 2.0))
    # sigma = 0 (the function default) draws the raw mean alone.
    (ax,) = draw("reward_curves", metrics).axes
    assert [list(line.get_ydata()) for line in ax.get_lines()] == [pytest.approx(raw)]
    with pytest.raises(ValueError, match="either a rolling mean or sigma"):
        draw("reward_curves", metrics, smooth=3, sigma=2)


def test_entropy_is_on_a_log_axis() -> None:
    # Values within a factor of 2: the span rule alone would keep a linear axis; Fig. 7's entropy is always log.
    metrics = _frame({("grpo", 0): {"rollout/entropy": [0.8, 0.6, 0.5, 0.4]}}, [1, 2, 3, 4])
    (ax,) = draw("entropy", metrics).axes
    assert ax.get_yscale() == "log"
    with pytest.raises(SkipFigure, match="rollout/entropy"):
        draw("entropy", metrics.drop(columns="rollout/entropy"))


def test_mismatch_range_panel_beside_the_mean() -> None:
    steps = [1, 2, 3]
    runs = {
        (obj, seed): {
            "mismatch/abs_prob_diff_mean": [1e-4 * (seed + 1) * k for k in steps],
            "mismatch/mu_minus_pi_max": [0.1 * k + 0.1 * seed for k in steps],
            "mismatch/mu_minus_pi_min": [-0.2 * k - 0.1 * seed for k in steps],
        }
        for obj in ("pg_is", "dppo")
        for seed in (0, 1)
    }
    fig = draw("mismatch_range", _frame(runs, steps))
    assert [ax.get_title() for ax in fig.axes] == ["mean |μ − π|", "max and min of μ − π"]
    ax = fig.axes[1]
    assert ax.get_yscale() == "linear"
    lines = [line for line in ax.get_lines() if line.get_linestyle() in ("-", "--") and len(line.get_xdata()) == 3]
    assert sorted(line.get_linestyle() for line in lines) == ["-", "-", "--", "--"]  # max solid, min dashed, 2 arms
    # pg_is max at steps 1..3: 0.1 k + 0.1 seed over seeds 0, 1 = 0.15, 0.25, 0.35; min: -0.25, -0.45, -0.65.
    assert _lines(ax)["pg_is (n=2)"].get_ydata() == pytest.approx([0.15, 0.25, 0.35])
    dashed = [line.get_ydata() for line in lines if line.get_linestyle() == "--"]
    assert any(np.allclose(y, [-0.25, -0.45, -0.65]) for y in dashed)
    # Without the max/min keys there is nothing new to show (the mismatch figure has the mean).
    only_mean = _frame({k: {"mismatch/abs_prob_diff_mean": v["mismatch/abs_prob_diff_mean"]} for k, v in runs.items()},
                       steps)  # fmt: skip
    with pytest.raises(SkipFigure, match="mismatch/mu_minus_pi_max"):
        draw("mismatch_range", only_mean)


def test_clipped_token_panels_by_sign() -> None:
    steps = [1, 2, 3]
    nan = float("nan")
    runs = {
        ("grpo", seed): {
            "reward/mean": [0.1 * k for k in steps],
            "objective/clipped_frac_pos": [0.01, 0.02, 0.03],
            "objective/clipped_frac_neg": [0.02, 0.0, 0.04],
            "objective/clipped_mu_mean_pos": [0.1 + seed, 0.2, 0.3],
            # seed 1 clipped nothing with A < 0 at step 2: NaN, left out of that step's mean.
            "objective/clipped_mu_mean_neg": [0.05, 0.06 if seed == 0 else nan, 0.07],
            "objective/clipped_entropy_mean_pos": [2.0, 1.5, 1.0],
            "objective/clipped_entropy_mean_neg": [2.5, 2.0, 1.5],
        }
        for seed in (0, 1)
    }
    metrics = _frame(runs, steps)
    fig = draw("clipped_token_curves", metrics)
    titles = ["reward", "μ of clipped tokens", "entropy of clipped tokens", "clipped fraction"]
    assert [ax.get_title() for ax in fig.axes] == titles
    mu = fig.axes[1]
    solid, dashed = (line for line in mu.get_lines())
    # A > 0 at step 1: (0.1 + 0.1 + 1) / 2 = 0.6; A < 0 at step 2: seed 0's 0.06 alone.
    assert solid.get_linestyle() == "-" and solid.get_ydata()[0] == pytest.approx(0.6)
    assert dashed.get_linestyle() == "--" and dashed.get_ydata()[1] == pytest.approx(0.06)
    assert "A > 0 solid, A < 0 dashed" in mu.get_ylabel()
    clipped_keys = [c for c in metrics.columns if "clipped_mu" in c or "clipped_entropy" in c]
    with pytest.raises(SkipFigure, match="objective/clipped_mu_mean_pos"):
        draw("clipped_token_curves", metrics.drop(columns=clipped_keys))


def test_rollout_probability_figure() -> None:
    steps = [1, 2]
    values = {"rollout/topk_mass": [0.994, 0.999], "rollout/low_prob_frac": [0.03, 0.02]}
    metrics = _frame({("dppo_topk_tv", 0): values}, steps)
    fig = draw("rollout_probability", metrics)
    assert len(fig.axes) == 2
    assert _lines(fig.axes[0])["dppo_topk_tv (n=1)"].get_ydata() == pytest.approx([0.994, 0.999])
    # A run without Top-K logs no topk_mass: the low-probability panel alone.
    assert len(draw("rollout_probability", metrics.drop(columns="rollout/topk_mass")).axes) == 1
    with pytest.raises(SkipFigure, match="rollout/topk_mass / rollout/low_prob_frac"):
        draw("rollout_probability", metrics.drop(columns=["rollout/topk_mass", "rollout/low_prob_frac"]))


# The columns each training-curve figure draws, panel by panel (solid, then dashed), written out apart from
# METRIC_FIGURES so that a wrong column there shows.
DRAWN_COLUMNS = {
    "reward_curves": [["reward/mean"]],
    "mismatch": [["mismatch/k3"], ["mismatch/abs_prob_diff_mean"]],
    "bad_updates": [["mismatch/bad_update_frac"]],
    "entropy": [["rollout/entropy"]],
    "response_length": [["rollout/response_len_mean"]],
    "masked_frac": [["objective/masked_frac_pos"], ["objective/masked_frac_neg"]],
    "policy_drift": [["objective/approx_kl_k3"], ["objective/ratio_max"]],
    "drpo_weights": [["objective/neg_weight_frac"], ["objective/weight_gt1_frac"]],
    "mismatch_range": [["mismatch/abs_prob_diff_mean"], ["mismatch/mu_minus_pi_max", "mismatch/mu_minus_pi_min"]],
    "clipped_token_curves": [["reward/mean"]] + [[f"objective/clipped_{k}_{s}" for s in ("pos", "neg")]
                                                 for k in ("mu_mean", "entropy_mean", "frac")],
    "rollout_probability": [["rollout/topk_mass"], ["rollout/low_prob_frac"]],
}  # fmt: skip


def test_every_metric_figure_draws_the_columns_it_names() -> None:
    # Each column gets values of its own, so a panel that drew another column (or swapped a pair) shows.
    columns = sorted({c for panels in DRAWN_COLUMNS.values() for panel in panels for c in panel})
    steps = [1, 2, 3]
    runs = {("grpo", seed): {c: [i + 1 + 0.1 * k + 0.01 * seed for k in steps] for i, c in enumerate(columns)}
            for seed in (0, 1)}  # fmt: skip
    metrics = _frame(runs, steps)
    assert set(METRIC_FIGURES) == set(DRAWN_COLUMNS)
    for stem, panels in DRAWN_COLUMNS.items():
        fig = draw(stem, metrics)
        assert len(fig.axes) == len(panels), stem
        for ax, panel in zip(fig.axes, panels, strict=True):
            lines = ax.get_lines()[: len(panel)]  # a reference line (hline) comes after the curves
            assert [line.get_linestyle() for line in lines] == ["-", "--"][: len(panel)], stem
            for line, column in zip(lines, panel, strict=True):
                mean = metrics.groupby("step")[column].mean().to_numpy()
                assert line.get_ydata() == pytest.approx(mean), (stem, column)


def _write_clipped(run_dir: Path, rows: list[tuple]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame(rows, columns=["sign", "rank", "token_id", "token", "clipped", "seen", "clipped_share"])
    df.to_csv(run_dir / "clipped_tokens.csv", index=False)


def test_clipped_token_table_sums_an_arms_runs(tmp_path: Path) -> None:
    a, b, c = tmp_path / "dppo-0", tmp_path / "dppo-1", tmp_path / "grpo-0"
    _write_clipped(
        a, [("pos", 1, 5, " Wait", 10, 20, 0.5), ("pos", 2, 7, "2", 4, 8, 0.5), ("neg", 1, 9, "|", 3, 3, 1.0)]
    )
    _write_clipped(b, [("pos", 1, 8, "nan", 12, 40, 0.3), ("pos", 2, 5, " Wait", 6, 12, 0.5)])
    c.mkdir()  # grpo wrote no file
    runs = pd.DataFrame(
        {"run": [str(a), str(b), str(c)], "objective.name": ["dppo", "dppo", "grpo"], "seed": [0, 1, 0]}
    )
    table, without = clipped_token_table(runs)
    assert without == [str(c)]
    pos = table[(table["arm"] == "dppo") & (table["sign"] == "pos")].set_index("rank")
    # " Wait": 10 + 6 clipped of 20 + 12 seen = 16 / 32 = 0.5 in 2 runs; "nan": 12 / 40 = 0.3; "2": 4 / 8 = 0.5.
    assert pos["token"].tolist() == [" Wait", "nan", "2"]
    assert pos["clipped"].tolist() == [16, 12, 4] and pos["seen"].tolist() == [32, 40, 8]
    assert pos["clipped_share"].tolist() == pytest.approx([0.5, 0.3, 0.5]) and pos["runs"].tolist() == [2, 1, 1]
    neg = table[table["sign"] == "neg"]
    assert neg[["token_id", "clipped", "seen", "runs"]].values.tolist() == [[9, 3, 3, 1]]
    top2, _ = clipped_token_table(runs, top=2)
    assert top2[top2["sign"] == "pos"]["token_id"].tolist() == [5, 8]
    md = clipped_tokens_markdown(table, "exp")
    assert "## dppo" in md and "### A > 0" in md and "### A < 0" in md
    assert '| 1 | " Wait" | 5 | 16 | 32 | 0.500 | 2 |' in md
    assert '| 1 | "\\|" | 9 | 3 | 3 | 1.000 | 1 |' in md  # a pipe in a token does not break the table


@pytest.mark.slow  # every paper figure: over 3 s of CPU
def test_cli_writes_the_paper_figure_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    steps = list(range(1, 6))
    for obj in ("grpo", "dppo"):
        run_dir = tmp_path / "outputs" / "paper" / "t" / f"objective={obj}"
        metrics = [{"step": k, "reward/mean": 0.1 * k, "rollout/entropy": 1.0 / k, "rollout/low_prob_frac": 0.02,
                    "mismatch/abs_prob_diff_mean": 1e-3,
                    "mismatch/mu_minus_pi_max": 0.1, "mismatch/mu_minus_pi_min": -0.1,
                    "objective/clipped_frac_pos": 0.01, "objective/clipped_frac_neg": 0.02,
                    "objective/clipped_mu_mean_pos": 0.1, "objective/clipped_mu_mean_neg": 0.2,
                    "objective/clipped_entropy_mean_pos": 1.0, "objective/clipped_entropy_mean_neg": 2.0}
                   for k in steps]  # fmt: skip
        evals = [{"step": s, "benchmark": "aime24_25", "avg@4": 0.1, "acc/aime24": 0.1, "acc/aime25": 0.2}
                 for s in (0, 5)]  # fmt: skip
        _write_run(run_dir, _config("paper", obj, 0, DELTA[obj]), metrics, evals)
        _write_clipped(run_dir, [("pos", 1, 5, " Wait", 3, 4, 0.75), ("neg", 1, 6, " Thus", 2, 5, 0.4)])
    out = tmp_path / "figs"
    assert main(["--roots", str(tmp_path / "outputs"), "--out", str(out), "--no-geometry"]) == 0
    stdout = capsys.readouterr().out
    for stem in ("mismatch_range.png", "clipped_token_curves.png", "rollout_probability.png", "entropy.png",
                 "eval_curves.png", "final_scores.png", "clipped_tokens.md", "clipped_tokens.csv"):  # fmt: skip
        assert (out / "paper" / stem).is_file(), stem
    assert '| 1 | " Wait" | 5 | 3 | 4 | 0.750 | 1 |' in (out / "paper" / "clipped_tokens.md").read_text()
    assert "[clipped_tokens.md](paper/clipped_tokens.md)" in (out / "index.md").read_text()
    for stem in ("mismatch_range", "clipped_token_curves", "clipped_tokens", "rollout_probability", "eval_curves"):
        assert f"skip paper/{stem}:" not in stdout and f"wrote {out / 'paper' / stem}." in stdout
    with pytest.raises(SystemExit):
        main(["--roots", str(tmp_path / "outputs"), "--out", str(out), "--smooth", "3", "--sigma", "2"])
