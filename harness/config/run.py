"""The trainer, evaluation and reward schemas, the whole run's config, and `validate`: a composed config (a plain
dict) -> RunConfig, checking types, ranges and how the keys combine. A pure function of the config: checks that
read files (data, models, pools) run where the job runs, in `harness.machine`."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from harness.config import groups
from harness.config.rollout_checks import check_correction, check_mismatch_models
from harness.objectives import CorrectionConfig, ObjectiveConfig, objective_config
from harness.preemption import SIGNALS
from harness.schema import build


@dataclass(frozen=True)
class TrainerConfig:
    total_steps: int = field(default=500, metadata={"ge": 0, "help": "RL steps (one rollout each)"})
    prompts_per_step: int = field(default=32, metadata={"ge": 1})
    group_size: int = field(default=8, metadata={"ge": 2, "help": "samples per prompt (the advantage's group)"})
    max_new_tokens: int = field(default=24, metadata={"ge": 1, "help": "response length limit"})
    minibatches: int = field(
        default=4,
        metadata={"ge": 1, "help": "optimizer steps per rollout (the off-policy steps)"},
    )
    lr: float = field(default=1e-4, metadata={"gt": 0})
    beta1: float = field(default=0.9, metadata={"ge": 0, "lt": 1})
    beta2: float = field(default=0.99, metadata={"ge": 0, "lt": 1})
    weight_decay: float = field(default=0.0, metadata={"ge": 0})
    grad_clip: float = field(default=1.0, metadata={"gt": 0})
    advantage: Literal["drgrpo", "grpo", "rloo"] = field(default="drgrpo", metadata={"help": "advantage estimator"})
    horizon: int | None = field(
        default=None, metadata={"ge": 1, "help": "H of seq-mean-token-sum-norm; null = max_new_tokens"}
    )
    eval_every: int = field(
        default=100, metadata={"free": True, "ge": 1, "help": "evaluate every N steps (and at 0 and the end)"}
    )
    checkpoint_every: int = field(
        default=100,
        metadata={
            "free": True,
            "ge": 0,
            "help": "checkpoint every N steps and at the end; 0 = never (throw-away runs: no resume)",
        },
    )
    max_staleness: int = field(
        default=0,
        metadata={
            "ge": 0,
            "help": "asynchronous rollouts: the engine generates step t's batch in its own process with the policy "
            "after step t-1-k while the trainer updates (k = this value; 0 = the synchronous loop)",
        },
    )
    resume: bool | Literal["auto"] = field(
        default=False,
        metadata={
            "free": True,
            "help": "continue from the run directory's last checkpoint (with the run's own config); auto = continue "
            "if there is one, else start fresh (requeued jobs)",
        },
    )
    resume_allow: tuple[str, ...] = field(
        default=(),
        metadata={
            "free": True,
            "help": "keys (or groups) a resume may change, e.g. [trainer.lr]: resume_changes.jsonl",
        },
    )
    keep_checkpoints: int = field(
        default=2,
        metadata={
            "free": True,
            "ge": 1,
            "help": "checkpoints kept on disk, newest first (an unreadable newest one falls back to the next)",
        },
    )
    preempt_signals: tuple[str, ...] = field(
        default=("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2"),
        metadata={
            "free": True,
            "help": "signals that stop a training run at the next step boundary with a checkpoint, status "
            "'preempted' and exit code 75 (docs/reliability.md); [] = the default actions",
        },
    )
    preempt_grace_s: float = field(
        default=20.0,
        metadata={
            "free": True,
            "ge": 0,
            "help": "after a stop signal, how long the running step may go on before it is abandoned (the run then "
            "ends preempted with its last scheduled checkpoint); 0 = always finish the step",
        },
    )
    threads: int | None = field(
        default=None,
        metadata={
            "free": True,
            "ge": 1,
            "help": "torch threads; null = all cores (half of them with trainer.max_staleness > 0)",
        },
    )
    samples_per_eval: int = field(
        default=8, metadata={"free": True, "ge": 0, "help": "completions kept in samples.jsonl"}
    )
    max_bad_steps: int = field(
        default=3,
        metadata={
            "free": True,
            "ge": 1,
            "help": "steps in a row with a non-finite update before the run stops, failed",
        },
    )
    checkpoint_pause_s: float = field(
        default=0.0,
        metadata={"free": True, "ge": 0, "help": "fault drills: pause inside each checkpoint write, before its rename"},
    )
    nan_at_steps: tuple[int, ...] = field(
        default=(),
        metadata={"free": True, "help": "fault injection (tests, drills): every update of these steps gets a NaN loss"},
    )
    nan_logits_at_steps: tuple[int, ...] = field(
        default=(),
        metadata={
            "free": True,
            "help": "fault injection (tests, drills): the model's logits are NaN in every update of these steps",
        },
    )
    save_batches: tuple[int, ...] = field(
        default=(),
        metadata={
            "help": "steps whose mini-batch objective inputs (pi, mu, pi_old, A, mask, entropy) are saved to "
            "batches/step_<k>.pt, for replaying every objective on the same tokens (python -m analysis.replay)"
        },
    )
    tokens_per_eval: int = field(
        default=2000,
        metadata={
            "free": True,
            "ge": 0,
            "help": "response tokens (A != 0) of each evaluation step's first mini-batch kept in tokens.parquet",
        },
    )
    # free: it sets only a logged metric's threshold, and runs made before the key existed used its default
    bad_update_gap: float = field(
        default=0.5,
        metadata={
            "free": True,
            "ge": 0,
            "lt": 1,
            "help": "mismatch/bad_update_frac counts the A < 0 tokens whose mu - pi exceeds this probability gap "
            "(DPPO Fig. 5: 0.5)",
        },
    )


@dataclass(frozen=True)
class EvalConfig:
    n: int = field(default=1, metadata={"ge": 1, "help": "samples per problem (avg@n, pass@n, maj@n)"})
    engine: Literal["rollout", "policy"] = field(
        default="rollout", metadata={"help": "who samples evaluations: the engine or 'policy' (the fp32 weights)"}
    )
    temperature: float = field(default=1.0, metadata={"gt": 0})
    top_p: float = field(
        default=1.0,
        metadata={"gt": 0, "le": 1, "help": "nucleus sampling for evaluation only (DPPO App. E: 0.95); 1 = off"},
    )
    max_new_tokens: int | None = field(default=None, metadata={"ge": 1, "help": "null = trainer.max_new_tokens"})
    truncate_prompts: bool | None = field(
        default=None,
        metadata={
            "help": "cut prompts longer than model.max_model_len - max_new_tokens from the left (else an error); "
            "null = only for the tiny model, whose 512-token context cannot hold AIME problems"
        },
    )

    def cut_prompts(self, tiny_model: bool) -> bool:
        """Whether evaluation left-truncates over-long prompts (`truncate_prompts`, null = tiny model only)."""
        return tiny_model if self.truncate_prompts is None else self.truncate_prompts


@dataclass(frozen=True)
class RewardConfig:
    kind: Literal["verify", "reward_model"] = field(
        default="verify",
        metadata={
            "help": "verify: math-verify against the gold answer; reward_model: a learned sequence-classification "
            "reward model scores (prompt, completion) (RLHF, DPPO Fig. 10)"
        },
    )
    model_path: str | None = field(
        default=None,
        metadata={
            "help": "reward_model: hub id or local folder of an AutoModelForSequenceClassification with one label "
            "(the paper's: Skywork/Skywork-Reward-Llama-3.1-8B), or tiny (a hand-set model on the policy's "
            "tokenizer whose score rises with the share of digit tokens; tests and CPU minis)"
        },
    )
    batch_size: int = field(default=8, metadata={"ge": 1, "help": "reward_model: sequences per forward"})
    max_length: int | None = field(
        default=None,
        metadata={"ge": 2, "help": "reward_model: longer inputs keep their last tokens; null = no limit"},
    )
    dtype: Literal["float32", "bfloat16"] = field(default="float32", metadata={"help": "reward_model: its weights"})
    scheme: Literal["binary", "signed"] = field(
        default="binary", metadata={"help": "verify: binary 1 correct / 0 otherwise; signed +1 / -1"}
    )
    fallback_pattern: str | None = field(
        default=None,
        metadata={
            "help": "regex graded when a completion has no \\boxed{} (group 1, else the match), e.g. "
            "'Answer:\\s*(.+)'; null = boxed answers only"
        },
    )
    timeout_s: float = field(default=5.0, metadata={"gt": 0, "help": "hard limit on grading one completion"})
    workers: int = field(default=0, metadata={"ge": 0, "help": "grading processes: 0 = one per core, 1 = in-process"})

    def grade_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `harness.rewards.grade` for this config."""
        return {
            "correct": 1.0,
            "wrong": -1.0 if self.scheme == "signed" else 0.0,
            "fallback_pattern": self.fallback_pattern,
            "timeout_s": self.timeout_s,
            "workers": self.workers,
        }


@dataclass(frozen=True)
class _TopLevel:
    seed: int = field(default=0, metadata={"ge": 0})
    name: str = field(
        default="default", metadata={"free": True, "help": "experiment name: outputs/<name>/..., W&B group"}
    )
    mode: Literal["train", "eval", "plan"] = field(
        default="train",
        metadata={
            "free": True,
            "help": "train | eval | plan: print one `PLAN <json>` line with the job's overrides and resolved config, "
            "build nothing (python run.py -m +experiment=NAME mode=plan lists a sweep's jobs)",
        },
    )
    device: Literal["cpu", "cuda"] = "cpu"


@dataclass(frozen=True, kw_only=True)
class RunConfig(_TopLevel):
    """The whole composed config, validated; `objective` is the objective family's own schema."""

    model: groups.ModelConfig
    precision: groups.PrecisionConfig
    objective: ObjectiveConfig
    correction: CorrectionConfig
    rollout: groups.RolloutConfig
    data: groups.DataConfig
    benchmark: groups.BenchmarkConfig
    logger: groups.LoggerConfig = field(metadata={"free": True})
    trainer: TrainerConfig
    eval: EvalConfig
    reward: RewardConfig


GROUPS: dict[str, type] = {
    "model": groups.ModelConfig,
    "precision": groups.PrecisionConfig,
    "correction": CorrectionConfig,
    "rollout": groups.RolloutConfig,
    "data": groups.DataConfig,
    "benchmark": groups.BenchmarkConfig,
    "logger": groups.LoggerConfig,
    "trainer": TrainerConfig,
    "eval": EvalConfig,
    "reward": RewardConfig,
}
TOP_LEVEL = {f.name for f in dataclasses.fields(_TopLevel)}


def validate(cfg: dict[str, Any]) -> RunConfig:
    """A composed config (plain dict) -> RunConfig, or a ValueError naming the first bad key."""
    unknown = sorted(set(cfg) - set(GROUPS) - TOP_LEVEL - {"objective", "hydra", "experiment"})
    if unknown:
        raise ValueError(f"unknown top-level key '{unknown[0]}'; allowed: {', '.join(sorted([*GROUPS, *TOP_LEVEL]))}")
    groups = {g: build(schema, cfg.get(g) or {}, where=g) for g, schema in GROUPS.items()}
    obj = dict(cfg.get("objective") or {})
    name = obj.pop("name", None)
    if name is None:
        raise ValueError("objective: missing 'name'; choose one with objective=<name>")
    objective = objective_config(name, obj)
    top = {k: cfg[k] for k in TOP_LEVEL if k in cfg}
    run = RunConfig(**groups, objective=objective, **dataclasses.asdict(build(_TopLevel, top, where="config")))
    _check_combinations(run)
    return run


def _async_clash(run: RunConfig) -> str | None:
    """The setting an asynchronous rollout cannot serve, said as the key to change; None when there is none."""
    if run.rollout.sync == "step":
        return "rollout.sync=step (weights pushed after every update keep the engine in step); set rollout.sync=rollout"
    if run.rollout.behavior == "trainer":
        return "rollout.behavior=trainer (mu recomputed by the current policy erases the staleness); set it to engine"
    return None


def _check_combinations(run: RunConfig) -> None:
    t = run.trainer
    if bad := [s for s in t.preempt_signals if s not in SIGNALS]:
        raise ValueError(f"trainer.preempt_signals: {bad[0]} is not allowed; choose from {', '.join(SIGNALS)}")
    batch = t.prompts_per_step * t.group_size
    if batch % t.minibatches:
        raise ValueError(
            f"trainer.minibatches: {t.minibatches} does not divide the batch of prompts_per_step * group_size = {batch}"
        )
    if run.objective.topk > run.rollout.max_topk:
        raise ValueError(
            f"rollout.max_topk: {run.rollout.max_topk} is smaller than objective.topk = {run.objective.topk} "
            f"({run.objective.name} needs K = {run.objective.topk} log-probs per token)"
        )
    if run.rollout.engine != "hf" and run.precision.name.startswith(("w8a8_", "w4a4_", "w3a8_")):
        raise ValueError(
            f"precision.name: {run.precision.name} quantises the rollout copy's activations, which only rollout=hf "
            "simulates; use rollout=hf"
        )
    if run.rollout.engine != "hf" and run.rollout.logit_noise > 0:
        raise ValueError("rollout.logit_noise: only rollout=hf adds logit noise; use rollout=hf or logit_noise=0")
    if t.max_staleness and (clash := _async_clash(run)):
        raise ValueError(f"trainer.max_staleness: {t.max_staleness} cannot be combined with {clash}")
    check_mismatch_models(run)
    check_correction(run)
    if run.model.path is None and run.model.name not in ("tiny", "tiny_moe"):
        raise ValueError(f"model.path: model '{run.model.name}' needs a hub id or local directory")
    _check_lengths(run)
    p = run.data.max_prompt_tokens
    if p is not None and p + t.max_new_tokens > run.model.max_model_len:
        raise ValueError(
            f"data.max_prompt_tokens: {p} + trainer.max_new_tokens {t.max_new_tokens} exceeds model.max_model_len "
            f"{run.model.max_model_len}; raise model.max_model_len to at least {p + t.max_new_tokens}"
        )
    if run.data.name != "arith" and run.data.path is None:
        raise ValueError(f"data.path: data={run.data.name} needs a local file or hub name")
    _check_data(run)
    _check_reward(run)


def _check_lengths(run: RunConfig) -> None:
    """Response lengths against the rollout's context (the model's own context is read from its config.json by
    `harness.machine.check_files`)."""
    m = run.model
    for key, n in (
        ("trainer.max_new_tokens", run.trainer.max_new_tokens),
        ("eval.max_new_tokens", run.eval.max_new_tokens),
    ):
        if n is not None and n >= m.max_model_len:
            raise ValueError(
                f"{key}: {n} leaves no room for a prompt in model.max_model_len {m.max_model_len}; "
                f"use at most {m.max_model_len - 1}"
            )


def _check_reward(run: RunConfig) -> None:
    from harness.tasks import RLHF_SETS

    r = run.reward
    if r.kind == "reward_model":
        if r.model_path is None:
            raise ValueError(
                "reward.model_path: reward.kind=reward_model needs a reward model (a hub id, a local folder, or tiny)"
            )
        return
    if r.model_path is not None:
        raise ValueError(
            f"reward.model_path: set to {r.model_path!r} but reward.kind=verify grades with math-verify; "
            "set reward.kind=reward_model to score with it"
        )
    for key, name in (("data", run.data.name), ("benchmark", run.benchmark.name)):
        if name in RLHF_SETS:
            raise ValueError(
                f"reward.kind: {key}={name} holds prompts without answers, which math-verify cannot grade; "
                "use reward.kind=reward_model with reward.model_path"
            )


def _check_data(run: RunConfig) -> None:
    from harness.tasks import benchmark_sources

    b = run.benchmark
    if b.name == "arith" and b.path is not None:
        raise ValueError(f"benchmark.path: benchmark=arith is generated from data's arith config; got {b.path!r}")
    benchmark_sources(b)  # the right number of sources for the benchmark; the files are read by harness.machine
    if not run.data.levels or any(not 1 <= level <= 5 for level in run.data.levels):
        raise ValueError(f"data.levels: MATH levels are 1..5, got {list(run.data.levels)}")
    if run.reward.fallback_pattern is not None:
        try:
            re.compile(run.reward.fallback_pattern)
        except re.error as e:
            raise ValueError(
                f"reward.fallback_pattern: {run.reward.fallback_pattern!r} is not a valid regex: {e}"
            ) from None
