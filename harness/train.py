"""The RL training loop: one readable function, with a phase comment per step of DESIGN.md's data flow.

prompts -> rollout engine (its own weights = mu) -> math-verify rewards -> group advantages
-> [old_logp recompute, only for anchor=old] -> mini-batch updates (objective -> aggregate -> AdamW)
-> weight sync into the engine -> metrics.jsonl / W&B; eval every N steps; checkpoint every M steps

Under torchrun (harness/distributed.py) the same function runs in every process: rank 0 holds the rollout engine
and the run directory, every rank holds the whole step's batch and trains on its share of each mini-batch's rows
with the policy sharded by FSDP2. With one process the distributed calls are identities.
"""

from __future__ import annotations

import functools
import math
import os
import random
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from harness import distributed
from harness import precision as precisions
from harness.advantages import compute_advantages
from harness.batch import TrainBatch, build_batch, policy_logprobs
from harness.checkpoint import load_latest, save_checkpoint
from harness.config import RunConfig, SetupError
from harness.evaluate import evaluate
from harness.models import TinyModelConfig, build_tiny, default_cache_dir, load_policy
from harness.objectives import aggregate, get_objective
from harness.rewards import grade
from harness.rollout import engine_from_config
from harness.runlog import NullLog, RunLog, WandbSettings, first_line, read_jsonl
from harness.tasks import arith_config, load_problems, render_prompts
from harness.tasks.arith import balanced_sample
from harness.tokens import TokenSamples, token_rows

BAD_UPDATE_GAP = 0.5  # P-DPPO Fig. 5: a "bad update" is A < 0 with mu - pi > 0.5
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class NonFiniteError(RuntimeError):
    """Too many consecutive updates had a NaN/inf loss or gradient; the last good weights are checkpointed."""


def train(cfg: RunConfig, run_dir: Path, raw_config: dict[str, Any]) -> dict[str, Any]:
    """Train per `cfg`, writing everything into `run_dir`. Returns the summary written to summary.json."""
    t_start = time.time()
    t = cfg.trainer
    d = distributed.setup()
    torch.set_num_threads(t.threads or os.cpu_count() or 1)
    log = RunLog(run_dir, wandb_settings(cfg), config=raw_config, resume=t.resume) if d.main else NullLog()
    summary: dict[str, Any] = {"run_dir": str(run_dir), "objective": cfg.objective.name}
    engine = None
    try:
        # --- setup: model, engine, data, objective, optimizer ---
        try:  # a missing model or data file, or an unusable option, surfaces here: one line, not a traceback
            prec = precisions.get(cfg.precision.name)
            model_path = model_dir(cfg)
            # Sharded runs load on the CPU: fully_shard moves each rank's shard to its GPU, so no GPU ever holds
            # the whole model.
            load_on = "cpu" if d.active else cfg.device
            policy, tokenizer = load_policy(model_path, dtype=DTYPES[cfg.model.dtype], device=load_on)
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
            policy = distributed.shard(policy, d, param_dtype=gpu_bf16)
            objective = get_objective(cfg.objective.name, **_overrides(cfg))
            train_set, eval_set = load_problems(cfg.data, cfg.benchmark)
            eval_prompts = render_prompts(tokenizer, eval_set, cfg.data.template)
            if d.main:  # one engine per run: rank 0 samples the whole step's batch and shares it
                engine = engine_from_config(
                    cfg.rollout, str(model_path), cfg.precision.name, cfg.seed, cfg.model.max_model_len, cfg.device
                )
        except (ValueError, OSError, ImportError) as exc:
            raise SetupError(first_line(exc)) from exc

        def sync_weights() -> None:  # a collective under FSDP2: every rank takes part, rank 0 pushes
            state = distributed.full_state_dict(policy, d)
            if engine is not None:
                engine.sync_weights(state)

        sync_weights()
        optimizer = torch.optim.AdamW(
            policy.parameters(), lr=t.lr, betas=(t.beta1, t.beta2), weight_decay=t.weight_decay
        )
        horizon = t.horizon or t.max_new_tokens
        # Steps count from 1: metrics row k, the evaluation at k and checkpoint k all describe the weights after
        # k updates; step 0 is the evaluation before training.
        done_steps = 0
        skipped, bad_streak = 0, 0  # updates skipped for a non-finite loss/gradient: in total, in a row
        failed_saves: list[int] = []  # steps whose checkpoint could not be written
        if t.resume:
            # Sharded: every rank reads the full checkpoint and keeps its shard.
            restore = functools.partial(distributed.load_full_state, policy, optimizer) if d.active else None
            state = load_latest(run_dir, policy, optimizer, restore)  # also restores the RNG streams
            done_steps = int(state["step"]) if state else 0
            skipped = int(state["extra"].get("skipped_steps", 0)) if state else 0
            log.truncate_after(done_steps if state else -1)
            sync_weights()
        tokens = TokenSamples(run_dir, resume_after=done_steps) if d.main else None

        def checkpoint(step: int, pause_s: float = 0.0) -> None:
            extra = {"skipped_steps": skipped}
            if not d.active:
                save_checkpoint(run_dir, step, policy, optimizer, extra, pause_s=pause_s)
                return
            weights = distributed.full_state_dict(policy, d)  # collectives: every rank takes part
            optim_state = distributed.full_optimizer_state(policy, optimizer, d)
            try:
                if d.main:
                    save_checkpoint(
                        run_dir, step, policy, optimizer, extra, pause_s=pause_s, model_state=weights,
                        optim_state=optim_state,
                    )  # fmt: skip
            finally:
                distributed.barrier(d)

        best, last_eval = _eval_scores(run_dir, f"avg@{cfg.eval.n}")[1], None
        eval_kw = dict(
            n=cfg.eval.n,
            max_new_tokens=cfg.eval.max_new_tokens or t.max_new_tokens,
            temperature=cfg.eval.temperature,
            samples_to_keep=t.samples_per_eval,
            grading=cfg.reward.grade_kwargs(),
            truncate_prompts=cfg.eval.cut_prompts(tiny_model=cfg.model.path is None),
        )

        def run_eval(step: int) -> dict[str, float]:
            nonlocal best
            record = None
            if d.main:  # the others wait for it at the broadcast
                record, samples = evaluate(engine, eval_prompts, eval_set, seed=cfg.seed * 1_000_003 + step, **eval_kw)
                log.log_eval(step, {"benchmark": cfg.benchmark.name, **record})
                log.log_samples(step, samples)
            record = distributed.broadcast(record, d)
            score = record[f"avg@{cfg.eval.n}"]
            best = score if best is None else max(best, score)
            return record

        if done_steps == 0:
            last_eval = run_eval(0)
            summary["initial_score"] = last_eval[f"avg@{cfg.eval.n}"]

        bar = tqdm(
            range(done_steps + 1, t.total_steps + 1),
            initial=done_steps,
            total=t.total_steps,
            desc=cfg.objective.name,
            dynamic_ncols=True,
            disable=None if d.main else True,
        )
        for step in bar:
            # --- rollout: the engine samples with its own weights; its log-probs are mu ---
            t0 = time.time()
            rng = random.Random(cfg.seed * 1_000_003 + step)  # a step's prompts depend only on (seed, step)
            problems = balanced_sample(train_set, t.prompts_per_step, rng)  # kinds in equal shares
            prompts = render_prompts(tokenizer, problems, cfg.data.template)
            ro = None
            if engine is not None:
                ro = engine.generate(
                    prompts,
                    n=t.group_size,
                    max_new_tokens=t.max_new_tokens,
                    topk=objective.topk,
                    temperature=cfg.rollout.temperature,
                    seed=cfg.seed * 1_000_003 + step,
                )
            ro = distributed.broadcast(ro, d)  # every rank holds the whole batch
            t_rollout = time.time() - t0

            # --- reward (math-verify) and group advantages ---
            answers = [problems[int(g)].answer for g in ro.group]
            graded = grade(ro.texts, answers, ro.finished.tolist(), **cfg.reward.grade_kwargs())
            rewards = torch.tensor(graded.rewards)
            adv, adv_metrics = compute_advantages(rewards, ro.group, t.advantage)
            batch = build_batch(ro, adv, tokenizer.pad_token_id, objective.topk)

            # --- old_logp recompute: only when the objective's trust region is anchored on pi_old ---
            t1 = time.time()
            old_logp = None
            if objective.needs_old:
                with torch.no_grad():
                    old_logp = policy_logprobs(
                        policy, batch, cfg.rollout.temperature, autocast_dtype=prec.train_autocast
                    ).logp

            # --- mini-batch updates: the off-policy steps the trust region has to bound ---
            # Rows whose advantage is 0 everywhere carry no gradient for any objective: they are skipped, and
            # `scale` keeps the loss normalised by the full mini-batch, as if they had been there. The mismatch is
            # read off the first forward of the step (before any update); if no row had a signal, one gradient-
            # free forward over the first mini-batch measures it instead. Under torchrun each rank takes every
            # world-th row of a mini-batch; the mini-batches themselves are the same on every rank.
            order = torch.randperm(len(batch), generator=torch.Generator().manual_seed(cfg.seed + step))
            step_metrics: list[dict[str, float]] = []
            updates = 0
            sample_tokens = t.tokens_per_eval > 0 and (step % t.eval_every == 0 or step == t.total_steps)
            for rows in order.chunk(t.minibatches):
                full_denominator = _denominator(batch.mask[rows], cfg.objective.agg)
                rows = rows[d.rank :: d.world]
                active = (batch.advantages[rows] != 0).any(1)
                has_signal = bool(active.any())
                # FSDP2's forward and backward are collectives: a rank without signal still runs them (with
                # a zero loss) as long as some rank has signal.
                any_signal = distributed.any_rank(has_signal, d)
                measuring = not step_metrics  # nothing measured yet this step
                if not any_signal and not measuring:
                    continue
                if has_signal:
                    rows = rows[active]
                mb = batch.select(rows)
                with torch.set_grad_enabled(any_signal):
                    lp = policy_logprobs(
                        policy,
                        mb,
                        cfg.rollout.temperature,
                        with_topk=objective.topk > 1,
                        autocast_dtype=prec.train_autocast,
                    )
                m = {"rollout/entropy": _masked_mean(lp.entropy, mb.mask)}
                if measuring:  # before the step's first update: the pure training-inference mismatch
                    m.update(_mismatch(lp.logp.detach(), mb))
                if any_signal:
                    mb_old = None if old_logp is None else old_logp[rows][:, : mb.mask.shape[1]]
                    out = objective(
                        logp=lp.logp,
                        behavior_logp=mb.behavior_logp,
                        advantages=mb.advantages,
                        mask=mb.mask,
                        old_logp=mb_old,
                        topk_logp=lp.topk_logp,
                        topk_behavior_logp=mb.topk_behavior_logp,
                    )
                    if sample_tokens and has_signal and tokens is not None:  # an eval step's first update: pi is mu
                        sample_tokens = False
                        gen = torch.Generator().manual_seed(cfg.seed + step)
                        tokens.add(token_rows(step, out.loss_mat, lp, mb, mb_old, t.tokens_per_eval, gen))
                    loss = minibatch_loss(out.loss_mat, mb, cfg.objective.agg, horizon, full_denominator, has_signal)
                    if step in t.nan_at_steps:
                        loss = loss * math.nan
                    optimizer.zero_grad(set_to_none=True)
                    # FSDP2 averages gradients over ranks; each rank's loss is its share of the global sum.
                    (loss * d.world).backward()
                    grad_norm = _full(torch.nn.utils.clip_grad_norm_(policy.parameters(), t.grad_clip))
                    loss = torch.tensor(distributed.all_sum(float(loss.detach()), d))
                    if torch.isfinite(loss) and torch.isfinite(grad_norm):
                        optimizer.step()
                        updates += 1
                        bad_streak = 0
                        if cfg.rollout.sync == "step":
                            sync_weights()
                    else:  # weights and optimizer state stay as they were
                        optimizer.zero_grad(set_to_none=True)
                        skipped += 1
                        bad_streak += 1
                        if bad_streak >= t.max_bad_steps:
                            # The weights are the last good ones (nothing bad was applied): keep them, and the
                            # step's metrics, so a resume or a post-mortem starts from what is known to be sane.
                            log.log(step, {"optim/skipped_steps": float(skipped), **_mean_of(step_metrics)})
                            checkpoint(step)
                            raise NonFiniteError(
                                f"{bad_streak} consecutive updates had a non-finite loss or gradient (step {step}); "
                                f"the last good weights are in checkpoints/step_{step} "
                                f"(trainer.max_bad_steps={t.max_bad_steps})"
                            )
                    if has_signal:
                        m.update({key: float(v) for key, v in out.metrics.items()})
                        m["mismatch/bad_update_frac"] = _bad_update_frac(lp.logp.detach(), mb)
                    m.update({"optim/loss": float(loss), "optim/grad_norm": float(grad_norm)})
                step_metrics.append(distributed.mean_metrics(m, d))

            # --- weight sync: the engine's copy follows the trainer (through the precision's transform) ---
            if cfg.rollout.sync == "rollout":
                sync_weights()
            t_train = time.time() - t1

            # --- log ---
            n_tokens = float(ro.mask.sum())
            metrics = {
                "reward/mean": float(rewards.mean()),
                "reward/std": float(rewards.std()),
                **adv_metrics,
                **graded.metrics,
                "rollout/response_len_mean": n_tokens / len(ro.texts),
                "rollout/truncated_frac": float((~ro.finished).float().mean()),
                **_mean_of(step_metrics),
                "optim/lr": t.lr,
                "optim/updates": float(updates),
                "optim/skipped_steps": float(skipped),
                "perf/rollout_s": t_rollout,
                "perf/train_s": t_train,
                "perf/tokens_per_s": n_tokens / max(time.time() - t0, 1e-9),
                "samples": float(step * len(ro.texts)),
            }
            log.log(step, metrics)
            bar.set_postfix(
                reward=f"{metrics['reward/mean']:.3f}",
                eval=f"{last_eval[f'avg@{cfg.eval.n}']:.3f}" if last_eval else "-",
            )

            # --- eval / checkpoint ---
            done = step == t.total_steps
            if step % t.eval_every == 0 or done:
                last_eval = run_eval(step)
            if t.checkpoint_every and (step % t.checkpoint_every == 0 or done):
                try:
                    checkpoint(step, pause_s=t.checkpoint_pause_s)
                except OSError as exc:  # disk full, quota: the older checkpoints are intact, training goes on
                    failed_saves.append(step)
                    tqdm.write(f"warning: {exc}; training continues, the previous checkpoint is intact", sys.stderr)
        if last_eval is None:  # resumed after the last step: its evaluation is on disk already
            previous = read_jsonl(run_dir / "eval.jsonl") if (run_dir / "eval.jsonl").exists() else []
            last_eval = distributed.broadcast(previous[-1] if previous else None, d) or run_eval(t.total_steps)
        score_key = f"avg@{cfg.eval.n}"
        summary.update(
            status="completed",
            final_score=last_eval[score_key],
            best_score=best,
            score_key=score_key,
            benchmark=cfg.benchmark.name,
            steps=t.total_steps,
        )
        if failed_saves:
            summary["checkpoint_failed_steps"] = failed_saves
        if "initial_score" not in summary:  # resumed: the step-0 evaluation is in eval.jsonl already
            summary["initial_score"] = _eval_scores(run_dir, score_key)[0]
        if summary.get("initial_score") is not None:
            summary["gain"] = summary["final_score"] - summary["initial_score"]
    except BaseException as exc:  # KeyboardInterrupt too: the run directory must say it did not finish
        summary.update(status="failed", error=f"{type(exc).__name__}: {exc}")
        log.finish("failed", summary, error=traceback.format_exc())
        raise
    finally:
        if engine is not None:
            engine.close()
    summary["wall_time_s"] = time.time() - t_start
    log.finish("completed", summary)
    return summary


def wandb_settings(cfg: RunConfig) -> WandbSettings | None:
    if cfg.logger.name == "none":
        return None
    return WandbSettings(
        enabled=True,
        project=cfg.logger.project,
        entity=cfg.logger.entity,
        mode=cfg.logger.mode,
        group=cfg.name,
        name=cfg.objective.name,
        job_type=cfg.objective.name,
        tags=[cfg.model.name, cfg.precision.name],
        init_timeout_s=cfg.logger.init_timeout_s,
    )


def _overrides(cfg: RunConfig) -> dict[str, Any]:
    values = asdict(cfg.objective)
    values.pop("name")
    return values


def minibatch_loss(
    loss_mat: torch.Tensor, mb: TrainBatch, agg: str, horizon: int, full_denominator: float, has_signal: bool = True
) -> torch.Tensor:
    """This process's part of a mini-batch's loss: `aggregate` over its rows, rescaled so that it is normalised
    by the whole mini-batch (`full_denominator`: every row, every rank, the skipped zero-advantage rows too).
    Summed over ranks it is the single-process loss. A rank whose rows carry no signal contributes 0 (its
    forward and backward still run: they are FSDP2 collectives)."""
    if not has_signal:
        return loss_mat.sum() * 0.0
    scale = _denominator(mb.mask, agg) / full_denominator
    return aggregate(loss_mat, mb.mask, agg, horizon) * scale


def _full(x: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (FSDP2's gradient norm), a plain tensor as it is."""
    return x.full_tensor() if hasattr(x, "full_tensor") else x


def _denominator(mask: torch.Tensor, mode: str) -> float:
    """What `aggregate` divides by, so a subset of rows can be normalised as the whole mini-batch."""
    if mode == "token-mean":
        return float(mask.sum().clamp(min=1))
    if mode == "token-sum":
        return 1.0
    return float(((mask > 0).sum(1) > 0).sum().clamp(min=1))


def _masked_mean(x: torch.Tensor | None, mask: torch.Tensor) -> float:
    if x is None:
        return math.nan
    return float((x * mask).sum() / mask.sum().clamp(min=1))


def _mismatch(logp: torch.Tensor, mb: TrainBatch) -> dict[str, float]:
    """Rollout engine (mu) vs trainer (pi, same weights before any update): the training-inference mismatch."""
    m = mb.mask > 0
    if not bool(m.any()):
        return {}
    log_r = (logp - mb.behavior_logp)[m]
    p, q = logp.exp()[m], mb.behavior_logp.exp()[m]
    return {
        "mismatch/abs_prob_diff_mean": float((p - q).abs().mean()),
        "mismatch/abs_prob_diff_max": float((p - q).abs().max()),
        "mismatch/k1": float((-log_r).mean()),
        "mismatch/k3": float((torch.expm1(log_r) - log_r).mean()),
    }


def _bad_update_frac(logp: torch.Tensor, mb: TrainBatch) -> float:
    """Tokens pushed down (A < 0) although pi already sits far below mu: P-DPPO's "bad updates" (Fig. 5)."""
    m = mb.mask > 0
    gap = mb.behavior_logp.exp() - logp.exp()
    return float(((mb.advantages < 0) & (gap > BAD_UPDATE_GAP) & m).sum() / m.sum().clamp(min=1))


def _mean_of(rows: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for r in rows for k in r}
    return {k: sum(r[k] for r in rows if k in r) / sum(1 for r in rows if k in r) for k in sorted(keys)}


def _eval_scores(run_dir: Path, key: str) -> tuple[float | None, float | None]:
    """(first, best) score in eval.jsonl so far: what a resumed run already measured."""
    path = run_dir / "eval.jsonl"
    scores = [r[key] for r in read_jsonl(path) if r.get(key) is not None] if path.exists() else []
    return (scores[0], max(scores)) if scores else (None, None)


def model_dir(cfg: RunConfig) -> Path | str:
    """The checkpoint to train: `model.path` as given, or the tiny model built (once, cached) from its config."""
    m = cfg.model
    if m.path is not None:
        return m.path
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
    )
    cache = Path(m.cache_dir).expanduser() if m.cache_dir else default_cache_dir()
    return build_tiny(tiny, arith_config(cfg.data), cache)
