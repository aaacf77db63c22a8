"""B6: asynchronous rollouts at the default shape: the harness's step rate with trainer.max_staleness = 1 and 2
over the synchronous loop's, and the harness over TRL's GRPOTrainer at the same shape, all in this process.

Run: ``python -m bench.async_step [--steps 12] [--warmup 4] [--engine vllm]``

Shape: the default run's, 32 prompts x 8 samples x 24 new tokens, 4 optimizer steps per batch, on the default
tiny model (fp32, CPU) with the default engine (vLLM); each case uses the run's own thread default (all cores
synchronous, half of them per side asynchronous). A step's time is the trainer's, from the step's first line to
its metrics row (``perf/tokens_per_s``): asynchronous, that includes any wait for the batch, so the median over
steps after the warm-up (the pipeline filled) is the steady rate. TRL: ``GRPOTrainer`` with
``steps_per_generation=4`` (one generation of 256 samples feeds 4 optimizer steps, as ours), HF generation, the
GRPOConfig of B4 otherwise; its tokens/s is total tokens over total time of the timed optimizer steps. Both sides
get B4's dense reward (the harness after its real grader), so every step makes its 4 updates.

Targets: async k = 1 >= 1.6x the synchronous step rate; the harness (the faster of k = 0, 1, 2) >= 3x TRL's
tokens/s. Writes bench/results/async_step.json.

Ceiling: the synchronous loop once more with the trainer on the threads an asynchronous run gives it (one of 2
cores) measures what each side costs alone there: generation e1 (the engine generates on its own threads in both
loops) and the updates u1; the synchronous case gives them on every core, u2. However the work is scheduled, the
engine's e1 seconds leave the trainer its share of the cores only, and the rest of the updates can at best have
every core: a step takes at least e1 + u2 (1 - e1 / u1) plus the step's other work (grading, batch building),
so k > 0 can gain at most the synchronous step over that, with perfect overlap and free switching of cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from bench.common import base_meta, summary_row, write_results
from bench.rl_step import Shape, run_harness, run_trl

RESULTS = Path(__file__).resolve().parent / "results" / "async_step.json"
SHAPE = Shape(prompts=32, group=8, tokens=24, updates=4)
TARGETS = {"async": 1.6, "trl": 3.0}
SHARE = "k=0, trainer's share"  # the synchronous loop with the trainer on its asynchronous share of the cores


def default_model() -> str:
    from harness.config import compose, validate
    from harness.loop.model_path import model_dir

    return str(model_dir(validate(compose())))


def async_trainer_threads() -> int:
    """The torch threads an asynchronous run's trainer has beside its engine."""
    from harness.config import compose, validate
    from harness.loop.state import trainer_threads

    return trainer_threads(validate(compose("trainer.max_staleness=1")))


def medians(rows: list[tuple[float, float, float, float]]) -> dict[str, float]:
    step_s = statistics.median(r[0] for r in rows)
    return {
        "step_s": step_s, "steps_per_s": 1 / step_s, "tok_s": sum(r[1] for r in rows) / sum(r[0] for r in rows),
        "gen_s": statistics.median(r[2] for r in rows), "train_s": statistics.median(r[3] for r in rows),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="timed steps per case (median)")
    parser.add_argument("--warmup", type=int, default=4, help="untimed steps first (a multiple of 4, for TRL)")
    parser.add_argument("--engine", default="vllm", choices=("vllm", "hf"))
    parser.add_argument("--threads", type=int, default=None, help="accepted for `python -m bench`; unused: each "
                        "case takes the run's own thread default")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.steps < 4 or args.steps % 4 or args.warmup % 4:
        raise ValueError("--steps and --warmup must be multiples of 4 (TRL's optimizer steps per generation)")
    os.environ.setdefault("WANDB_MODE", "disabled")
    t_start = time.perf_counter()
    path = default_model()
    cases = measure(path, args)
    limit = ceiling(cases["k=0"], cases[SHARE])
    summary = targets(cases, args.engine, limit)
    report(cases, summary, limit, args)
    meta = {
        **base_meta(torch.get_num_threads(), args.steps, args.warmup, reused=False),
        "threads": None,  # each case takes the run's own default (module docstring)
        "model": path, "engine": args.engine, "shape": SHAPE.__dict__, "cores": os.cpu_count(),
        "wall_s": time.perf_counter() - t_start,
    }  # fmt: skip
    rows = [{"case": name, **r} for name, r in cases.items()]
    print(f"wrote {write_results('async_step', meta, rows, summary, args.out)} ({meta['wall_s']:.0f} s)")


def measure(path: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Each case's medians: k = 0, 1, 2 at the run's thread default, k = 0 with the trainer on its asynchronous
    share of the cores (the ceiling's one-core costs), and TRL (when installed)."""
    cases: dict[str, dict[str, float]] = {}
    for k in (0, 1, 2):
        rows = run_harness(
            path, args.engine, args.steps, args.warmup, None, args.seed, SHAPE,
            overrides=(f"trainer.max_staleness={k}",),
        )  # fmt: skip
        cases[f"k={k}"] = medians(rows)
    rows = run_harness(
        path, args.engine, args.steps, args.warmup, async_trainer_threads(), args.seed, SHAPE,
        overrides=("trainer.max_staleness=0",),
    )  # fmt: skip
    cases[SHARE] = medians(rows)
    # TRL with torch's own default, every core: an asynchronous harness run above left the process at its half
    torch.set_num_threads(os.cpu_count() or 1)
    trl_rows = run_trl(path, args.steps, args.warmup, args.seed, SHAPE)
    if trl_rows is not None:
        seconds = sum(r[0] for r in trl_rows)
        tokens = sum(r[1] for r in trl_rows)
        cases["trl"] = {"step_s": seconds / (len(trl_rows) / SHAPE.updates), "tok_s": tokens / seconds}
    return cases


def targets(cases: dict[str, dict[str, float]], engine: str, limit: float) -> list[dict]:
    """The summary rows: k = 1 over sync (with the ceiling), and the best harness case over TRL."""
    speedup = cases["k=0"]["step_s"] / cases["k=1"]["step_s"]
    case = f"async k=1 vs sync, {engine}, 32x8x24, 4 updates"
    summary = [summary_row("B6", case, "step rate ratio", speedup, f">= {TARGETS['async']:g}")]
    summary[0]["ceiling"] = round(limit, 4)
    if "trl" in cases:
        best = max(cases[c]["tok_s"] for c in ("k=0", "k=1", "k=2"))
        case = "harness (best of k=0,1,2) vs TRL GRPOTrainer, 32x8x24, 4 updates"
        summary.append(
            summary_row("B6", case, "tokens/s ratio", best / cases["trl"]["tok_s"], f">= {TARGETS['trl']:g}")
        )
    return summary


def report(cases: dict[str, dict[str, float]], summary: list[dict], limit: float, args: argparse.Namespace) -> None:
    sync = cases["k=0"]
    print(f"{'case':<21} {'step s':>7} {'gen s':>6} {'train s':>7} {'tokens/s':>9} {'vs sync':>8}")
    for name, r in cases.items():
        ratio = sync["step_s"] / r["step_s"]
        print(f"{name:<21} {r['step_s']:>7.3f} {r.get('gen_s', float('nan')):>6.3f} "
              f"{r.get('train_s', float('nan')):>7.3f} {r['tok_s']:>9.0f} {ratio:>8.2f}")  # fmt: skip
    if "trl" not in cases:
        print("trl is not installed (pip install -e '.[bench]'): the TRL row is missing")
    for row in summary:
        print(f"B6 {row['case']}: {row['value']:.2f} (target {row['target']})")
    over_trl = f", so at most {sync['tok_s'] * limit / cases['trl']['tok_s']:.2f}x TRL" if "trl" in cases else ""
    print(
        f"B6 ceiling of k > 0 over sync on these {os.cpu_count()} cores: {limit:.2f}{over_trl} (perfect overlap, "
        "free switching of cores; from the k=0 rows, module docstring)"
    )
    print(
        f"median over {args.steps} steps after {args.warmup} warm-up steps; gen s: the time a step waited for or "
        "made its batch (perf/rollout_s), train s: its updates and weight sync or publish (perf/train_s)"
    )


def ceiling(every_core: dict[str, float], share: dict[str, float]) -> float:
    """The most a k > 0 step can gain over the synchronous one (module docstring): `every_core` and `share` are the
    synchronous loop's medians with the trainer on every core and on its asynchronous share of them."""
    e1, u1, u2 = share["gen_s"], share["train_s"], every_core["train_s"]
    other = every_core["step_s"] - every_core["gen_s"] - u2
    return every_core["step_s"] / (e1 + u2 * max(0.0, 1 - e1 / u1) + other)


if __name__ == "__main__":  # vLLM spawns helpers that re-import this module
    main()
