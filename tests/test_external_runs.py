"""Issue 49 item 4: TRL and verl runs in our frames, drawn beside a harness run. The TRL history uses the names
TRL's GRPOTrainer logs (trl/trainer/grpo_trainer.py: reward, reward_std, entropy, clip_ratio/region_mean,
completions/mean_length; transformers' Trainer: loss, grad_norm, learning_rate, eval_*), the verl history the
names verl logs (verl/trainer/ppo/metric_utils.py: critic/score/mean, response_length/mean; the actor:
actor/entropy, actor/pg_clipfrac; verl/trainer/ppo/rollout_corr_helper.py: rollout_corr/kl, rollout_corr/k3_kl;
verl/utils/debug/metrics.py: training/rollout_probs_diff_mean; validation: val-core/<source>/acc/mean@<n>) in the
line format of verl's file logger ({"step": k, "data": {...}}). A third run is a real W&B offline run (the format
`report_to="wandb"` leaves) logged with TRL's names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.__main__ import build_experiment
from analysis.figures import draw
from analysis.load import load_runs
from tests.conftest import finished_wandb_run
from tests.test_analysis import _config, _write_run


def trl_run(folder: Path) -> Path:
    folder.mkdir(parents=True)
    history = [
        {"step": k, "epoch": k / 10, "reward": 0.1 * k, "reward_std": 0.3, "entropy": 1.5 - 0.1 * k,
         "clip_ratio/region_mean": 0.01 * k, "completions/mean_length": 20.0 + k, "loss": 0.01, "grad_norm": 0.5,
         "learning_rate": 1e-6, "objective/masked_frac_neg": 0.02}
        for k in (1, 2, 3)
    ] + [{"step": 3, "epoch": 0.3, "eval_reward": 0.4, "eval_loss": 0.2}]  # fmt: skip
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 3, "log_history": history}))
    return folder


def verl_run(path: Path) -> Path:
    rows = [
        {"step": k, "data": {"critic/score/mean": 0.2 * k, "response_length/mean": 30.0, "actor/entropy": 1.0,
                             "actor/pg_clipfrac": 0.05, "rollout_corr/kl": 0.001, "rollout_corr/k3_kl": 0.0005,
                             "training/rollout_probs_diff_mean": 0.01, "timing_s/gen": 2.0}}
        for k in (1, 2, 3)
    ]  # fmt: skip
    rows[-1]["data"]["val-core/aime24/acc/mean@4"] = 0.25
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def harness_run(root: Path) -> Path:
    run_dir = root / "exp" / "2026-01-01_00-00-00"
    metrics = [{"step": k, "reward/mean": 0.15 * k, "mismatch/k3": 0.001} for k in (1, 2, 3)]
    _write_run(run_dir, _config("exp", "dppo", 0, 0.15), metrics, [{"step": 0, "benchmark": "aime24", "avg@4": 0.1}])
    return root


def test_trl_and_verl_histories_map_to_our_names(tmp_path):
    rs = load_runs([f"trl:{trl_run(tmp_path / 'trl')}#exp", f"verl:{verl_run(tmp_path / 'v.jsonl')}#exp"])
    m = rs.metrics.set_index(["objective", "step"])
    assert m.loc[("trl", 2), "reward/mean"] == pytest.approx(0.2)
    assert m.loc[("trl", 2), "rollout/entropy"] == pytest.approx(1.3)
    assert m.loc[("trl", 2), "objective/masked_frac"] == pytest.approx(0.02)
    assert m.loc[("trl", 2), "rollout/response_len_mean"] == 22.0
    assert m.loc[("trl", 2), "objective/masked_frac_neg"] == 0.02  # already ours (the harness adapter's): kept
    assert m.loc[("trl", 2), "trl/reward_std"] == 0.3  # not the same quantity as ours: its own name, prefixed
    assert m.loc[("verl", 3), "reward/mean"] == pytest.approx(0.6)
    assert m.loc[("verl", 3), "mismatch/k1"] == 0.001 and m.loc[("verl", 3), "mismatch/k3"] == 0.0005
    assert m.loc[("verl", 3), "mismatch/abs_prob_diff_mean"] == 0.01
    assert m.loc[("verl", 3), "objective/masked_frac"] == 0.05
    assert m.loc[("verl", 3), "verl/timing_s/gen"] == 2.0
    assert "epoch" not in rs.metrics.columns and "trl/epoch" not in rs.metrics.columns
    evals = {(r["objective"], r["benchmark"]): r for r in rs.evals.to_dict("records")}
    assert evals[("verl", "aime24")]["avg@4"] == 0.25 and evals[("verl", "aime24")]["step"] == 3
    assert evals[("trl", "trl")]["reward"] == 0.4
    assert set(rs.summaries["name"]) == {"exp"} and set(rs.summaries["status"]) == {"completed"}


def test_a_missing_path_is_one_line_naming_the_spelling(tmp_path):
    with pytest.raises(ValueError, match=r"trl:.*does not exist; expected trl:<run folder or file>\[#<experiment>\]"):
        load_runs([f"trl:{tmp_path / 'nope'}"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no trainer_state.json"):
        load_runs([f"trl:{tmp_path / 'empty'}"])


def test_make_figures_draws_a_trl_and_a_verl_run_beside_a_harness_run(tmp_path):
    roots = [
        str(harness_run(tmp_path / "outputs")),
        f"trl:{trl_run(tmp_path / 'trl')}#exp",
        f"verl:{verl_run(tmp_path / 'v.jsonl')}#exp",
    ]
    rs = load_runs(roots).experiment("exp")
    fig = draw("reward_curves", rs.metrics, title="exp")
    labels = sorted({label for ax in fig.axes for label in ax.get_legend_handles_labels()[1]})
    assert labels == ["dppo (n=1)", "trl (n=1)", "verl (n=1)"], labels
    written, _ = build_experiment(rs, "exp", tmp_path / "figures")
    names = {p.name for p in written}
    assert {"reward_curves.png", "mismatch.png"} <= names, names


@pytest.mark.slow  # a real wandb-core process writes the offline run
def test_a_w_and_b_offline_trl_run_is_read_from_its_transaction_log(tmp_path, monkeypatch):
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    run = wandb.init(project="p", dir=str(tmp_path), config={"loss_type": "dapo", "learning_rate": 1e-6})
    # As a TRL run logs (seen in one, tests/test_integration_trl.py draws it): transformers' WandbCallback writes
    # `train/<name>` and `eval/<name>` with the optimizer step in `train/global_step`, W&B's own step counting log
    # calls; TRL's profiling timings come in rows of their own.
    run.log({"profiling/Time taken: generate": 0.04, "train/global_step": 0})
    for k in (1, 2):
        run.log({"train/reward": 0.5 * k, "train/entropy": 0.9, "train/epoch": 0.1 * k, "train/global_step": k})
        run.log({"profiling/Time taken: reward": 0.01, "train/global_step": k})
    run.log({"eval/reward": 0.75, "eval/loss": 0.1, "train/global_step": 2})
    run.finish()
    (folder,) = (tmp_path / "wandb").glob("offline-run-*")
    finished_wandb_run(folder)  # CI once read this log before wandb-core had flushed it: no rows, no `step`
    rs = load_runs([f"trl:{folder}#exp"])
    m = rs.metrics.set_index("step")
    assert list(m.index) == [1, 2] and m.loc[2, "reward/mean"] == 1.0 and m.loc[1, "rollout/entropy"] == 0.9
    assert not [c for c in m.columns if "profiling" in c or "global_step" in c or "epoch" in c]
    evals = rs.evals.set_index("step")
    assert evals.loc[2, "reward"] == 0.75 and evals.loc[2, "benchmark"] == "trl"
    assert rs.summaries.loc[0, "loss_type"] == "dapo"
