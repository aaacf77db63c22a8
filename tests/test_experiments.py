"""Every experiments/*.yaml composes, and every job of its sweep is a valid run config, without running anything.

A named experiment is `python run.py -m +experiment=<name>`: Hydra finds it through `conf/experiment`, a link to
`experiments/`. Its arms are the jobs of `hydra.sweeper.params` (cartesian product, as Hydra's basic sweeper
expands it); each `mini_<name>` twin must run the same arms as `<name>` on the CPU scale of `scale/mini.yaml`.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from pathlib import Path
from typing import Any

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf

from harness.config import RunConfig, register_schemas, validate
from harness.objectives import OBJECTIVE_NAMES
from harness.precision import PRECISIONS

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted(p.stem for p in (ROOT / "experiments").glob("*.yaml"))
FULL = [e for e in EXPERIMENTS if not e.startswith("mini_")]
MINI = [e for e in EXPERIMENTS if e.startswith("mini_")]

# The arms each paper item must compare (objective names; the issue's list plus the grids chosen in the files).
EXPECTED_OBJECTIVES = {
    "dppo_fig3_sanity": {"pg_is", "pg_tis", "grpo", "minirl", "minirl_tis", "dppo_kl", "dppo"},  # + no_mismatch
    "dppo_fig4_anchor": {"dppo_kl", "dppo_kl_recompute"},
    "dppo_fig5_bad_updates": {"pg_is", "mask_neg"},
    "dppo_fig6_relax_alpha": {"grpo_relax"},
    "dppo_fig7_relax_sides": {"grpo", "grpo_relax"},
    "dppo_main": {"grpo", "cispo", "dppo_kl", "dppo"},
    "dppo_fig9_thinking": {"grpo", "cispo", "dppo_kl", "dppo"},
    "dppo_fig9_dense": {"grpo", "cispo", "dppo_kl", "dppo"},
    "dppo_fig11_topk": {"grpo", "cispo", "dppo", "dppo_kl", "dppo_topk_tv", "dppo_topk_kl"},
    "dppo_fig19_threshold": {"grpo", "dppo_kl", "dppo"},
    "dppo_delta_sweep": {"dppo"},
    "drpo_main": {"pg_is", "grpo", "spo", "dppo", "drpo"},
    "drpo_ablation_absadv": {"drpo", "drpo_no_absadv"},
    "drpo_ablation_penalties": {"penalty_tv", "penalty_kl", "penalty_k3", "drpo"},
    "drpo_mask": {"drpo", "drpo_mask", "dppo"},
    "drpo_delta_sweep": {"drpo"},
    "drpo_qwen3_4b": {"pg_is", "grpo", "spo", "dppo", "drpo"},
    "drpo_qwen3_5_35b": {"pg_is", "grpo", "spo", "dppo", "drpo"},
    "drpo_sanity": {"pg_is", "grpo", "spo", "dppo", "drpo"},
    "drpo_penalty_beta": {"penalty_tv", "penalty_kl", "penalty_k3"},
    "dppo_fig17_lora": {"grpo", "cispo", "dppo", "dppo_kl"},
    "dppo_fig10_rlhf": {"grpo", "dppo"},
    "family_2026": {"dppo", "drpo", "cppo", "gspo", "icepop", "minirl", "cispo"},
}
# What a full-scale experiment trains on, where it is not the default (DAPO-Math, AIME24 + AIME25, lr 1e-6).
SETTING = {
    "dppo_fig17_lora": {"lr": 1e-5},
    "dppo_fig10_rlhf": {"data": ("ultrafeedback", "hh_rlhf"), "benchmark": ("ultrafeedback", "hh_rlhf")},
}

register_schemas()


def composed(*overrides: str, hydra: bool = False) -> dict[str, Any]:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=list(overrides), return_hydra_config=hydra)
    return OmegaConf.to_container(cfg, resolve=False)  # type: ignore[return-value]


@functools.cache
def sweep_jobs(name: str) -> tuple[tuple[str, ...], ...]:
    """The override list of every job `python run.py -m +experiment=<name>` launches (BasicSweeper's expansion)."""
    params = composed(f"+experiment={name}", hydra=True)["hydra"]["sweeper"]["params"] or {}
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    axes = [
        [f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override() else [o.input_line]
        for o in parsed
    ]
    return tuple(itertools.product(*axes))


def arm_of(job: tuple[str, ...]) -> tuple[str, ...]:
    """A job's overrides without its seed: what the experiment compares."""
    return tuple(sorted(o for o in job if not o.startswith("seed=")))


def arms(name: str) -> list[tuple[str, ...]]:
    return sorted({arm_of(job) for job in sweep_jobs(name)})


@functools.cache
def arm_run(name: str, arm: tuple[str, ...]) -> RunConfig:
    """The validated config of one arm (seeds change nothing else, so one composition per arm is enough)."""
    raw = composed(f"+experiment={name}", *arm)
    assert "experiment" not in raw, f"{name}: needs `# @package _global_` so its keys land at the top level"
    return validate(raw)


def seeds(name: str) -> list[int]:
    return sorted(int(o.split("=", 1)[1]) for job in sweep_jobs(name) for o in job if o.startswith("seed="))


def objective_settings(run: RunConfig) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(dataclasses.asdict(run.objective).items()))


def test_experiments_are_found_and_paired():
    assert len(FULL) >= 13 and set(EXPECTED_OBJECTIVES) <= set(FULL)
    assert sorted(m.removeprefix("mini_") for m in MINI) == FULL, "every full-scale file needs a mini_ twin and back"
    assert (ROOT / "conf" / "experiment").resolve() == (ROOT / "experiments").resolve()


@pytest.mark.slow  # every arm of every experiment through Hydra: seconds of composition per experiment
@pytest.mark.parametrize("name", FULL)
def test_full_scale_arms_are_valid_runs(name):
    runs = {arm: arm_run(name, arm) for arm in arms(name)}
    assert {r.name for r in runs.values()} == {name}, "`name` must be the file's stem (outputs/<name>, W&B group)"
    assert {r.objective.name for r in runs.values()} == EXPECTED_OBJECTIVES[name]
    assert EXPECTED_OBJECTIVES[name] <= set(OBJECTIVE_NAMES)  # conf/objective/<name>.yaml options
    assert {r.precision.name for r in runs.values()} <= set(PRECISIONS)
    distinct = {
        (objective_settings(r), r.precision.name, r.rollout.behavior, r.model.name, r.data.name) for r in runs.values()
    }
    assert len(distinct) == len(runs), f"{name}: two arms resolve to the same objective, precision, model and data"
    setting = SETTING.get(name, {})
    for run in runs.values():  # a hub checkpoint on GPU with vLLM, the papers' data, benchmark and lr
        assert (run.device, run.rollout.engine) == ("cuda", "vllm")
        assert run.data.name in setting.get("data", ("dapo_math",))
        assert run.benchmark.name in setting.get("benchmark", ("aime24_25",))
        assert run.model.path is not None and run.model.name != "tiny" and run.trainer.lr == setting.get("lr", 1e-6)
    assert seeds(name) == [0] * len(runs)


def mini_arm(arm: tuple[str, ...]) -> tuple[str, ...]:
    """A full-scale arm as its mini twin runs it: an `+experiment/<group>=<x>` option with a `<group>/mini_<x>.yaml`
    stand-in (a setting that names a hub model and data set, e.g. rlhf/) is swapped for it."""
    out = []
    for o in arm:
        key, _, value = o.partition("=")
        group = key.removeprefix("+experiment/")
        stand_in = key.startswith("+experiment/") and (ROOT / "experiments" / group / f"mini_{value}.yaml").is_file()
        out.append(f"{key}=mini_{value}" if stand_in else o)
    return tuple(sorted(out))


@pytest.mark.slow  # every arm of every experiment through Hydra: seconds of composition per experiment
@pytest.mark.parametrize("name", FULL)
def test_mini_twin_runs_the_same_arms_on_cpu(name):
    mini = f"mini_{name}"
    assert arms(mini) == sorted(mini_arm(a) for a in arms(name))
    smoke = seeds(mini) == [0] * len(arms(name))  # scale/mini_smoke: one seed, 2 steps (a setting's plumbing)
    assert smoke or seeds(mini) == sorted([0, 1, 2] * len(arms(name)))
    for full_arm in arms(name):
        arm = mini_arm(full_arm)
        run, full = arm_run(mini, arm), arm_run(name, full_arm)
        assert run.name == mini
        assert objective_settings(run) == objective_settings(full), f"{mini} {arm}: the objective differs"
        if any(o.startswith("precision=") for o in arm):
            assert run.precision == full.precision
        assert (run.device, run.model.name, run.rollout.engine, run.model.max_model_len) == ("cpu", "tiny", "hf", 512)
        assert (run.trainer.threads, run.logger.name, run.model.lora_rank) == (1, "none", full.model.lora_rank)
        assert run.rollout.behavior == full.rollout.behavior
        if smoke:
            assert run.trainer.total_steps <= 2
        if name in SETTING and "data" in SETTING[name]:  # the same kind of prompts, from the repository's fixtures
            assert (run.data.name, run.benchmark.name) == (full.data.name, full.benchmark.name)
            assert (ROOT / run.data.path).is_file() and run.reward.model_path == "tiny"
        else:  # mini_dppo_main evaluates on AIME24 + AIME25 as Fig. 8 does (the files beside the checkout)
            assert run.data.name == "arith" and run.benchmark.name in ("arith", "aime24_25")


# What a mini run costs on one core of the 2-core AVX2 machine (measured with the mini scale on a lightly loaded
# machine): per-run set-up, one rollout-and-update sample, one evaluated problem; bf16 and fp8 precisions are slower
# there (no bf16 units). Plus each experiment's start-up: the launcher and its two workers import torch.
RUN_SETUP_S, SAMPLE_S, PROBLEM_S, EXPERIMENT_START_S = 1.5, 0.014, 0.008, 20.0
SLOWER = {"fp32": (1.0, 1.0), "bf16": (5.5, 3.4), "fp8_rollout": (5.5, 3.4), "fp8_e2e": (6.0, 3.4)}  # (step, eval)


def mini_run_seconds(run: RunConfig) -> float:
    t = run.trainer
    evals = len({0, t.total_steps, *range(t.eval_every, t.total_steps + 1, t.eval_every)})
    step_x, eval_x = SLOWER[run.precision.name]
    samples = t.total_steps * t.prompts_per_step * t.group_size
    return RUN_SETUP_S + samples * SAMPLE_S * step_x + evals * (run.benchmark.max_problems or 600) * PROBLEM_S * eval_x


@pytest.mark.slow  # composes every mini twin's arms
def test_mini_repro_fits_in_30_minutes_on_2_cores():
    """make mini-repro runs every mini twin, two one-thread jobs at a time: its estimated wall time must stay well
    under the issue's 30 minutes, so that `make figures` (and a margin for a busier machine) fits too."""
    total = 0.0
    for name in MINI:
        n_seeds = len(seeds(name)) // len(arms(name))
        total += EXPERIMENT_START_S + sum(n_seeds * mini_run_seconds(arm_run(name, a)) for a in arms(name)) / 2
    assert total < 25 * 60, f"make mini-repro would take ~{total / 60:.1f} min"


def test_recipes_carry_the_papers_values():
    # The full check of every value against the papers is tests/test_paper_values.py; this is a quick sample.
    dppo = arm_run("dppo_main", arms("dppo_main")[0])
    t = dppo.trainer
    assert (t.prompts_per_step, t.group_size, t.minibatches, t.max_new_tokens) == (256, 16, 8, 16384)
    assert (dppo.eval.n, dppo.reward.scheme, dppo.model.path) == (32, "signed", "Qwen/Qwen3-30B-A3B-Base")
    drpo = arm_run("drpo_delta_sweep", arms("drpo_delta_sweep")[0])
    t = drpo.trainer
    assert (t.prompts_per_step, t.group_size, t.minibatches, t.total_steps, t.beta2) == (64, 8, 4, 800, 0.999)
    assert (drpo.eval.n, drpo.reward.scheme, drpo.model.path) == (16, "binary", "Qwen/Qwen3-4B-Base")
    sanity = arm_run("dppo_fig3_sanity", arms("dppo_fig3_sanity")[0])
    assert sanity.model.path == "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"
    assert (sanity.data.path, sanity.trainer.prompts_per_step, sanity.trainer.minibatches) == (
        "sail/Sanity-Test-R1D-1.5B",
        64,
        4,
    )


def test_lora_and_rlhf_experiments_carry_the_papers_values():
    lora = {a[0].split("=", 1)[1]: arm_run("dppo_fig17_lora", a) for a in arms("dppo_fig17_lora")}
    run = lora["dppo"]
    t, m = run.trainer, run.model
    assert (m.path, m.lora_rank, m.lora_alpha, m.lora_dropout, m.max_model_len) == (
        "Qwen/Qwen3-30B-A3B-Base", 32, 64.0, 0.0, 1024 + 8000,
    )  # fmt: skip
    batch = (t.prompts_per_step, t.group_size, t.prompts_per_step // t.minibatches, t.max_new_tokens)
    assert batch == (128, 8, 16, 8000)
    assert (t.lr, t.eval_every, run.eval.n, run.eval.temperature, run.rollout.temperature) == (1e-5, 10, 32, 0.7, 1.0)
    assert (lora["dppo"].objective.delta, lora["dppo_kl"].objective.delta, lora["grpo_0.27"].objective.eps_high) == (
        0.15, 0.05, 0.27,
    )  # fmt: skip
    assert {r.objective.is_cap for r in lora.values()} == {5.0}
    rlhf = [arm_run("dppo_fig10_rlhf", a) for a in arms("dppo_fig10_rlhf")]
    assert {(r.model.path, r.data.name) for r in rlhf} == {
        ("google/gemma-2-9b-it", "ultrafeedback"),
        ("Qwen/Qwen3-4B-Instruct-2507", "hh_rlhf"),
    }
    assert {(r.reward.kind, r.reward.model_path) for r in rlhf} == {
        ("reward_model", "Skywork/Skywork-Reward-Llama-3.1-8B")
    }
    assert {r.data.template for r in rlhf} == {"chat"}


@pytest.mark.slow  # composes ~40 arms of six experiments
def test_arm_values_reach_the_objective():
    fig5 = "dppo_fig5_bad_updates"
    by_arm = {arm[0].split("=", 1)[1]: arm_run(fig5, arm).objective for arm in arms(fig5)}
    assert by_arm["mask_neg_0.8"].thresholds == (0.8, float("inf"))
    assert (by_arm["mask_neg_0.5_recompute"].anchor, by_arm["mask_neg_0.5_recompute"].thresholds[0]) == ("old", 0.5)
    assert {arm_run("drpo_delta_sweep", a).objective.delta for a in arms("drpo_delta_sweep")} == {0.15, 2.5, 12.5}
    main = [arm_run("drpo_main", a) for a in arms("drpo_main")]
    assert {r.precision.name for r in main} == {"bf16", "fp8_rollout", "fp8_e2e"} and len(main) == 15
    assert {r.objective.delta for r in main if r.objective.name == "drpo"} == {12.5}
    assert {r.objective.eps for r in main if r.objective.name == "spo"} == {12.5}
    absadv = [arm_run("drpo_ablation_absadv", a).objective for a in arms("drpo_ablation_absadv")]
    assert {(o.name, o.delta, o.abs_adv) for o in absadv} == {
        (name, delta, name == "drpo") for name in ("drpo", "drpo_no_absadv") for delta in (0.15, 12.5)
    }
    mask = {arm_run("drpo_mask", a).objective for a in arms("drpo_mask")}
    assert {(o.name, o.delta, getattr(o, "mask_delta", None)) for o in mask} == {
        ("drpo", 12.5, None),
        ("drpo_mask", 12.5, 0.15),
        ("drpo", 0.15, None),
        ("drpo_mask", 0.15, 0.15),
        ("dppo", 0.15, None),
    }
    fig3 = {arm[0].split("=", 1)[1]: arm_run("dppo_fig3_sanity", arm) for arm in arms("dppo_fig3_sanity")}
    assert {k for k, r in fig3.items() if r.rollout.behavior == "trainer"} == {"no_mismatch"}


def test_unknown_experiment_lists_the_valid_ones():
    with pytest.raises(MissingConfigException) as info:
        composed("+experiment=nope")
    message = str(info.value)
    assert "Could not find 'experiment/nope'" in message
    options = message.split("Available options in 'experiment':", 1)[1].split("Config search path", 1)[0]
    listed = set(options.split())
    assert listed == set(EXPERIMENTS)  # the helper groups (arm/, recipe/, scale/) are not offered as experiments
