"""TRL adapter (harness/integrations/trl.py): TRL's GRPOTrainer trains the small tiny model with our objectives.

Each step's loss, as the trainer computed it, must equal our objective on the same batch: logp from a plain forward
of the model at that step's weights, mu = the log-probs of the policy that generated (HF generation), TRL's
advantages broadcast over the completion, aggregated as the objective says. A real TRL run logged to W&B offline is
drawn beside a harness run and a verl-format run. `make test-integrations` runs this file in venvs with TRL 1.16
and 1.8 and the built wheel (HARNESS_TEST_MODEL names the small tiny model there); in the main venv it is skipped
unless TRL is installed.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("trl", reason="trl is not installed here: make test-integrations runs this file with TRL 1.16, 1.8")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from harness.health import LIMITS  # noqa: E402
from harness.integrations import trl_config  # noqa: E402
from harness.integrations.trl import (  # noqa: E402
    TrustRegionGRPOTrainer,
    anchors,
    biased_sampling,
    check_version,
)
from harness.objectives import aggregate, get_objective  # noqa: E402
from tests.conftest import finished_wandb_run  # noqa: E402

TOKENS = 8  # max_completion_length, and so the seq-mean-token-sum-norm horizon
PAIRS = [(1, 2), (3, 4), (5, 6), (7, 8)]


@pytest.fixture(scope="module")
def model_path(request: pytest.FixtureRequest) -> str:
    """The small tiny model: HARNESS_TEST_MODEL where the harness's model builder is not installed (the
    integration venvs), else built or found by the suite's own fixture."""
    if os.environ.get("HARNESS_TEST_MODEL"):
        return os.environ["HARNESS_TEST_MODEL"]
    from harness.config import compose, validate
    from harness.loop.model_path import model_dir

    return str(model_dir(validate(compose(*request.getfixturevalue("small_model")))))


def arithmetic(tokenizer: Any) -> Dataset:
    return Dataset.from_dict(
        {
            "prompt": [  # the harness's "chat" template (harness.tasks.templates), which needs the train extra
                tokenizer.apply_chat_template(
                    [{"role": "user", "content": f"What is {a} + {b}?"}], add_generation_prompt=True, tokenize=False
                )
                for a, b in PAIRS
            ],
            "answer": [str(a + b) for a, b in PAIRS],
        }
    )


def reward(completions: list[str], answer: list[str], **_: Any) -> list[float]:
    """1 for the answer in the completion, plus a little per digit, so groups rarely tie."""
    return [float(a in c) + 0.1 * sum(ch.isdigit() for ch in c) for c, a in zip(completions, answer, strict=True)]


def config(out: Path, **kw: Any) -> GRPOConfig:
    # num_iterations=2: each generation batch trains twice, so on its second step the weights have moved since
    # generation, pi != mu, and the trust region has something to do.
    # loss_type dr_grpo: seq-mean-token-sum-norm over max_completion_length, the objectives' own aggregation.
    values = dict(
        output_dir=str(out), max_steps=3, per_device_train_batch_size=8, num_generations=4, steps_per_generation=1,
        num_iterations=2, max_completion_length=TOKENS, learning_rate=1e-2, beta=0.0, scale_rewards="none",
        use_cpu=True, report_to="none", save_strategy="no", logging_steps=1, seed=0, disable_tqdm=True,
        loss_type="dr_grpo",
    )  # fmt: skip
    return GRPOConfig(**{**values, **kw})


def plain_logp(model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
    """log pi of each completion token from the model's ordinary forward (not TRL's fused head), temperature 1."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    t = inputs["completion_ids"].size(1)
    logits = model(input_ids=ids, attention_mask=attention).logits[:, -t - 1 : -1].float()
    return logits.log_softmax(-1).gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)


class Recording(TrustRegionGRPOTrainer):
    """Keeps each step's batch, the loss the trainer returned and a plain-forward logp at the same weights."""

    def _compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        loss = super()._compute_loss(model, inputs)
        with torch.no_grad():
            logp = plain_logp(model, inputs)
        self.steps.append((dict(inputs), loss.detach(), logp))
        return loss


@pytest.mark.slow  # TRL trains the small model
@pytest.mark.parametrize("name", ["dppo", "drpo"])
def test_trl_trains_with_our_objective_and_its_loss_is_ours(tmp_path, model_path, name):
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    trainer = Recording(
        model=model_path, reward_funcs=[reward], args=config(tmp_path, epsilon=0.1),
        train_dataset=arithmetic(tokenizer), processing_class=tokenizer, objective=name,
    )  # fmt: skip
    trainer.steps = []
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()

    objective = get_objective(name, delta=0.1)  # GRPOConfig's epsilon is the objective's radius
    assert trainer.trust_region.cfg.agg == "seq-mean-token-sum-norm"  # loss_type dr_grpo
    assert len(trainer.steps) == 3
    for i, (inputs, trainer_loss, logp) in enumerate(trainer.steps):
        # HF generation: the behaviour policy is the model at generation time, whose log-probs TRL recomputed.
        mu = inputs["old_per_token_logps"]
        mask = inputs["completion_mask"]
        if i != 1:  # a fresh generation batch: the weights are the generating ones, so mu is this very logp
            torch.testing.assert_close(mu[mask > 0], logp[mask > 0], atol=1e-5, rtol=0)
        adv = inputs["advantages"].unsqueeze(1).expand_as(logp)
        out = objective(logp=logp, behavior_logp=mu, advantages=adv, mask=mask)
        ours = aggregate(out.loss_mat, mask, objective.cfg.agg, horizon=TOKENS)
        torch.testing.assert_close(trainer_loss, ours, atol=1e-6, rtol=1e-5)
        if i == 1:  # on a fresh batch pi == mu up to rounding, where a strict threshold (w > 1) flips on noise
            logged = trainer.state.log_history[i]
            for key, value in out.metrics.items():
                assert logged[key] == pytest.approx(value.item(), abs=1e-5), key
            # TRL's names for the same values, so TRL's own dashboards read them
            assert logged["clip_ratio/region_mean"] == logged["objective/masked_frac"]
            assert logged["clip_ratio/low_mean"] == logged["objective/masked_frac_neg"]

    # On the reused batch the anchor matters: with mu taken as the current policy the loss would differ.
    inputs, trainer_loss, logp = trainer.steps[1]
    mask = inputs["completion_mask"]
    adv = inputs["advantages"].unsqueeze(1).expand_as(logp)
    wrong_anchor = aggregate(objective(logp=logp, behavior_logp=logp, advantages=adv, mask=mask).loss_mat, mask,
                             objective.cfg.agg, horizon=TOKENS)  # fmt: skip
    assert abs(wrong_anchor - trainer_loss) > 1e-2
    assert trainer.state.log_history[1]["objective/ratio_max"] > 1.5  # pi moved away from mu on some token

    moved = max((trainer.model.state_dict()[k] - v).abs().max().item() for k, v in before.items())
    assert moved > 1e-4

    # The step-1 health check ran on the first update: HF generation, mu = pi there, so nothing is over a limit.
    assert trainer.health["over"] == [] and trainer.health["limits"] == LIMITS
    assert trainer.health["values"]["k3"] == pytest.approx(0.0, abs=1e-6)
    assert trainer.behavior == {
        "anchor": "behavior", "mu_from": "trl recompute at generation",
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": trainer.args.top_k, "min_p": None},
    }  # fmt: skip
    assert trainer.state.log_history[1]["mismatch/k3"] > 1e-4  # the reused batch: pi moved off mu


def test_the_health_check_names_trls_causes_when_mu_strays(caplog):
    trainer = SimpleNamespace(health=None)
    metrics = {"mismatch/k1": torch.tensor(0.01), "mismatch/k3": torch.tensor(0.2),
               "mismatch/abs_prob_diff_mean": torch.tensor(0.001)}  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="harness.integrations.trl"):
        TrustRegionGRPOTrainer.check_health(trainer, metrics)
    assert trainer.health["over"] == ["ratio_mean_gap", "k3"]  # |k3 - k1| = 0.19 > 0.05, k3 0.2 > 0.01
    assert "TrustRegionGRPOTrainer: health check after step 1: the training-inference mismatch is high" in caplog.text
    assert "GRPOConfig.top_p/top_k/min_p/repetition_penalty with use_vllm" in caplog.text


@pytest.mark.slow  # TRL trains the small model, wandb-core writes the offline run
def test_a_real_trl_run_logged_to_wandb_is_drawn_beside_a_harness_and_a_verl_run(tmp_path, model_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="analysis extra not installed")
    from analysis.__main__ import build_experiment
    from analysis.figures import draw
    from analysis.load import load_runs
    from tests.test_external_runs import harness_run, verl_run

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    (tmp_path / "wb").mkdir()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    trainer = TrustRegionGRPOTrainer(
        model=model_path, reward_funcs=[reward], args=config(tmp_path / "trl", report_to="wandb", max_steps=2),
        train_dataset=arithmetic(tokenizer), processing_class=tokenizer, objective="dppo",
    )  # fmt: skip
    trainer.train()
    import wandb

    wandb.finish()
    (run_folder,) = (tmp_path / "wb" / "wandb").glob("offline-run-*")
    finished_wandb_run(run_folder)  # wandb-core flushes its log after finish returns
    roots = [
        str(harness_run(tmp_path / "outputs")),
        f"trl:{run_folder}#exp",
        f"verl:{verl_run(tmp_path / 'v.jsonl')}#exp",
    ]
    rs = load_runs(roots).experiment("exp")
    trl_rows = rs.metrics[rs.metrics["objective"] == "trl"].set_index("step")
    assert list(trl_rows.index) == [1, 2]
    logged = {e["step"]: e for e in trainer.state.log_history if "loss" in e}  # the training entries
    assert trl_rows.loc[1, "reward/mean"] == pytest.approx(logged[1]["reward"])  # TRL's name, mapped
    for step in (1, 2):  # step 2 trains the same generation batch again: TRL logs no reward for it
        assert trl_rows.loc[step, "objective/masked_frac"] == pytest.approx(logged[step]["objective/masked_frac"])
        assert trl_rows.loc[step, "mismatch/k3"] == pytest.approx(logged[step]["mismatch/k3"])
        assert trl_rows.loc[step, "optim/loss"] == pytest.approx(logged[step]["loss"])
    fig = draw("reward_curves", rs.metrics, title="exp")
    labels = sorted({label for ax in fig.axes for label in ax.get_legend_handles_labels()[1]})
    assert labels == ["dppo (n=1)", "trl (n=1)", "verl (n=1)"], labels
    written, _ = build_experiment(rs, "exp", tmp_path / "figures")
    assert {"reward_curves.png", "mismatch.png"} <= {p.name for p in written}


def test_trl_adapter_refuses_what_it_cannot_reproduce(tmp_path, model_path):
    kw = dict(model=model_path, reward_funcs=[reward], train_dataset=Dataset.from_dict({"prompt": ["1 + 1"]}))
    with pytest.raises(ValueError, match=r"objective 'dppo_topk_tv' needs the rollout's top-20 log-probs"):
        TrustRegionGRPOTrainer(args=config(tmp_path), objective="dppo_topk_tv", **kw)
    with pytest.raises(ValueError, match=r"^GRPOConfig.beta: TrustRegionGRPOTrainer supports only 0.0 .*got 0.04$"):
        TrustRegionGRPOTrainer(args=config(tmp_path, beta=0.04), objective="dppo", **kw)


def test_trl_adapter_refuses_liger_and_biased_vllm_sampling_before_building_anything(tmp_path, model_path):
    kw = dict(model=model_path, reward_funcs=[reward], train_dataset=Dataset.from_dict({"prompt": ["1 + 1"]}))
    args = config(tmp_path)
    args.use_liger_kernel = True  # set after construction: GRPOConfig itself would ask for liger-kernel first
    with pytest.raises(ValueError, match=r"^GRPOConfig.use_liger_kernel: TrustRegionGRPOTrainer supports only False"):
        TrustRegionGRPOTrainer(args=args, **kw)
    args = config(tmp_path)
    args.use_vllm, args.top_p = True, 0.9  # refused before GRPOTrainer would start a vLLM engine
    with pytest.raises(ValueError, match=r"^GRPOConfig.top_p=0.9 with use_vllm: vLLM reports log-probs"):
        TrustRegionGRPOTrainer(args=args, **kw)
    args.top_p, args.min_p = 1.0, 0.05
    assert biased_sampling(args) == "min_p"
    args.use_vllm = False  # HF generation samples what it scores
    assert biased_sampling(args) is None


def test_trl_version_outside_the_tested_range_is_one_line(tmp_path, model_path, monkeypatch):
    import trl

    monkeypatch.setattr(trl, "__version__", "1.17.0")  # the trainer checks at construction, before TRL's __init__
    refused = r"^trl 1\.17\.0: .*; supported: trl 1\.8\.x to 1\.16\.x; pip install 'trl==1\.16\.0'$"
    with pytest.raises(ImportError, match=refused):
        TrustRegionGRPOTrainer(model=model_path, reward_funcs=[reward], args=config(tmp_path))
    check_version("1.8.0")
    check_version("1.16.3")
    for version in ("1.7.2", "1.17.0", "2.0.0"):
        with pytest.raises(ImportError, match=rf"^trl {version}: .*; supported: trl 1\.8\.x to 1\.16\.x;"):
            check_version(version)


def test_anchors_take_the_samplers_logprobs_and_the_recompute_where_it_has_none():
    logp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    old = torch.tensor([[-1.5, -2.5, -3.5]])
    sampled = torch.tensor([[-1.25, float("nan"), -3.25]])  # vLLM could not score the second token
    # HF generation, weights unchanged since generation: TRL sends neither; both anchors are logp, detached.
    mu, pi_old = anchors({}, logp)
    assert mu.tolist() == pi_old.tolist() == [[-1.0, -2.0, -3.0]] and not mu.requires_grad
    # HF generation, weights moved since: TRL's recompute right after generation is both.
    mu, pi_old = anchors({"old_per_token_logps": old}, logp)
    assert mu.tolist() == pi_old.tolist() == [[-1.5, -2.5, -3.5]]
    # vLLM: mu is the engine's, the recompute filling the token it could not score; old_logp is the recompute.
    mu, pi_old = anchors({"old_per_token_logps": old, "sampling_per_token_logps": sampled}, logp)
    assert mu.tolist() == [[-1.25, -2.5, -3.25]] and pi_old.tolist() == [[-1.5, -2.5, -3.5]]


def trainer_refusal(tmp_path, objective: Any = "dppo", **values: Any) -> str:
    """The line TrustRegionGRPOTrainer refuses GRPOConfig(**values) with; no model exists at that path, so the
    refusal must come before TRL builds one."""
    with pytest.raises(ValueError) as e:
        TrustRegionGRPOTrainer(
            model=str(tmp_path / "no-model-here"), reward_funcs=[reward], args=config(tmp_path, **values),
            train_dataset=Dataset.from_dict({"prompt": ["1 + 1"]}), objective=objective,
        )  # fmt: skip
    assert "\n" not in str(e.value)
    return str(e.value)


def test_vllm_importance_sampling_correction_is_refused_since_our_weight_already_is_pi_over_mu(tmp_path):
    args = config(tmp_path)
    args.use_vllm = True  # set after construction: GRPOConfig itself would look for vLLM; the default correction on
    with pytest.raises(ValueError) as e:
        TrustRegionGRPOTrainer(model=str(tmp_path / "no-model-here"), reward_funcs=[reward], args=args)
    assert str(e.value) == (
        "GRPOConfig.vllm_importance_sampling_correction=True with use_vllm: objective dppo already weights each "
        "token by pi/mu (mu: vLLM's log-probs), so TRL's pi_old/mu weight would count mu twice; set "
        "vllm_importance_sampling_correction=False"
    )
    args.vllm_importance_sampling_correction = False
    assert trl_config.refusal(get_objective("dppo"), args) is None


def test_epsilon_is_the_objectives_radius_and_refused_where_it_has_none(tmp_path):
    dppo = trl_config.resolve("dppo", config(tmp_path, epsilon=0.1)).cfg
    assert (dppo.delta_low, dppo.delta_high) == (0.1, 0.1)
    grpo = trl_config.resolve("grpo", config(tmp_path, epsilon=0.1)).cfg
    assert (grpo.eps_low, grpo.eps_high) == (0.1, 0.1)
    assert trl_config.resolve("drpo", config(tmp_path, epsilon=0.1)).cfg.delta == 0.1
    assert trl_config.resolve("spo", config(tmp_path, epsilon=0.3)).cfg.eps == 0.3
    assert trainer_refusal(tmp_path, "pg_is", epsilon=0.3) == (
        "GRPOConfig.epsilon=0.3: objective pg_is does not read it (no bound TRL sets); leave it at TRL's default 0.2"
    )
    assert trainer_refusal(tmp_path, "dppo", epsilon=0.0).startswith(
        "GRPOConfig.epsilon=0.0: objective dppo cannot take them: objective.delta_low"
    )


def test_epsilon_high_is_the_upper_radius_and_refused_where_there_is_none(tmp_path):
    dppo = trl_config.resolve("dppo", config(tmp_path, epsilon=0.15, epsilon_high=0.3)).cfg
    assert (dppo.delta_low, dppo.delta_high) == (0.15, 0.3)
    minimax = trl_config.resolve("cispo_minimax", config(tmp_path, epsilon_high=5.0)).cfg
    assert (minimax.eps_low, minimax.eps_high) == (None, 5.0)  # its lower side stays open
    assert trainer_refusal(tmp_path, "drpo", epsilon_high=0.28) == (
        "GRPOConfig.epsilon_high=0.28: objective drpo does not read it (delta from epsilon); leave it at TRL's "
        "default None"
    )
    assert trainer_refusal(tmp_path, "mask_neg", epsilon_high=0.28) == (
        "GRPOConfig.epsilon_high=0.28: objective mask_neg does not read it (delta_low from epsilon); leave it at "
        "TRL's default None"
    )


def test_delta_is_the_importance_weight_cap(tmp_path):
    assert trl_config.resolve("dppo", config(tmp_path, delta=5.0)).cfg.is_cap == 5.0
    assert trl_config.resolve("pg_is", config(tmp_path, delta=2.0)).cfg.is_cap == 2.0
    assert trl_config.resolve("cispo", config(tmp_path)).cfg.is_cap == 5.0  # delta None: the objective's own cap
    assert trl_config.resolve("dppo", config(tmp_path)).cfg.is_cap == 1e4
    assert trainer_refusal(tmp_path, "dppo", delta=0.0).startswith(
        "GRPOConfig.epsilon=0.2, GRPOConfig.delta=0.0: objective dppo cannot take them: objective.is_cap"
    )


def test_loss_type_is_the_aggregation_mode_or_refused(tmp_path):
    for loss_type, mode in (
        ("dr_grpo", "seq-mean-token-sum-norm"),
        ("grpo", "seq-mean-token-mean"),
        ("bnpo", "token-mean"),
    ):
        assert trl_config.resolve("dppo", config(tmp_path, loss_type=loss_type)).cfg.agg == mode
    assert trainer_refusal(tmp_path, loss_type="dapo") == (
        "GRPOConfig.loss_type='dapo': TRL's dapo divides by the tokens of a whole accumulation window, which no "
        "aggregation mode of objective dppo does; set loss_type to 'dr_grpo' (seq-mean-token-sum-norm), 'grpo' "
        "(seq-mean-token-mean) or 'bnpo' (token-mean)"
    )
    assert trainer_refusal(tmp_path, loss_type="sapo").startswith(
        "GRPOConfig.loss_type='sapo': TRL's own loss, in place of objective dppo's; set loss_type to 'dr_grpo'"
    )
    with pytest.raises(ValueError, match=r"^args: TrustRegionGRPOTrainer needs a GRPOConfig; TRL's default one"):
        TrustRegionGRPOTrainer(model=str(tmp_path / "no-model-here"), reward_funcs=[reward])


def test_an_objective_passed_in_must_agree_with_grpoconfig(tmp_path):
    mine = get_objective("dppo", delta=0.1)
    assert trl_config.resolve(mine, config(tmp_path, epsilon=0.1)) is mine
    assert trainer_refusal(tmp_path, mine, epsilon=0.15) == (
        "GRPOConfig.epsilon=0.15 sets delta_low=0.15 but the objective passed has delta_low=0.1; set epsilon=0.1, "
        "or pass objective='dppo' by name to take GRPOConfig's values"
    )
    assert trainer_refusal(tmp_path, mine, epsilon=0.1, loss_type="bnpo") == (
        "GRPOConfig.loss_type='bnpo' sets agg='token-mean' but the objective passed has "
        "agg='seq-mean-token-sum-norm'; set loss_type='dr_grpo', or pass objective='dppo' by name to take "
        "GRPOConfig's values"
    )


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "trl" / "train_trust_region.py"


def example_module() -> Any:
    spec = importlib.util.spec_from_file_location("train_trust_region", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the example's string annotations through it
    spec.loader.exec_module(module)
    return module


def example_argv(tmp_path: Path, model: str, *extra: str) -> list[str]:
    data = tmp_path / "data.jsonl"
    rows = [{"prompt": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in PAIRS]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return [
        "--model", model, "--train_file", str(data), "--output_dir", str(tmp_path / "out"), "--max_steps", "1",
        "--per_device_train_batch_size", "4", "--num_generations", "4", "--max_completion_length", str(TOKENS),
        "--use_cpu", "true", "--report_to", "none", "--save_strategy", "no", "--seed", "0", *extra,
    ]  # fmt: skip


@pytest.mark.slow  # TRL trains the small model one step
def test_the_trl_example_trains_the_objective_its_config_carries(tmp_path, model_path):
    example = example_module()
    trainer = example.main(example_argv(tmp_path, model_path, "--objective", "drpo", "--epsilon", "0.1"))
    assert isinstance(trainer.args, example.TrustRegionGRPOConfig) and trainer.state.global_step == 1
    cfg = trainer.trust_region.cfg
    assert (trainer.trust_region.name, cfg.delta, cfg.agg) == ("drpo", 0.1, "seq-mean-token-sum-norm")
    args = trainer.args  # the config's defaults: the papers' setting, and nothing the trainer refuses
    assert (args.loss_type, args.beta, args.scale_rewards, args.vllm_importance_sampling_correction) == (
        "dr_grpo", 0.0, "none", False,
    )  # fmt: skip


def test_the_trl_example_refuses_what_the_objective_cannot_honour(tmp_path):
    example = example_module()
    with pytest.raises(ValueError, match=r"^GRPOConfig.loss_type='dapo': TRL's dapo divides by the tokens"):
        example.main(example_argv(tmp_path, str(tmp_path / "no-model-here"), "--loss_type", "dapo"))
