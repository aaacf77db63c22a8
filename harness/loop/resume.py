"""Resume: continue a run from its newest checkpoint (weights, optimizer, RNG streams, counters), cut its logs back
to that step, and read what it has already measured (the best score, the score policy/best holds)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from harness.config import RunConfig
from harness.loop.checkpoint import CHECKPOINTS, load_latest
from harness.loop.diagnostics import ClippedTokens
from harness.loop.export import POLICY, read_info
from harness.loop.resume_guard import ResumeRefused
from harness.loop.rollouts import restored
from harness.loop.tokens import TokenSamples
from harness.lora import is_lora, restore_adapter
from harness.rundir.files import read_jsonl

if TYPE_CHECKING:
    from harness.loop.state import Run


def resume(run: Run) -> None:
    """Continue from the newest checkpoint when `trainer.resume` is set (weights, optimizer, RNG streams, counters),
    cutting the logs back to it; then open the token sampler and read the best score evaluated so far and the one
    policy/best holds."""
    if run.cfg.trainer.resume:
        restore = run.ranks.restore(run.policy, run.optimizer)  # a one-process checkpoint under torchrun
        lora = is_lora(run.policy)
        if lora:  # checkpoints hold the adapters only
            restore = restore_adapter(run.policy, run.optimizer, sharded=run.ranks.active)
        state = load_latest(run.run_dir, run.policy, run.optimizer, restore, adapters_only=lora)
        if state is None and run.cfg.trainer.resume is True:  # the guard saw one that looked whole; none loaded
            raise ResumeRefused(
                f"trainer.resume: no checkpoint under {run.run_dir / CHECKPOINTS} could be loaded (the warnings above "
                "say why); resume with trainer.resume=auto to start afresh"
            )
        _set_hyperparameters(run.optimizer, run.cfg)  # the config's (a resume_allow change), not the saved ones
        run.done_steps = int(state["step"]) if state else 0
        run.checkpointed = run.done_steps if state else None
        run.skipped = int(state["extra"].get("skipped_steps", 0)) if state else 0
        run.clipped = ClippedTokens(state["extra"].get("clipped_tokens") if state else None)
        run.restored_rollouts = restored(state["extra"]) if state and run.cfg.trainer.max_staleness else None
        run.log.truncate_after(run.done_steps if state else -1)
        run.sync_weights()
    run.tokens = TokenSamples(run.run_dir, resume_after=run.done_steps) if run.ranks.main else None
    run.best = eval_scores(run.run_dir, run.score_key)[1]
    run.best_exported = run.ranks.from_main(lambda: _kept_best(run))


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


def eval_scores(run_dir: Path, key: str) -> tuple[float | None, float | None]:
    """(first, best) score in eval.jsonl so far: what a resumed run already measured."""
    path = run_dir / "eval.jsonl"
    scores = [r[key] for r in read_jsonl(path) if r.get(key) is not None] if path.exists() else []
    return (scores[0], max(scores)) if scores else (None, None)
