"""The RL training loop: setup, resume, the steps, the summary. Each phase is a named function; one step's phases
read top to bottom in harness/loop/step.py, the state they share is `harness.loop.state.Run`.

Under torchrun (harness/distributed.py) the same function runs in every process: rank 0 holds the rollout
engine and the run directory, every rank holds the whole step's batch and trains on its share of each
mini-batch's rows with the policy sharded by FSDP2. With one process the collectives are identities.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from harness import distributed, health
from harness.config import RunConfig
from harness.loop import rollouts
from harness.loop.checkpoint import checkpoint_or_warn
from harness.loop.evaluate import eval_step
from harness.loop.export import export_or_warn
from harness.loop.resume import eval_scores, resume
from harness.loop.runlog import finishing
from harness.loop.state import Run, build_run, open_log
from harness.loop.step import rl_step
from harness.loop.stop import abandoned, stop_at, stop_requested
from harness.loop.wandb_run import log_policy
from harness.preemption import StepAbandoned, StopSignals
from harness.rundir.files import read_jsonl


def train(cfg: RunConfig, run_dir: Path, raw_config: dict[str, Any]) -> dict[str, Any]:
    """Train per `cfg`, writing everything into `run_dir`. Returns the summary written to summary.json."""
    t_start = time.time()
    ranks = distributed.setup()
    log = open_log(cfg, run_dir, raw_config, ranks)
    summary: dict[str, Any] = {"run_dir": str(run_dir), "objective": cfg.objective.name}
    run: Run | None = None
    t = cfg.trainer
    with finishing(log, summary, t_start), StopSignals(t.preempt_signals, t.preempt_grace_s) as signals:
        try:
            run = build_run(cfg, run_dir, ranks, log)
            run.sync_weights()
            resume(run)
            if run.done_steps == 0:
                summary["initial_score"] = eval_step(run, 0)[run.score_key]
            stopped_after = train_steps(run)
            if stopped_after is not None:  # a stop signal: a checkpoint at the step boundary, status preempted
                signals.step_done()
                summary.update(stop_at(run, stopped_after))
                return summary
            summary.update(final_summary(run, summary))
            final = export_or_warn(run, "final", t.total_steps, summary["final_score"])
            summary["policy"] = None if final is None else str(final)
            if final is not None and cfg.logger.log_model:
                log_policy(log, final, t.total_steps, summary["final_score"])
            if run.failed_exports:
                summary["policy_failed"] = run.failed_exports
        except StepAbandoned as e:  # the grace period ran out inside a step
            summary.update(abandoned(run, e))
        finally:
            if run is not None:
                run.close()
    return summary


def train_steps(run: Run) -> int | None:
    """The steps left, each evaluated and checkpointed on schedule. Returns None when every step is done, or the
    last step finished when a stop signal came (every rank returns the same)."""
    t = run.cfg.trainer
    bar = progress(run)
    rollouts.start(run)  # asynchronous rollouts (trainer.max_staleness > 0): rank 0's worker thread
    for step in bar:
        if stop_requested(run):
            bar.close()
            return step - 1
        metrics = rl_step(run, step)
        if step == 1 and run.ranks.main:
            warn_if_unhealthy(run, metrics)
        last = run.last_eval
        bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", eval=f"{last[run.score_key]:.3f}" if last else "-")
        done = step == t.total_steps
        if step % t.eval_every == 0 or done:
            with rollouts.engine_for_eval(run, step):
                eval_step(run, step)
        if t.checkpoint_every and (step % t.checkpoint_every == 0 or done):
            checkpoint_or_warn(run, step)
    return None


def progress(run: Run) -> tqdm:
    """The remaining steps, as a progress bar on rank 0."""
    t = run.cfg.trainer
    return tqdm(
        range(run.done_steps + 1, t.total_steps + 1),
        initial=run.done_steps,
        total=t.total_steps,
        desc=run.cfg.objective.name,
        dynamic_ncols=True,
        disable=None if run.ranks.main else True,
    )


def warn_if_unhealthy(run: Run, metrics: dict[str, float]) -> None:
    """The step-1 health check (harness/health.py): one line when the mismatch before the first update is high."""
    line = health.check(metrics, health.expected_dose(run.cfg))[1]
    if line:
        tqdm.write(line, file=sys.stderr)


def final_summary(run: Run, summary: dict[str, Any]) -> dict[str, Any]:
    """Scores for summary.json: the final evaluation (read back if a resumed run had finished its steps), the best,
    and the gain over the step-0 evaluation."""
    if run.last_eval is None:  # resumed after the last step: its evaluation is on disk already
        path = run.run_dir / "eval.jsonl"
        previous = read_jsonl(path) if path.exists() else []
        last = run.ranks.broadcast(previous[-1] if previous else None)
        run.last_eval = last or eval_step(run, run.cfg.trainer.total_steps)
    out: dict[str, Any] = dict(
        status="completed",
        final_score=run.last_eval[run.score_key],
        best_score=run.best,
        score_key=run.score_key,
        benchmark=run.cfg.benchmark.name,
        steps=run.cfg.trainer.total_steps,
    )
    out.update(health.summary_fields(run.cfg, run.run_dir))
    if run.failed_saves:
        out["checkpoint_failed_steps"] = run.failed_saves
    initial = summary.get("initial_score")
    if initial is None:  # resumed: the step-0 evaluation is in eval.jsonl already
        initial = out["initial_score"] = eval_scores(run.run_dir, run.score_key)[0]
    if initial is not None:
        out["gain"] = out["final_score"] - initial
    return out
