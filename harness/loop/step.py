"""One RL step, its phases top to bottom in DESIGN.md's order:

rollout (the engine's weights give mu; harness/loop/rollouts.py: in step, or ahead on a worker thread) -> reward
(math-verify) and group advantages -> old_logp recompute (only for a trust region anchored on pi_old) -> the
rollout correction in decoupled mode (IS weight and rejection from pi_old/mu, once per step) -> the mini-batch
updates (objective -> [bypass-mode correction] -> aggregate -> AdamW) -> weight sync (or a published copy) -> the
step's metrics row.

Under torchrun every rank runs the same code on the whole step's batch (rank 0 rolls it out) and trains on every
world-th row of each mini-batch; `Run.ranks` makes that the identity with one process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from harness.advantages import compute_advantages
from harness.batch import TrainBatch, build_batch, objective_inputs, policy_logprobs
from harness.logprobs import LogProbOutput
from harness.loop.checkpoint import checkpoint
from harness.loop.correction import corrected, decoupled_correction, minibatch_denominator, rows_of
from harness.loop.diagnostics import bad_update_frac, mismatch, rollout_metrics, zero_weight
from harness.loop.rollouts import after_update, staleness_metrics, step_batch
from harness.loop.state import Run
from harness.loop.tokens import token_rows
from harness.moe import route_metrics
from harness.objectives import Objective, ObjectiveOutput, aggregate, aggregate_denominator
from harness.objectives.common import NonFiniteInputError, masked_mean
from harness.objectives.correction import Correction
from harness.rewards import grade
from harness.rollout.base import Rollout
from harness.tasks.arith import Problem

# The objective's inputs whose NaN/inf skips an update (counted, toward trainer.max_bad_steps): the model's and the
# rollout engine's log-probs.
_SKIPPED_INPUTS = frozenset({"logp", "behavior_logp", "old_logp", "topk_logp", "is_logp"})


class NonFiniteError(RuntimeError):
    """Too many consecutive steps had a NaN/inf from the model, the loss or the gradient; the last good weights
    are checkpointed."""


def rl_step(run: Run, step: int) -> dict[str, float]:
    """Roll out, score, update, sync; log the step's metrics row and return it."""
    t0 = time.time()
    skipped_before = run.skipped
    problems, ro, version = step_batch(run, step)
    t_rollout = time.time() - t0

    rewards, adv, reward_metrics = score(run, problems, ro)
    batch = build_batch(ro, adv, run.tokenizer.pad_token_id, run.objective.topk)
    run.clipped.start_step()

    t1 = time.time()
    if run.cfg.rollout.behavior == "trainer":  # the no-mismatch reference: mu is the trainer's own pi
        batch = trainer_behavior(run, batch)
    old_logp = recompute_old_logp(run, batch)
    batch, corr = decoupled_correction(run, batch, old_logp)
    update_metrics, updates = update_minibatches(run, step, batch, old_logp, corr)
    after_update(run, step)
    t_train = time.time() - t1

    n_tokens = float(ro.mask.sum())
    metrics = {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()),
        **reward_metrics,
        "rollout/response_len_mean": n_tokens / len(ro.texts),
        "rollout/truncated_frac": float((~ro.finished).float().mean()),
        **rollout_metrics(batch.mask, batch.behavior_logp, batch.topk_behavior_logp),
        **staleness_metrics(run, step, version),
        **update_metrics,
        **({} if corr is None else {k: float(v) for k, v in corr.metrics.items()}),
        **run.clipped.metrics(run.ranks),
        "optim/lr": run.optimizer.param_groups[0]["lr"],  # what AdamW used, which a resume sets from the config
        "optim/updates": float(updates),
        "optim/skipped_steps": float(run.skipped),
        "perf/rollout_s": t_rollout,
        "perf/train_s": t_train,
        "perf/tokens_per_s": n_tokens / max(time.time() - t0, 1e-9),
        "samples": float(step * len(ro.texts)),
    }
    run.log.log(step, metrics)
    stop_if_diverged(run, step, bad=run.skipped > skipped_before, good=updates > 0)
    return metrics


def score(run: Run, problems: list[Problem], ro: Rollout) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Rewards (math-verify against each problem's answer, or rank 0's reward model) and group advantages."""
    if run.cfg.reward.kind == "reward_model":
        rows = [problems[int(g)] for g in ro.group]
        values, reward_metrics = run.ranks.from_main(lambda: run.scorer.rewards(rows, ro.texts))  # type: ignore[union-attr]
    else:
        answers = [problems[int(g)].answer for g in ro.group]
        graded = grade(ro.texts, answers, ro.finished.tolist(), **run.cfg.reward.grade_kwargs())
        values, reward_metrics = graded.rewards, graded.metrics
    rewards = torch.tensor(values)
    adv, adv_metrics = compute_advantages(rewards, ro.group, run.cfg.trainer.advantage)
    return rewards, adv, {**adv_metrics, **reward_metrics}


def recompute_old_logp(run: Run, batch: TrainBatch) -> torch.Tensor | None:
    """pi_old over the whole batch before any update: only when the objective's trust region is anchored on it.
    A bypass-mode rollout correction puts mu in its place instead, without the forward (verl's apply_bypass_mode)."""
    if not run.objective.needs_old:
        return None
    if run.cfg.correction.bypass_mode:
        return batch.behavior_logp
    with torch.no_grad():
        lp = policy_logprobs(
            run.policy,
            batch,
            run.cfg.rollout.temperature,
            autocast_dtype=run.prec.train_autocast,
            replay_routes=run.cfg.rollout.router_replay,
        )
    return lp.logp


def trainer_behavior(run: Run, batch: TrainBatch) -> TrainBatch:
    """`rollout.behavior=trainer` (DPPO Fig. 3's "no mismatch" curve): the engine only samples; the behaviour
    log-probs are recomputed by the trainer before any update, so pi = mu at the step's first mini-batch and the
    remaining gap is the policy's own movement across mini-batches."""
    with torch.no_grad():
        lp = policy_logprobs(
            run.policy,
            batch,
            run.cfg.rollout.temperature,
            with_topk=run.objective.topk > 1,
            autocast_dtype=run.prec.train_autocast,
            replay_routes=run.cfg.rollout.router_replay,
        )
    topk = batch.topk_behavior_logp if lp.topk_logp is None else lp.topk_logp * batch.mask[..., None]
    return dataclasses.replace(batch, behavior_logp=lp.logp * batch.mask, topk_behavior_logp=topk)


@dataclass
class MiniBatch:
    """This rank's rows of one mini-batch, and what the update needs to know about the whole mini-batch."""

    batch: TrainBatch
    old_logp: torch.Tensor | None
    full_denominator: float  # what the whole mini-batch's loss is normalised by (every row, every rank)
    has_signal: bool  # this rank's rows carry a non-zero advantage
    any_signal: bool  # some rank's do
    correction: Correction | None = None  # the decoupled-mode correction of these rows (weight, keep)


def update_minibatches(
    run: Run, step: int, batch: TrainBatch, old_logp: torch.Tensor | None, corr: Correction | None = None
) -> tuple[dict[str, float], int]:
    """The off-policy updates the trust region has to bound: one AdamW step per mini-batch. Returns the mean of the
    mini-batches' metrics and the number of updates applied.

    Rows whose advantage is 0 everywhere carry no gradient for any objective: they are skipped, and the loss stays
    normalised by the full mini-batch, as if they had been there. The mismatch is read off the step's first
    forward (before any update); if no row had a signal, one gradient-free forward over the first mini-batch
    measures it instead. Tokens a decoupled-mode correction rejected leave the denominators too (and a row with none
    left, the seq-mean ones)."""
    cfg, t, ranks = run.cfg, run.cfg.trainer, run.ranks
    order = torch.randperm(len(batch), generator=torch.Generator().manual_seed(cfg.seed + step))
    sample_tokens = run.tokens is not None and t.tokens_per_eval > 0
    sample_tokens = sample_tokens and (step % t.eval_every == 0 or step == t.total_steps)
    rows_metrics: list[dict[str, float]] = []
    updates = 0
    for rows in order.chunk(t.minibatches):
        full_denominator = minibatch_denominator(batch, corr, rows, cfg.objective.agg)
        rows = rows[ranks.rank :: ranks.world]  # the mini-batches are the same on every rank, their rows are split
        active = (batch.advantages[rows] != 0).any(1)
        has_signal = bool(active.any())
        # FSDP2's forward and backward are collectives: a rank without signal still runs them (with a zero loss)
        # as long as some rank has signal.
        any_signal = ranks.any(has_signal)
        measuring = not rows_metrics  # nothing measured yet this step
        if not any_signal and not measuring:
            continue
        if has_signal:
            rows = rows[active]
        mb = batch.select(rows)
        mb_old = None if old_logp is None else old_logp[rows][:, : mb.mask.shape[1]]
        mb_corr = None if corr is None else rows_of(corr, rows, mb.mask.shape[1])
        m, applied, sampled = update(
            run,
            step,
            MiniBatch(mb, mb_old, full_denominator, has_signal, any_signal, mb_corr),
            measuring,
            sample_tokens,
        )
        updates += applied
        sample_tokens = sample_tokens and not sampled
        rows_metrics.append(ranks.mean_metrics(m))
    return _mean_of(rows_metrics), updates


def update(
    run: Run, step: int, mb: MiniBatch, measuring: bool, sample_tokens: bool
) -> tuple[dict[str, float], bool, bool]:
    """One mini-batch: forward, objective, aggregate, backward, AdamW step (skipped if the loss or gradient is not
    finite). Returns (metrics, whether the update was applied, whether tokens were sampled)."""
    cfg, t, b = run.cfg, run.cfg.trainer, mb.batch
    lp = forward(run, step, b, with_grad=mb.any_signal)
    entropy = math.nan if lp.entropy is None else float(masked_mean(lp.entropy, b.mask > 0))
    m = {"rollout/entropy": entropy}
    if measuring:  # before the step's first update: the pure training-inference mismatch
        m.update(mismatch(lp.logp.detach(), b))
        m.update(route_metrics(run.policy))  # a mixture of experts: routes that differ from the engine's
    if not mb.any_signal:
        return m, False, False
    cmb = corrected(run, mb, lp)
    out = objective_or_skip(run.objective, lp, cmb.batch, mb.old_logp, cmb.mask, cmb.is_logp)
    # a NaN/inf from the model: nothing to learn from, on any rank (FSDP2 collectives)
    skip = run.ranks.any(out is None)
    if skip or out is None:
        skip_update(run)
        m.update({"optim/loss": math.nan, "optim/grad_norm": math.nan})
        return m, False, False
    if cmb.weight is not None:  # the IS weight multiplies the per-token loss (detached)
        out = ObjectiveOutput(out.loss_mat * cmb.weight, out.metrics)
    sampled = record_update(run, step, dataclasses.replace(mb, batch=cmb.batch), lp, out, sample_tokens)
    loss = minibatch_loss(out.loss_mat, cmb.mask, cfg.objective.agg, run.horizon, cmb.full_denominator, mb.has_signal)
    if step in t.nan_at_steps:
        loss = loss * math.nan
    applied, loss, grad_norm = apply_update(run, loss)
    if mb.has_signal:
        m.update({key: float(v) for key, v in {**out.metrics, **cmb.metrics}.items()})
        m["mismatch/bad_update_frac"] = bad_update_frac(lp.logp.detach(), b, t.bad_update_gap)
    m.update({"optim/loss": float(loss), "optim/grad_norm": float(grad_norm)})
    return m, applied, sampled


def forward(run: Run, step: int, b: TrainBatch, with_grad: bool) -> LogProbOutput:
    """The policy's log-probs (and entropy, top-K) of the mini-batch's responses, under the training precision."""
    cfg = run.cfg
    with torch.set_grad_enabled(with_grad), nan_logits(run.policy, step in cfg.trainer.nan_logits_at_steps):
        return policy_logprobs(
            run.policy,
            b,
            cfg.rollout.temperature,
            with_topk=run.objective.topk > 1,
            autocast_dtype=run.prec.train_autocast,
            replay_routes=cfg.rollout.router_replay,
        )


def record_update(
    run: Run, step: int, mb: MiniBatch, lp: LogProbOutput, out: ObjectiveOutput, sample_tokens: bool
) -> bool:
    """What the figures and the replay keep of this update: the tokens it masks or clips (Fig. 6, App. D), its
    inputs (`trainer.save_batches`), and on an evaluation step's first update with signal, where pi is mu, a token
    sample (tokens.parquet). Returns whether tokens were sampled."""
    t, b = run.cfg.trainer, mb.batch
    if mb.has_signal:
        run.clipped.add(zero_weight(out.loss_mat, lp.logp), b, lp.entropy)
    if mb.has_signal and step in t.save_batches:
        save_batch(run, step, lp, b, mb.old_logp)
    sampled = sample_tokens and mb.has_signal
    if sampled:
        gen = torch.Generator().manual_seed(run.cfg.seed + step)
        assert run.tokens is not None
        run.tokens.add(token_rows(step, out.loss_mat, lp, b, mb.old_logp, t.tokens_per_eval, gen))
    return sampled


def save_batch(run: Run, step: int, lp: LogProbOutput, b: TrainBatch, old_logp: torch.Tensor | None) -> None:
    """`trainer.save_batches`: append this update's objective inputs to batches/step_<k>.pt (rank 0's rows), so a
    replay (analysis/replay.py) can run every objective on exactly these tokens. Detached copies: nothing here
    touches the graph or any RNG, so a run that saves trains exactly as one that does not."""
    if not run.ranks.main:
        return
    path = run.run_dir / "batches" / f"step_{step}.pt"
    path.parent.mkdir(exist_ok=True)
    saved = torch.load(path) if path.exists() else []
    saved.append({
        "logp": lp.logp.detach().cpu(), "behavior_logp": b.behavior_logp.cpu(), "advantages": b.advantages.cpu(),
        "mask": b.mask.cpu(), "entropy": lp.entropy.detach().cpu(),
        "old_logp": None if old_logp is None else old_logp.detach().cpu(), "update": len(saved),
    })  # fmt: skip
    torch.save(saved, path)


def apply_update(run: Run, loss: torch.Tensor) -> tuple[bool, torch.Tensor, torch.Tensor]:
    """Backward, clip, and the AdamW step if loss and gradient are finite; otherwise nothing is applied and the
    skip is counted. Returns (applied, the global loss, the gradient norm)."""
    ranks = run.ranks
    run.optimizer.zero_grad(set_to_none=True)
    # FSDP2 averages gradients over ranks; each rank's loss is its share of the global sum.
    (loss * ranks.world).backward()
    grad_norm = _full(torch.nn.utils.clip_grad_norm_(run.policy.parameters(), run.cfg.trainer.grad_clip))
    loss = torch.tensor(ranks.all_sum(float(loss.detach())))
    if torch.isfinite(loss) and torch.isfinite(grad_norm):
        run.optimizer.step()
        if run.cfg.rollout.sync == "step":
            run.sync_weights()
        return True, loss, grad_norm
    skip_update(run)
    return False, loss, grad_norm


def skip_update(run: Run) -> None:
    """Weights and optimizer state stay as they were; the skip is counted (`optim/skipped_steps`)."""
    run.optimizer.zero_grad(set_to_none=True)
    run.skipped += 1


def stop_if_diverged(run: Run, step: int, bad: bool, good: bool) -> None:
    """`trainer.max_bad_steps` bad steps in a row (a step is bad when any of its updates was skipped; a step
    without any update, for want of signal, neither breaks nor extends the streak) end the run. The weights are
    the last good ones (nothing bad was applied): keep them, so a resume or a post-mortem starts from what is
    known to be sane."""
    if bad:
        run.bad_streak += 1
    elif good:
        run.bad_streak = 0
    limit = run.cfg.trainer.max_bad_steps
    if run.bad_streak < limit:
        return
    checkpoint(run, step)
    raise NonFiniteError(
        f"{run.bad_streak} steps in a row had a non-finite log-prob, loss or gradient (step {step}); "
        f"the last good weights are in checkpoints/step_{step} (trainer.max_bad_steps={limit})"
    )


@contextlib.contextmanager
def nan_logits(policy: torch.nn.Module, on: bool) -> Iterator[None]:
    """`trainer.nan_logits_at_steps` (fault drills): the model's head outputs NaN, as an overflowing model would,
    so the drill goes through the real forward, log-prob and skip path."""
    if not on:
        yield
        return
    handle = policy.get_output_embeddings().register_forward_hook(lambda _m, _i, out: out * math.nan)
    try:
        yield
    finally:
        handle.remove()


def objective_or_skip(
    objective: Objective,
    lp: LogProbOutput,
    b: TrainBatch,
    old_logp: torch.Tensor | None,
    mask: torch.Tensor | None = None,
    is_logp: torch.Tensor | None = None,
) -> ObjectiveOutput | None:
    """The objective on this rank's rows, or None when the model's or the engine's log-probs are NaN/inf where
    the response mask is on. The objective's own input check is the only one on the training path (one host sync
    per update); the entropy and the top-K log-probs come from the same logits as logp (harness.logprobs), so a
    NaN in them is a NaN in logp. Non-finite advantages or top-K mu alone are a bug upstream: the error stands."""
    try:
        return objective(**objective_inputs(b, lp.logp, lp.topk_logp, old_logp, mask=mask, is_logp=is_logp))
    except NonFiniteInputError as e:
        if e.counts.keys().isdisjoint(_SKIPPED_INPUTS):
            raise
        return None


def minibatch_loss(
    loss_mat: torch.Tensor, mask: torch.Tensor, agg: str, horizon: int, full_denominator: float, has_signal: bool = True
) -> torch.Tensor:
    """This process's part of a mini-batch's loss: `aggregate` over its rows, rescaled so that it is normalised
    by the whole mini-batch (`full_denominator`, `aggregate_denominator` of every row on every rank, the skipped
    zero-advantage rows too). Summed over ranks it is the single-process loss. A rank whose rows carry no signal
    contributes 0 (its forward and backward still run: they are FSDP2 collectives)."""
    if not has_signal:
        return loss_mat.sum() * 0.0
    scale = float(aggregate_denominator(mask, agg)) / full_denominator
    return aggregate(loss_mat, mask, agg, horizon) * scale


def _full(x: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (FSDP2's gradient norm), a plain tensor as it is."""
    return x.full_tensor() if hasattr(x, "full_tensor") else x


def _mean_of(rows: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for r in rows for k in r}
    return {k: sum(r[k] for r in rows if k in r) / sum(1 for r in rows if k in r) for k in sorted(keys)}
