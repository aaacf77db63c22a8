"""Where a step's batch comes from: rank 0's engine, in step (the synchronous loop) or ahead of the trainer on a
worker thread (`trainer.max_staleness` = k > 0, asynchronous rollouts, as verl's one-step-off-policy trainer for
k = 1), so that generation and the updates overlap.

With k > 0, step t's batch always comes from the policy after step v(t) = max(floor, t - 1 - k), floor being the
step the run started or resumed from. Exact rather than "the newest weights there are": a fixed-seed run samples
the same batches whatever the timing, and every trained sample lags the trainer by exactly min(k, t - 1 - floor)
updates. After each step the trainer publishes a copy of its weights (the copy is all it waits for); the worker
loads version v(t) into the engine just before generating batch t, so mu is the producing engine's own log-prob,
as in the synchronous loop. An evaluation borrows the engine, under its lock, at the step's own weights.

A checkpoint at step t carries the batches already promised to steps t+1..t+k (the worker finishes them first:
they need only weights it has), so a resumed run trains on exactly the batches an uninterrupted one would. A
checkpoint without them (written by a synchronous run) restarts the pipeline from its own weights.

The worker is a thread of rank 0's process; the engine it drives is `harness.rollout.process.ProcessEngine`,
in a process of its own, so that the engine's Python does not share the trainer's interpreter (what that costs:
docs/performance.md, "Sizes the timings set"). The worker thread itself mostly waits on that process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from harness.loop.state import Run
from harness.lora import engine_state_dict
from harness.rollout.base import Rollout
from harness.tasks import render_prompts
from harness.tasks.arith import Problem, balanced_sample

State = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Produced:
    """A step's batch and the policy version (steps trained) whose engine copy sampled it."""

    step: int
    version: int
    rollout: Rollout


class AsyncRollouts:
    """The worker thread and what it shares with the trainer: the weight versions published, the batches made."""

    def __init__(
        self,
        generate: Callable[[int], Rollout],
        load: Callable[[State], None],
        k: int,
        steps: range,
        floor: tuple[int, State],
        restored: Mapping[int, Produced] | None = None,
    ) -> None:
        self.generate, self.load, self.k = generate, load, k
        self.floor, self.engine_version = floor[0], floor[0]  # the engine holds the floor's weights now
        self.snapshots: dict[int, State] = {floor[0]: floor[1]}
        self.made: dict[int, Produced | BaseException] = dict(restored or {})
        self.engine = threading.Lock()
        self.changed = threading.Condition()
        self.closing = False
        self.thread = threading.Thread(target=self._work, args=(steps,), name="rollouts", daemon=True)
        self.thread.start()

    def version_for(self, step: int) -> int:
        return max(self.floor, step - 1 - self.k)

    def publish(self, version: int, state: State) -> None:
        with self.changed:
            self.snapshots[version] = state
            self.changed.notify_all()

    def take(self, step: int) -> Produced:
        """Step `step`'s batch, waiting for the worker if it is not made yet."""
        with self.changed:
            self.changed.wait_for(lambda: step in self.made)
            item = self.made.pop(step)
        if isinstance(item, BaseException):
            raise item
        return item

    def promised(self, after: int, last: int) -> list[Produced]:
        """The batches of steps after+1..after+k (up to `last`), waited for and kept (a checkpoint's)."""
        steps = range(after + 1, min(after + self.k, last) + 1)
        with self.changed:
            self.changed.wait_for(lambda: all(s in self.made for s in steps))
            items = [self.made[s] for s in steps]
        for item in items:
            if isinstance(item, BaseException):
                raise item
        return items  # type: ignore[return-value]

    @contextlib.contextmanager
    def engine_at(self, version: int) -> Iterator[None]:
        """The engine holding the weights after step `version` (published), for the caller alone."""
        with self.engine:
            self._load(version)
            yield

    def close(self) -> None:
        with self.changed:
            self.closing = True
            self.changed.notify_all()
        self.thread.join(timeout=60)  # a generation in flight finishes first; a stuck one is left (a daemon)

    def _load(self, version: int) -> None:
        """Under the engine lock: make the engine hold `version`'s weights."""
        if self.engine_version != version:
            with self.changed:
                state = self.snapshots[version]
            self.load(state)
            self.engine_version = version

    def _work(self, steps: range) -> None:
        for step in steps:
            if step in self.made:  # restored from the checkpoint
                continue
            need = self.version_for(step)
            with self.changed:
                self.changed.wait_for(lambda: self.closing or need in self.snapshots)  # noqa: B023
                if self.closing:
                    return
            item: Produced | BaseException
            try:
                with self.engine:
                    self._load(need)
                    item = Produced(step, need, self.generate(step))
            except BaseException as e:  # handed to the trainer, which raises it at take()
                item = e
            with self.changed:
                self.made[step] = item
                for old in [v for v in self.snapshots if v < need]:  # later steps need later versions
                    del self.snapshots[old]
                self.changed.notify_all()
            if isinstance(item, BaseException):
                return


# ------------------------------------------------------------------------- the trainer's side


def step_problems(run: Run, step: int) -> list[Problem]:
    """The step's problems: they depend only on (seed, step), so every rank draws the same."""
    rng = random.Random(run.cfg.seed * 1_000_003 + step)
    return balanced_sample(run.train_set, run.cfg.trainer.prompts_per_step, rng)  # kinds in equal shares


def generate(run: Run, step: int, problems: list[Problem]) -> Rollout:
    """Rank 0's engine samples the step's batch."""
    cfg, t = run.cfg, run.cfg.trainer
    assert run.engine is not None  # rank 0 holds the engine
    return run.engine.generate(
        render_prompts(run.tokenizer, problems, cfg.data.template),
        n=t.group_size,
        max_new_tokens=t.max_new_tokens,
        topk=run.objective.topk,
        temperature=cfg.rollout.temperature,
        seed=cfg.seed * 1_000_003 + step,
        top_p=cfg.rollout.top_p,
        top_k=cfg.rollout.top_k,
        min_p=cfg.rollout.min_p,
        mu=cfg.rollout.mu,
    )


def step_batch(run: Run, step: int) -> tuple[list[Problem], Rollout, int]:
    """(problems, rollout, the version that sampled it); every rank gets them."""
    problems = step_problems(run, step)
    if run.rollouts is None and not run.cfg.trainer.max_staleness:
        return problems, run.ranks.from_main(lambda: generate(run, step, problems)), step - 1
    made = run.ranks.from_main(lambda: run.rollouts.take(step))  # type: ignore[union-attr]
    lag = step - 1 - made.version
    if made.step != step or not 0 <= lag <= run.cfg.trainer.max_staleness:
        raise RuntimeError(
            f"asynchronous rollouts: step {step} got the batch of step {made.step} from version {made.version} "
            f"(lag {lag}, trainer.max_staleness {run.cfg.trainer.max_staleness})"
        )
    return problems, made.rollout, made.version


def staleness_metrics(run: Run, step: int, version: int) -> dict[str, float]:
    """The lag of the step's samples behind the trainer, in updates (one version per batch: its distribution is a
    point); none in the synchronous loop, whose metrics rows stay as they were."""
    k = run.cfg.rollout.sync_every
    if k > 1:  # the engine's weights are those after the last multiple of k before this step
        return {"rollout/policy_version": float((step - 1) // k * k), "rollout/staleness": float((step - 1) % k)}
    if not run.cfg.trainer.max_staleness:
        return {}
    return {"rollout/policy_version": float(version), "rollout/staleness": float(step - 1 - version)}


def after_update(run: Run, step: int) -> None:
    """The engine follows the trainer: in step (rollout.sync=rollout), or through a published copy (k > 0)."""
    if run.cfg.trainer.max_staleness:
        state = snapshot(run)  # a collective: every rank takes part
        if run.rollouts is not None:
            run.rollouts.publish(step, state)  # type: ignore[arg-type]
    elif run.cfg.rollout.sync == "rollout" and step % run.cfg.rollout.sync_every == 0:
        run.sync_weights()  # rollout.sync_every = k > 1: a stale engine, synced after steps k, 2k, ...


def snapshot(run: Run) -> State | None:
    """A copy of the weights as the engine takes them (LoRA merged); rank 0's, None elsewhere."""
    state = run.ranks.full_state_dict(run.policy)
    if not run.ranks.main:
        return None
    return {name: t.detach().clone() for name, t in engine_state_dict(run.policy, state).items()}


def start(run: Run) -> None:
    """Start rank 0's worker for the steps left when the run asks for k > 0 (after the step-0 evaluation)."""
    t = run.cfg.trainer
    if not t.max_staleness or run.done_steps >= t.total_steps:
        return
    floor = snapshot(run)
    if run.ranks.main:
        run.rollouts = AsyncRollouts(
            lambda step: generate(run, step, step_problems(run, step)), run.engine.sync_weights, t.max_staleness,  # type: ignore[union-attr]
            range(run.done_steps + 1, t.total_steps + 1), (run.done_steps, floor), run.restored_rollouts,  # type: ignore[arg-type]
        )  # fmt: skip


def engine_for_eval(run: Run, step: int) -> contextlib.AbstractContextManager:
    """The engine at step `step`'s weights for an evaluation (the worker waits meanwhile)."""
    return run.rollouts.engine_at(step) if run.rollouts is not None else contextlib.nullcontext()


def checkpoint_extra(run: Run, step: int) -> dict[str, Any]:
    """What a checkpoint at `step` adds: the batches promised to the next k steps (rank 0's)."""
    if run.rollouts is None:
        return {}
    made = run.rollouts.promised(step, run.cfg.trainer.total_steps)
    return {"rollouts": [{"step": p.step, "version": p.version, **dataclasses.asdict(p.rollout)} for p in made]}


def restored(extra: Mapping[str, Any]) -> dict[int, Produced]:
    """The promised batches a checkpoint carried, by step."""
    out = {}
    for item in extra.get("rollouts") or []:
        item = dict(item)
        step, version = int(item.pop("step")), int(item.pop("version"))
        out[step] = Produced(step, version, Rollout(**item))
    return out
