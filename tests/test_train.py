"""End-to-end training with the real components: Hydra config, tiny Qwen3, HF/vLLM engines, math-verify, W&B."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from harness.config import validate
from harness.loop.train import train
from harness.objectives import OBJECTIVE_NAMES
from harness.rundir.files import read_jsonl
from tests.conftest import FAST_TRAINER, compose, wandb_run_record

# Every test trains the small model.
pytestmark = pytest.mark.slow


def run(tmp_path, *overrides: str, name: str = "run") -> tuple[dict, object]:
    raw = compose(*overrides)
    summary = train(validate(raw), tmp_path / name, raw)
    return summary, tmp_path / name


@pytest.mark.parametrize("objective", OBJECTIVE_NAMES)
def test_two_steps_of_every_objective(tmp_path, small_model, objective):
    summary, run_dir = run(
        tmp_path,
        *small_model,
        *FAST_TRAINER,
        "rollout=hf",
        f"objective={objective}",
        "trainer.total_steps=2",
        "trainer.prompts_per_step=8",  # 8 groups a step: a step without any learning signal would test nothing
        "rollout.max_topk=20",
    )
    assert summary["status"] == "completed"
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert 0 <= r["reward/mean"] <= 1
        assert r["perf/tokens_per_s"] > 0
    # A step had a learning signal, ran the objective and the optimizer, and the weights moved.
    trained = [r for r in rows if r["optim/updates"] > 0]
    assert trained and all(r["optim/skipped_steps"] == 0 for r in rows)
    check_weights_moved(run_dir, small_model)
    for r in trained:
        assert "objective/masked_frac" in r and "mismatch/k3" in r and r["optim/grad_norm"] >= 0
        check_figure_metrics(r, objective)
    if trained:
        check_clipped_table(run_dir, objective)
    evals = read_jsonl(run_dir / "eval.jsonl")
    assert [e["step"] for e in evals] == [0, 1, 2] and all(0 <= e["avg@1"] <= 1 for e in evals)
    final = json.loads((run_dir / "summary.json").read_text())
    assert final["status"] == "completed" and final["final_score"] == evals[-1]["avg@1"]
    check_token_samples(run_dir, objective, trained_steps={r["step"] for r in trained})


def check_weights_moved(run_dir, small_model: list[str]) -> None:
    """The final checkpoint differs from the model the run started from (not merely a logged update count)."""
    from safetensors.torch import load_file

    from harness.loop.model_path import model_dir

    start = load_file(model_dir(validate(compose(*small_model))) / "model.safetensors")
    end = load_file(run_dir / "checkpoints" / "step_2" / "model.safetensors")
    moved = [k for k in end.keys() & start.keys() if not torch_equal(start[k], end[k])]  # tied: saved once
    assert moved, "no weight changed in two steps"


def check_figure_metrics(r: dict, objective: str) -> None:
    """What the papers' figures plot (Fig. 3 max/min of mu - pi, Fig. 6 clipped tokens, Fig. 12 top-K mass)."""
    hi, lo = r["mismatch/mu_minus_pi_max"], r["mismatch/mu_minus_pi_min"]
    assert hi >= lo and r["mismatch/abs_prob_diff_max"] == pytest.approx(max(hi, -lo), abs=1e-7)
    assert 0 <= r["rollout/low_prob_frac"] <= 1
    for sign in ("pos", "neg"):
        assert 0 <= r[f"objective/clipped_frac_{sign}"] <= 1 or r[f"objective/clipped_frac_{sign}"] is None
    if objective == "pg_is":  # no trust region: no token's gradient is ever dropped
        assert r["objective/clipped_frac_pos"] in (0, None) and r["objective/clipped_frac_neg"] in (0, None)
    if "topk" in objective:
        assert 0 < r["rollout/topk_mass"] <= 1 + 1e-6
    else:
        assert "rollout/topk_mass" not in r


def check_clipped_table(run_dir, objective: str) -> None:
    """clipped_tokens.csv (App. D): per sign, tokens ranked by how often they were clipped, never more than seen."""
    import pandas as pd

    table = pd.read_csv(run_dir / "clipped_tokens.csv", keep_default_na=False)
    assert list(table.columns) == ["sign", "rank", "token_id", "token", "clipped", "seen", "clipped_share"]
    assert (table["clipped"] <= table["seen"]).all() and set(table["sign"]) <= {"pos", "neg"}
    for _, part in table.groupby("sign"):
        assert list(part["clipped"]) == sorted(part["clipped"], reverse=True)
    if objective == "pg_is":
        assert table.empty


def test_no_mismatch_reference_recomputes_mu_with_the_trainer(tmp_path, small_model):
    """rollout.behavior=trainer (DPPO Fig. 3's "no mismatch" curve): pi = mu exactly before the first update."""
    summary, run_dir = run(
        tmp_path, *small_model, *FAST_TRAINER, "rollout=hf", "objective=pg_is", "trainer.total_steps=1",
        "rollout.behavior=trainer", "precision=w4a4_rollout",
    )  # fmt: skip
    (row,) = read_jsonl(run_dir / "metrics.jsonl")
    # What is left is the packing of one forward over the batch against one per mini-batch (fp32 round-off); the
    # W4A4 engine's own mu differs from pi by ~0.1 at most on such a batch (test_mismatch_source).
    assert row["mismatch/abs_prob_diff_max"] < 1e-5 and row["mismatch/k3"] < 1e-10


def check_token_samples(run_dir, objective: str, trained_steps: set[int]) -> None:
    """tokens.parquet holds the trained evaluation steps, and its autograd weight is the objective's own."""
    import numpy as np
    import pandas as pd

    toks = pd.read_parquet(run_dir / "tokens.parquet") if trained_steps else None
    if toks is None:
        return
    assert set(toks["step"]) == trained_steps  # eval_every=1: every trained step is sampled
    assert ((toks["mu"] > 0) & (toks["mu"] <= 1) & (toks["pi"] > 0) & (toks["pi"] <= 1)).all()
    assert (toks["adv"] != 0).all() and (toks["kept"] == (toks["weight"] != 0)).all()
    ratio = (toks["pi"] / toks["mu"]).to_numpy()
    weight = toks["weight"].to_numpy()
    if objective == "pg_is":  # the gradient is A * (pi/mu) * grad log pi on every token
        assert toks["kept"].all() and np.allclose(weight, ratio, rtol=1e-4)
    if objective in ("grpo", "ppo", "dppo", "dppo_kl", "minirl"):  # a mask method keeps r or drops the token
        assert np.all(np.isclose(weight, 0) | np.isclose(weight, ratio, rtol=1e-4))


@pytest.fixture(scope="module")
def small_path(small_model) -> str:
    from harness.loop.model_path import model_dir

    return str(model_dir(validate(compose(*small_model))))


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_engine_logprobs_match_the_trainer_at_fp32(small_path, engine):
    import torch

    from harness.batch import build_batch, policy_logprobs
    from harness.models import load_policy
    from harness.rollout import make_engine
    from harness.tasks import load_problems, render_prompts

    torch.set_num_threads(1)
    run_cfg = validate(compose())
    policy, tok = load_policy(small_path)
    _, problems = load_problems(run_cfg.data, run_cfg.benchmark)
    prompts = render_prompts(tok, problems[:6], "chat")
    eng = make_engine(engine, small_path, "fp32", seed=0, max_model_len=256, max_topk=4, device="cpu")
    try:
        ro = eng.generate(prompts, n=3, max_new_tokens=16, topk=4, seed=1)
    finally:
        eng.close()
    batch = build_batch(ro, torch.zeros(len(ro.texts)), tok.pad_token_id, topk=4)
    with torch.no_grad():
        lp = policy_logprobs(policy, batch, with_topk=True)
    m = batch.mask > 0
    assert float((lp.logp - batch.behavior_logp)[m].abs().max()) <= 1e-4
    assert float((lp.topk_logp - batch.topk_behavior_logp)[m].abs().max()) <= 1e-4


def test_mismatch_grows_as_rollout_precision_drops(tmp_path, small_model):
    k3 = {}
    for prec in ("fp32", "bf16", "fp8_rollout"):
        _, run_dir = run(
            tmp_path,
            *small_model,
            *FAST_TRAINER,
            "rollout=hf",
            f"precision={prec}",
            "trainer.total_steps=1",
            "trainer.prompts_per_step=8",
            name=prec,
        )
        k3[prec] = read_jsonl(run_dir / "metrics.jsonl")[0]["mismatch/k3"]
    assert k3["fp32"] < 1e-6 < k3["bf16"] < k3["fp8_rollout"], k3


def test_vllm_run_with_wandb_offline(tmp_path, small_model):
    summary, run_dir = run(
        tmp_path, *small_model, *FAST_TRAINER, "rollout=vllm", "objective=drpo", "logger=wandb", "trainer.total_steps=2"
    )
    assert summary["status"] == "completed"
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2]
    assert list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    final = json.loads((run_dir / "summary.json").read_text())
    assert final["wandb"]["mode"] == "offline"
    # The W&B run as it would be synced: a training job named by objective and seed (no Hydra job here, so no
    # overrides), the experiment as its group, the filter fields at the top and the whole config under `cfg`.
    record = wandb_run_record(run_dir)
    assert (record["job_type"], record["name"], record["group"]) == ("train", "drpo-seed=0", "default")
    config = record["config"]
    assert {k: config[k] for k in ("objective", "precision", "model", "seed", "experiment")} == {
        "objective": "drpo", "precision": "fp32", "model": "tiny", "seed": 0, "experiment": "default"
    }  # fmt: skip
    assert config["cfg"]["objective"]["name"] == "drpo" and config["cfg"]["trainer"]["total_steps"] == 2
    # policy/final as a model artifact, referenced where it lies (logger.log_model, default on)
    (artifact,) = [a for a in record["artifacts"] if a["type"] == "model"]  # the others: the samples tables
    assert (artifact["name"], artifact["type"]) == (f"policy-{record['id']}", "model")
    assert {"final", "step-2"} <= set(artifact["aliases"])
    assert artifact["files"] == sorted(p.name for p in (run_dir / "policy" / "final").iterdir())


def test_resume_continues_without_duplicates_and_matches_an_uninterrupted_run(tmp_path, small_model):
    from safetensors.torch import load_file

    common = [
        *small_model,
        *FAST_TRAINER,
        "rollout=hf",
        "objective=dppo",
        "trainer.checkpoint_every=2",
        "trainer.eval_every=2",
    ]
    run(tmp_path, *common, "trainer.total_steps=4", name="straight")
    run(tmp_path, *common, "trainer.total_steps=2", name="resumed")  # stops after step 2 (checkpoint 2)
    summary, run_dir = run(tmp_path, *common, "trainer.total_steps=4", "trainer.resume=true", name="resumed")
    assert summary["status"] == "completed"
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2, 3, 4]
    assert [e["step"] for e in read_jsonl(run_dir / "eval.jsonl")] == [0, 2, 4]
    import pandas as pd

    straight = pd.read_parquet(tmp_path / "straight" / "tokens.parquet")
    resumed = pd.read_parquet(run_dir / "tokens.parquet")
    assert sorted(set(resumed["step"])) == sorted(set(straight["step"])) and len(resumed) == len(straight)
    a = load_file(tmp_path / "straight" / "checkpoints" / "step_4" / "model.safetensors")
    b = load_file(run_dir / "checkpoints" / "step_4" / "model.safetensors")
    assert all(torch_equal(a[k], b[k]) for k in a), "resumed weights differ from the uninterrupted run"


def torch_equal(x, y) -> bool:
    import torch

    return bool(torch.equal(x, y))


def test_sweep_from_the_command_line(tmp_path, small_model):
    import subprocess
    import sys

    from tests.conftest import ROOT

    cmd = [
        sys.executable,
        str(ROOT / "run.py"),
        "-m",
        "objective=dppo,drpo",
        "trainer.total_steps=3",
        "rollout=hf",
        *small_model,
        *FAST_TRAINER,
        f"hydra.sweep.dir={tmp_path}",
    ]
    res = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    summaries = sorted(tmp_path.glob("*/summary.json"))
    assert len(summaries) == 2
    for path in summaries:
        s = json.loads(path.read_text())
        assert s["status"] == "completed" and s["steps"] == 3
    assert {p.parent.name.split(",")[0] for p in summaries} == {"objective=dppo", "objective=drpo"}  # swept axis first


def test_a_non_finite_update_is_skipped_and_the_run_goes_on(tmp_path, small_model):
    from safetensors.torch import load_file

    # 8 x 8 samples: enough that both steps have a learning signal (an all-zero-advantage step updates nothing).
    common = [*small_model, *FAST_TRAINER, "rollout=hf", "objective=grpo", "trainer.checkpoint_every=1"]
    common += ["trainer.prompts_per_step=8", "trainer.group_size=8"]
    summary, run_dir = run(tmp_path, *common, "trainer.total_steps=2", "trainer.nan_at_steps=[2]")
    assert summary["status"] == "completed"
    rows = {r["step"]: r for r in read_jsonl(run_dir / "metrics.jsonl")}
    assert rows[1]["optim/skipped_steps"] == 0 and rows[1]["optim/updates"] >= 1
    assert rows[2]["optim/updates"] == 0 and rows[2]["optim/skipped_steps"] >= 1
    ckpt = run_dir / "checkpoints"
    before, after = load_file(ckpt / "step_1" / "model.safetensors"), load_file(ckpt / "step_2" / "model.safetensors")
    assert all(torch_equal(before[k], after[k]) for k in before), "a skipped update changed the weights"


def test_consecutive_non_finite_updates_stop_the_run_with_the_last_good_weights(tmp_path, small_model):
    from safetensors.torch import load_file

    from harness.loop.step import NonFiniteError

    common = [*small_model, *FAST_TRAINER, "rollout=hf", "objective=grpo", "trainer.checkpoint_every=1"]
    with pytest.raises(NonFiniteError, match="max_bad_steps=3"):
        run(tmp_path, *common, "trainer.total_steps=8", "trainer.nan_at_steps=[2,3,4,5,6,7,8]")
    run_dir = tmp_path / "run"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "NonFiniteError" in summary["error"]
    steps = [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")]
    last = steps[-1]
    # Steps, not updates, are counted (2 mini-batches a step): the third bad step is step 4 at the earliest.
    assert steps == list(range(1, last + 1)) and last >= 4
    assert "3 steps in a row" in summary["error"] and f"(step {last})" in summary["error"]
    # Checkpoints keep the newest two; the one before the stop already held the last good weights.
    good = load_file(run_dir / "checkpoints" / f"step_{last - 1}" / "model.safetensors")
    kept = load_file(run_dir / "checkpoints" / f"step_{last}" / "model.safetensors")
    assert all(torch_equal(good[k], kept[k]) for k in good)


def test_nan_logits_from_the_model_skip_the_step_and_bad_steps_are_counted_in_a_row(tmp_path, small_model):
    """A NaN from the model's own forward (not the loss) is skipped like a NaN loss; with 4 mini-batches one bad
    step is one toward max_bad_steps, not four."""
    from safetensors.torch import load_file

    from harness.loop.step import NonFiniteError

    common = [*small_model, *FAST_TRAINER, "rollout=hf", "objective=dppo", "trainer.checkpoint_every=1"]
    common += ["trainer.prompts_per_step=8", "trainer.group_size=8", "trainer.minibatches=4", "trainer.max_bad_steps=2"]
    summary, run_dir = run(tmp_path, *common, "trainer.total_steps=2", "trainer.nan_logits_at_steps=[2]")
    assert summary["status"] == "completed"
    rows = {r["step"]: r for r in read_jsonl(run_dir / "metrics.jsonl")}
    assert rows[2]["optim/updates"] == 0 and rows[2]["optim/skipped_steps"] >= 2 and rows[1]["optim/updates"] >= 1
    ckpt = run_dir / "checkpoints"
    before, after = load_file(ckpt / "step_1" / "model.safetensors"), load_file(ckpt / "step_2" / "model.safetensors")
    assert all(torch_equal(before[k], after[k]) for k in before), "a skipped update changed the weights"
    with pytest.raises(NonFiniteError, match=r"2 steps in a row .*\(step 3\)"):
        run(tmp_path, *common, "trainer.total_steps=4", "trainer.nan_logits_at_steps=[2,3]", name="stopped")


def test_trainer_bad_update_gap_is_the_bad_update_threshold(tmp_path, small_model):
    """mismatch/bad_update_frac counts the A < 0 tokens whose mu - pi exceeds trainer.bad_update_gap: recomputed
    from the step's saved update inputs at the configured gap it is the logged value, and the default gap gives
    another value on the same tokens."""
    common = [*small_model, *FAST_TRAINER, "rollout=hf", "trainer.total_steps=1", "trainer.save_batches=[1]"]
    common += ["trainer.prompts_per_step=8", "trainer.group_size=8"]  # 8 x 8 samples: the step has a signal
    _, run_dir = run(tmp_path, *common, "trainer.bad_update_gap=0")
    updates = torch.load(run_dir / "batches" / "step_1.pt")

    def bad_update_frac(gap: float) -> float:
        fracs = []
        for u in updates:
            m = u["mask"] > 0
            bad = (u["advantages"] < 0) & (u["behavior_logp"].exp() - u["logp"].exp() > gap) & m
            fracs.append(float(bad.sum() / m.sum().clamp(min=1)))
        return sum(fracs) / len(fracs)

    (row,) = read_jsonl(run_dir / "metrics.jsonl")
    logged = row["mismatch/bad_update_frac"]
    assert logged == pytest.approx(bad_update_frac(0.0)) and logged > 0
    assert bad_update_frac(0.5) != logged, (bad_update_frac(0.5), logged)


def test_logged_lines_are_fsynced_before_each_checkpoint_is_published(tmp_path, small_model, monkeypatch):
    """Every metrics and eval line up to a checkpoint is as durable as the checkpoint: between two checkpoint
    publishes (the rename of step_<k> into place) the appended logs are fsynced. A spy records fsync and rename
    calls and passes them through; /proc/self/fd names the file behind each descriptor."""
    import os
    import re

    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        try:
            events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        except OSError:
            pass
        return real_fsync(fd)

    def replace(src, dst, *args, **kwargs):
        events.append(("publish", str(dst)))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    run(tmp_path, *small_model, *FAST_TRAINER, "rollout=hf", "trainer.total_steps=2", "trainer.checkpoint_every=1")
    publishes = [i for i, (kind, path) in enumerate(events) if kind == "publish" and re.search(r"/step_\d+$", path)]
    assert len(publishes) == 2
    for previous, current in zip([-1, *publishes], publishes, strict=False):
        synced = {Path(path).name for kind, path in events[previous + 1 : current] if kind == "fsync"}
        assert {"metrics.jsonl", "eval.jsonl"} <= synced, synced
