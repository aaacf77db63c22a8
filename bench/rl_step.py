"""B4: one whole RL step of the harness against TRL's GRPOTrainer at the same batch shape.

Run: ``python -m bench.rl_step [--steps 20] [--warmup 1] [--threads 1] [--skip-vllm]``

A step = generation, grading, advantages, objective, backward, optimizer step and weight sync: everything from a
step's first token to its optimizer update. Model: bench/tiny32k.py (tiny-preset shape, 32k vocab, random init),
fp32 on CPU. Batch: 4 prompts x 4 samples x 32 new tokens, one mini-batch, one update per step.

Cases, run one after another in this process:
- ``trl``: ``trl.GRPOTrainer`` at stack.md section 6's GRPOConfig (batch 16, num_generations 4, 32 tokens,
  beta 0, loss_type "dapo", scale_rewards "group", HF generation), only ``max_steps`` and ``output_dir``
  differ. Timed with a TrainerCallback from ``on_step_begin`` to ``on_step_end`` (generation, rewards, loss,
  optimizer step; TRL's logging comes after). Tokens = the step's increase of ``state.num_input_tokens_seen``
  (TRL counts prompt + completion tokens there).
- ``harness hf`` / ``harness vllm``: ``harness.loop.train.train`` with objective=grpo, advantage=grpo, minibatches=1,
  rollout=hf or rollout=vllm, lr as TRL's. Step time = the step's response tokens / its ``perf/tokens_per_s``
  (the trainer times from the step's first line to just before logging, weight sync included). Tokens = prompt
  tokens (recorded by a thin wrapper around the engine's ``generate``) + response tokens.

Throughput = (prompt + completion tokens) / step time; the median over ``--steps`` steps after ``--warmup``.

Rewards: a random-init model never answers, so a correctness reward is 0 everywhere; the harness would then
(correctly) skip the update for zero-advantage rows and the comparison would time a step without a backward. Both
sides therefore get the same dense reward: 1 if the gold answer appears in the completion, plus the fraction of
digit characters. On the harness side it replaces the rewards after the real math-verify ``grade`` has run, so
the harness still pays for its grader (TRL pays only for the two cheap functions).

Targets: harness (hf) tokens/s >= 1.5x TRL; harness (vllm) >= 2x TRL. Writes bench/results/rl_step.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).resolve().parent / "results" / "rl_step.json"
PROMPTS, GROUP, TOKENS, LR = 4, 4, 32, 1e-5


@dataclasses.dataclass(frozen=True)
class Shape:
    """A step's batch: prompts x group samples of up to `tokens` new tokens, in `updates` optimizer steps."""

    prompts: int = PROMPTS
    group: int = GROUP
    tokens: int = TOKENS
    updates: int = 1


TARGETS = {"hf": 1.5, "vllm": 2.0}


def dense_reward(text: str, answer: str) -> float:
    """The same reward on both sides: answer present (0/1) plus the digit fraction (variance in every group)."""
    digits = sum(c.isdigit() for c in text) / max(len(text), 1)
    return float(answer in text) + digits


def problems(count: int) -> list[Any]:
    from harness.tasks.arith import ArithConfig, make_splits

    return make_splits(ArithConfig())[0][:count]


# --- TRL ---------------------------------------------------------------------------------------------


def run_trl(path: str, steps: int, warmup: int, seed: int, shape: Shape = Shape()) -> list[tuple[float, float]] | None:
    """(seconds, tokens) per timed optimizer step, or None when trl is not installed. With shape.updates > 1 one
    generation feeds that many optimizer steps (TRL's steps_per_generation), so count steps in multiples of it."""
    try:
        from datasets import Dataset
        from transformers import AutoTokenizer, TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except ImportError:
        return None
    from harness.tasks.templates import render

    tokenizer = AutoTokenizer.from_pretrained(path)
    probs = problems(64)
    # The harness's own prompt text (chat template), so both sides see the same prompt tokens.
    data = Dataset.from_dict(
        {"prompt": [render(tokenizer, p.question, "chat") for p in probs], "answer": [p.answer for p in probs]}
    )

    def reward(completions: list[str], answer: list[str], **_: Any) -> list[float]:
        return [dense_reward(c, a) for c, a in zip(completions, answer, strict=True)]

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.rows: list[tuple[float, float]] = []

        def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001 - TrainerCallback's signature
            self._t0, self._tok0 = time.perf_counter(), state.num_input_tokens_seen

        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
            self.rows.append((time.perf_counter() - self._t0, float(state.num_input_tokens_seen - self._tok0)))

    timer = StepTimer()
    with tempfile.TemporaryDirectory(prefix="bench-trl-") as out:
        config = GRPOConfig(  # stack.md section 6, verbatim but for max_steps and output_dir
            output_dir=out,
            max_steps=warmup + steps,
            per_device_train_batch_size=shape.prompts * shape.group // shape.updates,
            gradient_accumulation_steps=1,
            num_generations=shape.group,
            steps_per_generation=shape.updates,
            max_completion_length=shape.tokens,
            temperature=1.0,
            learning_rate=LR,
            beta=0.0,
            loss_type="dapo",
            epsilon=0.2,
            scale_rewards="group",
            num_iterations=1,
            use_vllm=False,
            bf16=False,
            use_cpu=True,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            seed=seed,
            disable_tqdm=True,
        )
        trainer = GRPOTrainer(
            model=path,
            reward_funcs=[reward],
            args=config,
            train_dataset=data,
            processing_class=tokenizer,
            callbacks=[timer],
        )
        trainer.train()
    return timer.rows[warmup:]


# --- the harness -------------------------------------------------------------------------------------


def run_harness(
    path: str,
    engine: str,
    steps: int,
    warmup: int,
    threads: int | None,
    seed: int,
    shape: Shape = Shape(),
    overrides: tuple[str, ...] = ("objective=grpo", "trainer.advantage=grpo"),
) -> list[tuple[float, float, float, float]]:
    """(seconds, tokens, rollout seconds, train seconds) per timed step; threads None: the run's own default."""
    import harness.loop.state as state_module
    import harness.loop.step as step_module
    from harness.config import compose, validate
    from harness.loop.train import train
    from harness.rundir.files import read_jsonl

    prompt_tokens: list[float] = []  # per training generate call (n == GROUP); eval calls use n=1

    class Recording:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def generate(self, prompts: list[list[int]], n: int, *a: Any, **kw: Any) -> Any:
            if n == shape.group:
                prompt_tokens.append(float(sum(map(len, prompts)) * n))
            return self.inner.generate(prompts, n, *a, **kw)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    def dense_grade(completions: list[str], answers: list[str], *a: Any, **kw: Any) -> Any:
        graded = real_grade(completions, answers, *a, **kw)  # the harness's grader still runs (and costs)
        return dataclasses.replace(
            graded, rewards=[dense_reward(c, ans) for c, ans in zip(completions, answers, strict=True)]
        )

    # Both ways build_run makes the engine: in-process (synchronous) and in its own process (max_staleness > 0)
    real_engine, real_process = state_module.engine_from_config, state_module.ProcessEngine
    real_grade = step_module.grade
    raw = compose(
        f"model.path={path}",
        f"rollout={engine}",
        *overrides,
        "logger=none",
        f"seed={seed}",
        f"trainer.total_steps={warmup + steps}",
        f"trainer.prompts_per_step={shape.prompts}",
        f"trainer.group_size={shape.group}",
        f"trainer.max_new_tokens={shape.tokens}",
        f"trainer.minibatches={shape.updates}",
        f"trainer.lr={LR}",
        *([f"trainer.threads={threads}"] if threads else []),
        f"trainer.eval_every={warmup + steps + 1}",  # evaluations only at 0 and the end, outside every step
        "trainer.checkpoint_every=0",
        "trainer.tokens_per_eval=0",
        "benchmark.max_problems=4",
    )
    state_module.engine_from_config = lambda *a, **kw: Recording(real_engine(*a, **kw))
    state_module.ProcessEngine = lambda *a, **kw: Recording(real_process(*a, **kw))
    step_module.grade = dense_grade
    try:
        with tempfile.TemporaryDirectory(prefix=f"bench-harness-{engine}-") as out:
            summary = train(validate(raw), Path(out) / "run", raw)
            if summary["status"] != "completed":
                raise RuntimeError(f"harness run failed: {summary}")
            metrics = read_jsonl(Path(out) / "run" / "metrics.jsonl")
    finally:
        state_module.engine_from_config, step_module.grade = real_engine, real_grade
        state_module.ProcessEngine = real_process
    rows = []
    for m, prompt in zip(metrics, prompt_tokens, strict=True):
        response = m["rollout/response_len_mean"] * shape.prompts * shape.group
        if m["optim/updates"] != shape.updates:
            raise RuntimeError(f"step {m['step']} made {m['optim/updates']} updates; the bench needs {shape.updates}")
        rows.append((response / m["perf/tokens_per_s"], prompt + response, m["perf/rollout_s"], m["perf/train_s"]))
    return rows[warmup:]


# --- report ------------------------------------------------------------------------------------------


def stats(rows: list[tuple[float, ...]]) -> dict[str, float]:
    """Medians; harness rows also carry the trainer's own split (rollout = generate; train = old-logp,
    update and weight sync; the rest of a step is grading, advantages and batch building)."""
    out = {
        "step_s": statistics.median(r[0] for r in rows),
        "tok_s": statistics.median(r[1] / r[0] for r in rows),
        "tokens_per_step": statistics.median(r[1] for r in rows),
        "steps": len(rows),
    }
    if len(rows[0]) == 4:
        out["rollout_s"] = statistics.median(r[2] for r in rows)
        out["train_s"] = statistics.median(r[3] for r in rows)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per case (median)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the box is shared)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-vllm", action="store_true", help="only TRL and the harness with rollout=hf")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.threads < 1:
        raise ValueError("--steps and --threads must be >= 1 and --warmup >= 0")
    os.environ.setdefault("WANDB_MODE", "disabled")
    torch.set_num_threads(args.threads)
    from bench.tiny32k import build

    t_start = time.perf_counter()
    path = str(build())
    results: dict[str, dict[str, float]] = {}
    wall: dict[str, float] = {}
    t0 = time.perf_counter()
    trl_rows = run_trl(path, args.steps, args.warmup, args.seed)
    wall["trl"] = time.perf_counter() - t0
    if trl_rows is None:
        print("trl is not installed (pip install -e '.[bench]'); timing the harness rows only")
    else:
        results["trl"] = stats(trl_rows)
    for engine in ("hf",) if args.skip_vllm else ("hf", "vllm"):
        torch.set_num_threads(args.threads)
        t0 = time.perf_counter()
        results[f"harness {engine}"] = stats(
            run_harness(path, engine, args.steps, args.warmup, args.threads, args.seed)
        )
        wall[f"harness {engine}"] = time.perf_counter() - t0

    base = results.get("trl")
    rows, summary = [], []
    print(
        f"{'case':<16} {'step s':>8} {'gen s':>6} {'train s':>7} {'tokens/step':>11} {'tokens/s':>9} "
        f"{'vs trl':>7} {'target':>7}"
    )
    for name, r in results.items():
        engine = name.split()[-1]
        ratio = r["tok_s"] / base["tok_s"] if base else None
        target = TARGETS.get(engine) if name != "trl" else None
        rows.append({"case": name, **r, "ratio_vs_trl": ratio, "target": target, "wall_s": wall[name]})
        print(
            f"{name:<16} {r['step_s']:>8.3f} {r.get('rollout_s', math.nan):>6.3f} {r.get('train_s', math.nan):>7.3f} "
            f"{r['tokens_per_step']:>11.0f} {r['tok_s']:>9.0f} "
            f"{'' if ratio is None else f'{ratio:.2f}':>7} {'' if target is None else f'>= {target:g}':>7}"
        )
        if ratio is not None and target is not None:
            summary.append(
                {
                    "id": "B4",
                    "case": f"harness rollout={engine} vs trl, {PROMPTS}x{GROUP}x{TOKENS}",
                    "metric": "tokens/s ratio",
                    "value": round(ratio, 3),
                    "target": f">= {target:g}",
                    "met": ratio >= target,
                }
            )
    print(
        f"median of {args.steps} steps after {args.warmup} warm-up steps; tokens = prompt + completion; "
        "gen/train s: the harness's perf/rollout_s and perf/train_s"
    )
    import transformers

    try:
        import trl

        trl_version = trl.__version__
    except ImportError:
        trl_version = None
    meta = {
        "model": path,
        "vocab": 32768,
        "device": "cpu",
        "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl_version,
        "threads": args.threads,
        "prompts": PROMPTS,
        "group": GROUP,
        "max_new_tokens": TOKENS,
        "steps": args.steps,
        "warmup": args.warmup,
        "reward": "answer-in-completion + digit fraction on both sides (harness: after its math-verify grade)",
        "wall_s": time.perf_counter() - t_start,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows, "summary": summary}, indent=2) + "\n")
    print(f"wrote {args.out} ({meta['wall_s']:.0f} s)")


if __name__ == "__main__":  # vLLM spawns helpers that re-import this module
    main()
