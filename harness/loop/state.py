"""What a training run carries from step to step, built in one place, and its weight sync into the engine.
Checkpoints (`checkpoint.py`), resume (`resume.py`), evaluation (`evaluate.py`) and policy export (`export.py`)
act on it, each in its own module.

`build_run` is the setup phase of DESIGN.md's data flow: model, engine, data, objective, optimizer. Everything
that depends on the rank goes through `Run.ranks` (harness.distributed), whose one-process implementation is
the identity: rank 0 holds the engine, the run log and the token sampler; the other ranks hold null ones.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from harness import precision as precisions
from harness.config import RunConfig, SetupError
from harness.distributed import ProcessGroup
from harness.errors import first_line
from harness.loop.diagnostics import ClippedTokens
from harness.loop.model_path import model_dir
from harness.loop.runlog import NullLog, RunLog
from harness.loop.tokens import TokenSamples
from harness.loop.wandb_run import wandb_settings
from harness.lora import (
    apply_lora,
    engine_state_dict,
    trainable_parameters,
)
from harness.models import load_policy, load_tokenizer_of
from harness.objectives import get_objective
from harness.objectives.registry import Objective
from harness.reward_model import RewardModel
from harness.rollout import engine_from_config, make_engine
from harness.rollout.base import RolloutEngine
from harness.rollout.process import ProcessEngine, engine_threads
from harness.tasks import load_problems, render_prompts
from harness.tasks.arith import Problem

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class Run:
    """One training run's state. Steps count from 1: metrics row k, the evaluation at k and checkpoint k all
    describe the weights after k updates; step 0 is the evaluation before training."""

    cfg: RunConfig
    run_dir: Path
    ranks: ProcessGroup
    log: RunLog | NullLog
    policy: torch.nn.Module
    tokenizer: Any
    objective: Objective
    optimizer: torch.optim.Optimizer
    prec: precisions.Precision
    train_set: list[Problem]
    eval_set: list[Problem]
    eval_prompts: list[str]
    engine: RolloutEngine | None = None  # rank 0's; the others receive its rollouts
    evaluator: RolloutEngine | None = None  # rank 0's clean fp32 copy of the policy (eval.engine=policy)
    tokens: TokenSamples | None = None  # rank 0's per-token sample (tokens.parquet)
    scorer: RewardModel | None = None  # rank 0's reward model (reward.kind=reward_model); rewards are broadcast
    done_steps: int = 0
    skipped: int = 0  # updates skipped for a NaN/inf from the model, the loss or the gradient, in total
    bad_streak: int = 0  # steps in a row with a skipped update
    failed_saves: list[int] = field(default_factory=list)  # steps whose checkpoint could not be written
    checkpointed: int | None = None  # the step of the newest checkpoint written or resumed from
    failed_exports: list[str] = field(default_factory=list)  # policy folders that could not be written
    best: float | None = None  # best evaluation score so far
    best_exported: float | None = None  # the score of policy/best (trained steps only), None before one is written
    last_eval: dict[str, float] | None = None
    clipped: ClippedTokens = field(default_factory=ClippedTokens)  # masked/clipped tokens (Fig. 6, App. D)
    # Typed Any: harness.loop.rollouts builds on Run. Rank 0's AsyncRollouts worker (trainer.max_staleness > 0),
    # and the batches a resumed checkpoint promised ({step: Produced}).
    rollouts: Any = None
    restored_rollouts: Any = None

    @property
    def score_key(self) -> str:
        return score_key(self.cfg)

    @property
    def horizon(self) -> int:
        return self.cfg.trainer.horizon or self.cfg.trainer.max_new_tokens

    def sync_weights(self) -> None:
        """The engine's copy follows the trainer (through the precision's transform). A collective under FSDP2:
        every rank takes part, rank 0 pushes."""
        state = self.ranks.full_state_dict(self.policy)
        if self.engine is not None:  # LoRA: the base weights with the adapters merged in, under the base names
            self.engine.sync_weights(engine_state_dict(self.policy, state))

    def close(self) -> None:
        if self.rollouts is not None:  # the worker first: it may be inside the engine
            self.rollouts.close()
            self.rollouts = None
        if self.engine is not None:
            self.engine.close()
        if self.evaluator is not None:
            self.evaluator.close()
        if self.scorer is not None:
            self.scorer.close()


def score_key(cfg: RunConfig) -> str:
    """The evaluation's headline score: the reward model's mean score for RLHF, else accuracy avg@n."""
    return "rm_score" if cfg.reward.kind == "reward_model" else f"avg@{cfg.eval.n}"


def open_log(cfg: RunConfig, run_dir: Path, raw_config: dict[str, Any], ranks: ProcessGroup) -> RunLog | NullLog:
    """Rank 0 writes the run directory (and W&B); the other ranks log nowhere."""
    if not ranks.main:
        return NullLog()
    return RunLog(run_dir, wandb_settings(cfg), config=raw_config, resume=cfg.trainer.resume)


def trainer_threads(cfg: RunConfig) -> int:
    """trainer.threads, else every core; with asynchronous rollouts half of them, the engine's process generating
    on the other half at the same time (on 2 cores, 2 trainer threads beside the engine's 1 were slower, B6)."""
    cores = os.cpu_count() or 1
    return cfg.trainer.threads or (max(1, cores // 2) if cfg.trainer.max_staleness else cores)


def build_run(cfg: RunConfig, run_dir: Path, ranks: ProcessGroup, log: RunLog | NullLog) -> Run:
    """Setup: model, data, objective, optimizer, and last the engine (nothing after it can fail before the caller
    owns the Run that closes it). A missing model or data file, or an unusable option, is one line
    (SetupError), not a traceback."""
    torch.set_num_threads(trainer_threads(cfg))
    try:
        prec = precisions.get(cfg.precision.name)
        objective = get_objective(cfg.objective.name, **_objective_values(cfg))
        # The data first: a bad file costs no model build (the tiny model's first build takes minutes) or load.
        train_set, eval_set = load_problems(cfg.data, cfg.benchmark)
        model_path = model_dir(cfg)
        # Then the prompt lengths, from the tokenizer alone: a prompt that cannot fit costs no model load.
        train_set = _fitting(train_set, load_tokenizer_of(str(model_path)), cfg)
        # Sharded runs load on the CPU: fully_shard moves each rank's shard to its GPU, so no GPU ever holds
        # the whole model.
        policy, tokenizer = load_policy(
            model_path, dtype=DTYPES[cfg.model.dtype], device="cpu" if ranks.active else cfg.device
        )
        policy = _prepare_policy(policy, cfg, prec, ranks)
        eval_prompts = render_prompts(tokenizer, eval_set, cfg.data.template)
        t = cfg.trainer
        optimizer = torch.optim.AdamW(  # under LoRA only the adapters are trainable
            trainable_parameters(policy), lr=t.lr, betas=(t.beta1, t.beta2), weight_decay=t.weight_decay
        )
        run = Run(
            cfg, run_dir, ranks, log, policy, tokenizer, objective, optimizer, prec, train_set, eval_set, eval_prompts
        )
        if ranks.main and cfg.reward.kind == "reward_model":  # rank 0 scores the whole batch and shares the rewards
            run.scorer = RewardModel.from_config(cfg.reward, tokenizer, cfg.device)
        if ranks.main:  # one engine per run: rank 0 samples the whole step's batch and shares it
            build = (cfg.rollout, str(model_path), cfg.precision.name, cfg.seed, cfg.model.max_model_len, cfg.device)
            # Asynchronous rollouts: the engine in its own process, so its Python does not queue behind the trainer's
            run.engine = (
                ProcessEngine(build, engine_threads(torch.get_num_threads()))
                if t.max_staleness
                else engine_from_config(*build)
            )
            if cfg.eval.engine == "policy":  # fp32, no quantisation, no noise: the policy as the trainer holds it
                run.evaluator = make_engine(
                    "hf", str(model_path), "fp32", cfg.seed, cfg.model.max_model_len,
                    max_topk=cfg.rollout.max_topk, device=cfg.device,
                )  # fmt: skip
    except (ValueError, OSError, ImportError) as exc:
        raise SetupError(first_line(exc)) from exc
    return run


def _fitting(problems: list[Problem], tokenizer: Any, cfg: RunConfig) -> list[Problem]:
    """`data.max_prompt_tokens`: training problems whose templated prompt is longer are dropped (the papers' max
    prompt length; validation already checked it fits the model's context with the response). Without it, a
    prompt that leaves no room for `trainer.max_new_tokens` in `model.max_model_len` is an error here, before
    the model loads, rather than a crash at the step that samples it."""
    limit = cfg.data.max_prompt_tokens
    # transformers warns of any prompt past the tokenizer's model_max_length; the lengths are checked right here.
    quiet = logging.getLogger("transformers.tokenization_utils_base")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        lengths = [len(ids) for ids in render_prompts(tokenizer, problems, cfg.data.template)]
    finally:
        quiet.setLevel(level)
    if limit is None:
        room = cfg.model.max_model_len - cfg.trainer.max_new_tokens
        long = [n for n in lengths if n > room]
        if long:
            raise ValueError(
                f"data: {len(long)} of {len(problems)} training prompts are longer than model.max_model_len "
                f"{cfg.model.max_model_len} - trainer.max_new_tokens {cfg.trainer.max_new_tokens} = {room} tokens "
                f"(longest {max(long)}); set data.max_prompt_tokens={room} to drop them, or raise model.max_model_len"
            )
        return problems
    kept = [p for p, n in zip(problems, lengths, strict=True) if n <= limit]
    if not kept:
        raise ValueError(f"data.max_prompt_tokens: {limit} keeps none of the {len(problems)} training prompts")
    return kept


def _objective_values(cfg: RunConfig) -> dict[str, Any]:
    values = asdict(cfg.objective)
    values.pop("name")
    return values


def _prepare_policy(
    policy: torch.nn.Module, cfg: RunConfig, prec: precisions.Precision, ranks: ProcessGroup
) -> torch.nn.Module:
    """LoRA adapters (model.lora_rank > 0), gradient checkpointing, FP8 training linears, then FSDP2 sharding (a
    no-op with one process)."""
    policy = apply_lora(policy, cfg.model, cfg.seed)
    if cfg.model.gradient_checkpointing:  # transformers checkpoints only in training mode
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        policy.train()
    if prec.train_fp8 and cfg.device == "cuda":
        precisions.convert_float8_training(policy)  # torchao's fp8 linears, before FSDP2 shards them
    elif prec.train_fp8 and not precisions.wrap_fp8_linears(policy):  # a hub model the check could not read
        raise ValueError(
            "precision.name: fp8_e2e found no nn.Linear layer to quantize in this model; "
            "allowed with it: fp32, bf16, fp8_rollout"
        )
    gpu_bf16 = prec.train_autocast if cfg.device == "cuda" else None
    return ranks.shard(policy, param_dtype=gpu_bf16)
