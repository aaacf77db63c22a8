"""A sanity-style training pool: the problems a given model solves some of the time (DPPO section 5).

DPPO's sanity test trains on 1,460 MATH problems the starting model already solves sometimes, so a stable
objective drives training reward towards 1 and a collapse is unambiguous. Here the same filter is applied to the
arith train split: a pass-rate file, measured once per model with `python -m harness.tasks.pool`, holds each
problem's warm-start pass rate, and `data.pool_path` + `data.pool_min` / `data.pool_max` keep the problems whose
rate lies in [pool_min, pool_max]. The file is read where the training set is loaded, so the trainer needs no
change; it names the model it was measured on, and the pool never touches the held-out benchmark.

File layout (JSON): {"model": <model folder name>, "samples": n, "max_new_tokens": t, "temperature": T,
"pass_rate": {problem_id: correct / n}}.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from harness.tasks.arith import Problem


def load_pass_rates(path: str | Path) -> dict[str, float]:
    """problem id -> pass rate from a pass-rate file (module docstring)."""
    try:
        data = json.loads(Path(path).expanduser().read_text())
        rates = data["pass_rate"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"data.pool_path: {path!r} is not a readable pass-rate file ({exc})") from None
    return {str(k): float(v) for k, v in rates.items()}


def filter_pool(problems: Sequence[Problem], rates: dict[str, float], low: float, high: float) -> list[Problem]:
    """The problems whose measured pass rate lies in [low, high]; problems without a rate are dropped."""
    if not 0.0 <= low <= high <= 1.0:
        raise ValueError(f"data.pool_min/pool_max: need 0 <= pool_min <= pool_max <= 1, got {low}, {high}")
    kept = [p for p in problems if low <= rates.get(p.id, -1.0) <= high]
    if not kept:
        raise ValueError(f"data.pool_path: no training problem has a pass rate in [{low}, {high}]")
    return kept


def measure_pass_rates(
    model_path: str, problems: Sequence[Problem], samples: int, max_new_tokens: int, seed: int = 0, batch: int = 64
) -> dict[str, float]:
    """Each problem's pass rate over `samples` T=1 completions of the model at `model_path` (HF engine, fp32),
    graded as in training (a truncated completion is wrong)."""
    import torch

    from harness.rewards import grade
    from harness.rollout.hf import HFEngine
    from harness.tasks import render_prompts

    engine = HFEngine(model_path, torch.float32, seed=seed)
    rates: dict[str, float] = {}
    for start in range(0, len(problems), batch):
        chunk = list(problems[start : start + batch])
        prompts = render_prompts(engine.tokenizer, chunk, "chat")
        ro = engine.generate(prompts, n=samples, max_new_tokens=max_new_tokens, seed=seed * 1_000_003 + start)
        answers = [chunk[int(g)].answer for g in ro.group]
        graded = grade(ro.texts, answers, ro.finished.tolist(), workers=1)
        for i, p in enumerate(chunk):
            rates[p.id] = sum(graded.rewards[i * samples : (i + 1) * samples]) / samples
    return rates


def main(argv: Sequence[str] | None = None) -> None:
    """Measure the warm-start pass rates of the training split and write the pass-rate file."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--out", required=True, help="pass-rate JSON file to write")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides selecting model/data (default: model=tiny)")
    args = parser.parse_args(argv)

    import torch

    from harness.config import compose, validate
    from harness.tasks import load_training_set
    from harness.train import model_dir

    torch.set_num_threads(1)
    cfg = validate(compose("logger=none", *args.overrides))
    path = model_dir(cfg)
    train = load_training_set(cfg.data)
    rates = measure_pass_rates(str(path), train, args.samples, args.max_new_tokens)
    out = {
        "model": Path(path).name,
        "samples": args.samples,
        "max_new_tokens": args.max_new_tokens,
        "temperature": 1.0,
        "pass_rate": rates,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=0, sort_keys=True))


if __name__ == "__main__":
    main()
