"""The end of a run stopped from outside (harness/preemption.py): every rank agrees to stop at the same step
boundary, a checkpoint holds that step, W&B is told, and the summary says "preempted", with the signal and the
step a resume with trainer.resume=auto continues from."""

from __future__ import annotations

import logging
from typing import Any

from harness import health, preemption
from harness.loop.checkpoint import checkpoint_or_warn
from harness.loop.resume import eval_scores
from harness.loop.state import Run
from harness.loop.wandb_run import mark_preempting

logger = logging.getLogger(__name__)


def stop_requested(run: Run) -> bool:
    """Whether any rank has received a stop: a collective, so every rank stops before the same step."""
    return run.ranks.any(preemption.requested() is not None)


def stop_at(run: Run, step: int) -> dict[str, Any]:
    """Stop after `step` (the last one finished): a checkpoint of it unless one holds it already (none at step 0: a
    resume from nothing starts afresh), W&B marked preempting; returns the summary's fields."""
    mark_preempting(run.log)
    if step > 0 and run.checkpointed != step:
        checkpoint_or_warn(run, step)  # a failed write leaves the previous checkpoint: its step is reported
    stop = preemption.requested()  # the first rank's that received one: maybe not rank 0, which writes the summary
    received = [r for r in run.ranks.gather_objects(stop.record() if stop else None) if r is not None]
    return _preempted(run, step, abandoned=None, received=received[0] if received else None)


def abandoned(run: Run | None, error: preemption.StepAbandoned) -> dict[str, Any]:
    """The summary's fields when the grace period ran out inside a step: the last scheduled checkpoint stands."""
    if run is not None:
        mark_preempting(run.log)
    stop = preemption.requested()
    return _preempted(run, None, abandoned=str(error), received=stop.record() if stop else None)


def _preempted(
    run: Run | None, step: int | None, abandoned: str | None, received: dict[str, Any] | None
) -> dict[str, Any]:
    kept = run.checkpointed if run is not None else None
    record = {
        **(received or {"signal": None, "received_at": None}),
        "stopped_after_step": step,
        "checkpoint_step": kept,
        "abandoned": abandoned,
    }
    out: dict[str, Any] = {"status": "preempted", "preempted": record}
    preemption.ended_preempted(count=True)
    if run is not None:
        out.update(score_key=run.score_key, benchmark=run.cfg.benchmark.name, steps=run.cfg.trainer.total_steps)
        out["best_score"] = run.best
        out["initial_score"] = eval_scores(run.run_dir, run.score_key)[0]
        out.update(health.summary_fields(run.cfg, run.run_dir))
    if run is None or run.ranks.main:
        where = "nothing to resume from" if kept is None else f"checkpoint step_{kept}"
        logger.warning(
            "preempted by %s after step %s (%s); continue with trainer.resume=auto",
            record["signal"],
            "-" if step is None else step,
            where,
        )
    return out
