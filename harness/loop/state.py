"""What a training run carries from step to step, built in one place, and the services that act on it: weight
sync into the engine, checkpoints, resume, evaluation, policy export.

`build_run` is the setup phase of DESIGN.md's data flow: model, engine, data, objective, optimizer. Everything
that depends on the rank goes through `Run.pg` (harness.loop.distributed), whose one-process implementation is
the identity: rank 0 holds the engine, the run log and the token sampler; the other ranks hold null ones.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from harness import precision as precisions
from harness.config import RunConfig, SetupError
from harness.errors import first_line
from harness.loop import wandb_run
from harness.loop.checkpoint import load_latest, save_checkpoint, save_sharded_checkpoint
from harness.loop.diagnostics import ClippedTokens
from harness.loop.distributed import ProcessGroup
from harness.loop.evaluate import evaluate
from harness.loop.export import POLICY, read_info, save_policy_folder
from harness.loop.runlog import NullLog, RunLog, WandbSettings, read_jsonl
from harness.loop.tokens import TokenSamples
from harness.lora import (
    adapter_state_dict,
    apply_lora,
    engine_state_dict,
    is_lora,
    restore_adapter,
    trainable_parameters,
)
from harness.models import TinyModelConfig, build_tiny, default_cache_dir, load_policy, load_tokenizer_of
from harness.objectives import get_objective
from harness.objectives.registry import Objective
from harness.reward_model import RewardModel, evaluate_rm
from harness.rollout import engine_from_config, make_engine
from harness.rollout.base import RolloutEngine
from harness.tasks import arith_config, load_problems, render_prompts
from harness.tasks.arith import ArithConfig, Problem

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class Run:
    """One training run's state. Steps count from 1: metrics row k, the evaluation at k and checkpoint k all
    describe the weights after k updates; step 0 is the evaluation before training."""

    cfg: RunConfig
    run_dir: Path
    pg: ProcessGroup
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
    failed_exports: list[str] = field(default_factory=list)  # policy folders that could not be written
    best: float | None = None  # best evaluation score so far
    best_exported: float | None = None  # the score of policy/best (trained steps only), None before one is written
    last_eval: dict[str, float] | None = None
    clipped: ClippedTokens = field(default_factory=ClippedTokens)  # masked/clipped tokens (Fig. 6, App. D)

    @property
    def score_key(self) -> str:
        return score_key(self.cfg)

    @property
    def horizon(self) -> int:
        return self.cfg.trainer.horizon or self.cfg.trainer.max_new_tokens

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        if self.evaluator is not None:
            self.evaluator.close()
        if self.scorer is not None:
            self.scorer.close()


def score_key(cfg: RunConfig) -> str:
    """The evaluation's headline score: the reward model's mean score for RLHF, else accuracy avg@n."""
    return "rm_score" if cfg.reward.kind == "reward_model" else f"avg@{cfg.eval.n}"


def open_log(cfg: RunConfig, run_dir: Path, raw_config: dict[str, Any], pg: ProcessGroup) -> RunLog | NullLog:
    """Rank 0 writes the run directory (and W&B); the other ranks log nowhere."""
    if not pg.main:
        return NullLog()
    return RunLog(run_dir, wandb_settings(cfg), config=raw_config, resume=cfg.trainer.resume)


def build_run(cfg: RunConfig, run_dir: Path, pg: ProcessGroup, log: RunLog | NullLog) -> Run:
    """Setup: model, data, objective, optimizer, and last the engine (nothing after it can fail before the caller
    owns the Run that closes it). A missing model or data file, or an unusable option, is one line
    (SetupError), not a traceback."""
    torch.set_num_threads(cfg.trainer.threads or os.cpu_count() or 1)
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
            model_path, dtype=DTYPES[cfg.model.dtype], device="cpu" if pg.active else cfg.device
        )
        policy = _prepare_policy(policy, cfg, prec, pg)
        eval_prompts = render_prompts(tokenizer, eval_set, cfg.data.template)
        t = cfg.trainer
        optimizer = torch.optim.AdamW(  # under LoRA only the adapters are trainable
            trainable_parameters(policy), lr=t.lr, betas=(t.beta1, t.beta2), weight_decay=t.weight_decay
        )
        run = Run(
            cfg, run_dir, pg, log, policy, tokenizer, objective, optimizer, prec, train_set, eval_set, eval_prompts
        )
        if pg.main and cfg.reward.kind == "reward_model":  # rank 0 scores the whole batch and shares the rewards
            run.scorer = RewardModel.from_config(cfg.reward, tokenizer, cfg.device)
        if pg.main:  # one engine per run: rank 0 samples the whole step's batch and shares it
            run.engine = engine_from_config(
                cfg.rollout, str(model_path), cfg.precision.name, cfg.seed, cfg.model.max_model_len, cfg.device
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
    policy: torch.nn.Module, cfg: RunConfig, prec: precisions.Precision, pg: ProcessGroup
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
    return pg.shard(policy, param_dtype=gpu_bf16)


def sync_weights(run: Run) -> None:
    """The engine's copy follows the trainer (through the precision's transform). A collective under FSDP2:
    every rank takes part, rank 0 pushes."""
    state = run.pg.full_state_dict(run.policy)
    if run.engine is not None:  # LoRA: the base weights with the adapters merged in, under the base names
        run.engine.sync_weights(engine_state_dict(run.policy, state))


def resume(run: Run) -> None:
    """Continue from the newest checkpoint when `trainer.resume` is set (weights, optimizer, RNG streams, counters),
    cutting the logs back to it; then open the token sampler and read the best score evaluated so far and the one
    policy/best holds."""
    if run.cfg.trainer.resume:
        restore = run.pg.restore(run.policy, run.optimizer)  # a one-process checkpoint under torchrun
        lora = is_lora(run.policy)
        if lora:  # checkpoints hold the adapters only
            restore = restore_adapter(run.policy, run.optimizer, sharded=run.pg.active)
        state = load_latest(run.run_dir, run.policy, run.optimizer, restore, adapters_only=lora)
        _set_hyperparameters(run.optimizer, run.cfg)  # the config's (a resume_allow change), not the saved ones
        run.done_steps = int(state["step"]) if state else 0
        run.skipped = int(state["extra"].get("skipped_steps", 0)) if state else 0
        run.clipped = ClippedTokens(state["extra"].get("clipped_tokens") if state else None)
        run.log.truncate_after(run.done_steps if state else -1)
        sync_weights(run)
    run.tokens = TokenSamples(run.run_dir, resume_after=run.done_steps) if run.pg.main else None
    run.best = eval_scores(run.run_dir, run.score_key)[1]
    run.best_exported = run.pg.from_main(lambda: _kept_best(run))


def _kept_best(run: Run) -> float | None:
    """The score policy/best was exported with, if it is from a step this run has reached; a folder from past the
    checkpoint resumed from (an abandoned future) or from a run started over is removed."""
    folder = run.run_dir / POLICY / "best"
    info = read_info(folder)
    if info is not None and int(info.get("step", 0)) <= run.done_steps and info.get("score_key") == run.score_key:
        return float(info["score"])
    if folder.exists():
        shutil.rmtree(folder)
    return None


def _set_hyperparameters(optimizer: torch.optim.Optimizer, cfg: RunConfig) -> None:
    t = cfg.trainer
    for group in optimizer.param_groups:
        group.update(lr=t.lr, betas=(t.beta1, t.beta2), weight_decay=t.weight_decay)


def checkpoint(run: Run, step: int, pause_s: float = 0.0) -> None:
    """checkpoints/step_<step>. One process: safetensors + optimizer.pt. Several: every rank writes its own shards
    at once (torch.distributed.checkpoint), nothing is gathered; rank 0 publishes the folder."""
    extra = {"skipped_steps": run.skipped, "clipped_tokens": run.clipped.state()}
    lora = is_lora(run.policy)  # the adapters only: the frozen base is the model the run started from
    if run.pg.main:
        run.log.sync()  # the logged lines up to this step are as durable as the checkpoint that follows them
    if run.pg.active:
        save_sharded_checkpoint(
            run.run_dir, step, run.policy, run.optimizer, extra, run.pg, adapters_only=lora, pause_s=pause_s
        )
        return
    weights = adapter_state_dict(run.policy.state_dict()) if lora else None
    save_checkpoint(run.run_dir, step, run.policy, run.optimizer, extra, pause_s=pause_s, model_state=weights)


def export_policy(run: Run, name: str, step: int, score: float | None) -> Path:
    """policy/<name>: the current weights as a Hugging Face model folder (harness.loop.export), LoRA merged in. A
    collective under FSDP2 (the full weights are gathered to rank 0, which writes); OSError if the write failed."""
    folder = run.run_dir / POLICY / name
    state = run.pg.full_state_dict(run.policy)
    try:
        if run.pg.main:
            info = dict(
                step=step,
                score_key=run.score_key,
                score=score,
                objective=run.cfg.objective.name,
                benchmark=run.cfg.benchmark.name,
                base_model=str(model_dir(run.cfg)),
                lora_merged=is_lora(run.policy),
            )
            save_policy_folder(folder, engine_state_dict(run.policy, state), run.policy, run.tokenizer, info)
    finally:
        run.pg.barrier()
    return folder


def checkpoint_or_warn(run: Run, step: int) -> None:
    """A scheduled checkpoint. A failed write (disk full, quota) leaves the older checkpoints intact: training goes
    on and the summary lists the step."""
    try:
        checkpoint(run, step, pause_s=run.cfg.trainer.checkpoint_pause_s)
    except OSError as exc:
        run.failed_saves.append(step)
        tqdm.write(f"warning: {exc}; training continues, the previous checkpoint is intact", sys.stderr)


def export_or_warn(run: Run, name: str, step: int, score: float | None) -> Path | None:
    """`export_policy`; a failed write (disk full) is one warning line, training goes on and the summary lists it
    under `policy_failed` (resuming a finished run writes policy/final again)."""
    try:
        return export_policy(run, name, step, score)
    except OSError as exc:
        run.failed_exports.append(f"{name}@{step}")
        tqdm.write(f"warning: {exc}; the run goes on without it", sys.stderr)
        return None


def run_eval(run: Run, step: int) -> dict[str, float]:
    """Evaluate on the benchmark (rank 0, logged there); every rank gets the record. Updates `best`/`last_eval`."""
    cfg = run.cfg
    if cfg.eval.engine == "policy":  # a collective under FSDP2, as sync_weights
        state = run.pg.full_state_dict(run.policy)
        if run.evaluator is not None:
            run.evaluator.sync_weights(engine_state_dict(run.policy, state))
    engine = run.evaluator if run.evaluator is not None else run.engine

    def on_main() -> dict[str, float]:
        common = dict(
            seed=cfg.seed * 1_000_003 + step,
            n=cfg.eval.n,
            max_new_tokens=cfg.eval.max_new_tokens or cfg.trainer.max_new_tokens,
            temperature=cfg.eval.temperature,
            top_p=cfg.eval.top_p,
            samples_to_keep=cfg.trainer.samples_per_eval,
            truncate_prompts=cfg.eval.cut_prompts(tiny_model=cfg.model.path is None),
        )
        if run.scorer is not None:  # RLHF: the reward model's mean score on held-out prompts
            record, samples = evaluate_rm(engine, run.eval_prompts, run.eval_set, run.scorer, **common)
        else:
            record, samples = evaluate(
                engine, run.eval_prompts, run.eval_set, grading=cfg.reward.grade_kwargs(), **common
            )
        run.log.log_eval(step, {"benchmark": cfg.benchmark.name, **record})
        run.log.log_samples(step, samples)
        run.clipped.write_table(run.run_dir / "clipped_tokens.csv", run.tokenizer.decode)
        return record

    record = run.pg.from_main(on_main)
    score = record[run.score_key]
    run.best = score if run.best is None else max(run.best, score)
    run.last_eval = record
    if step >= 1 and (run.best_exported is None or score > run.best_exported):  # every rank: the export gathers
        if export_or_warn(run, "best", step, score) is not None:
            run.best_exported = score
    return record


def eval_scores(run_dir: Path, key: str) -> tuple[float | None, float | None]:
    """(first, best) score in eval.jsonl so far: what a resumed run already measured."""
    path = run_dir / "eval.jsonl"
    scores = [r[key] for r in read_jsonl(path) if r.get(key) is not None] if path.exists() else []
    return (scores[0], max(scores)) if scores else (None, None)


def wandb_settings(cfg: RunConfig) -> WandbSettings | None:
    """Job type, name, group and top-level config of the run in W&B (harness/loop/wandb_run.py)."""
    if cfg.logger.name == "none":
        return None
    return WandbSettings(
        enabled=True,
        project=cfg.logger.project,
        entity=cfg.logger.entity,
        mode=cfg.logger.mode,
        group=cfg.name,
        name=wandb_run.run_name(cfg, wandb_run.job_overrides()),
        job_type=wandb_run.job_type(cfg),
        tags=[cfg.model.name, cfg.precision.name],
        config=wandb_run.top_level_config(cfg),
        init_timeout_s=cfg.logger.init_timeout_s,
    )


def model_dir(cfg: RunConfig) -> Path | str:
    """The checkpoint to train: `model.path` as given, or the tiny model built (once, cached) from its config."""
    if cfg.model.path is not None:
        return cfg.model.path
    return build_tiny(*tiny_spec(cfg))


def tiny_spec(cfg: RunConfig) -> tuple[TinyModelConfig, ArithConfig, Path]:
    """What `build_tiny` is given for this run: the tiny model's config, the task it is warm-started on, and the
    cache folder. `tiny_model_dir(*tiny_spec(cfg)).name` names the model without building it (a pass-rate file
    records that name)."""
    m = cfg.model
    tiny = TinyModelConfig(
        vocab_size=m.vocab_size,
        hidden_size=m.hidden_size,
        num_layers=m.num_layers,
        num_heads=m.num_heads,
        num_kv_heads=m.num_kv_heads,
        head_dim=m.head_dim,
        intermediate_size=m.intermediate_size,
        max_position_embeddings=m.max_model_len,
        sft_steps=m.sft_steps,
        sft_lr=m.sft_lr,
        sft_batch=m.sft_batch,
        seed=m.init_seed,
        corpus_size=m.corpus_size,
        unused_tokens=m.unused_tokens,
    )
    cache = Path(m.cache_dir).expanduser() if m.cache_dir else default_cache_dir()
    return tiny, arith_config(cfg.data), cache
