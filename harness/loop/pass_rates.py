"""Measure a model's warm-start pass rate on every arith training problem and write the pass-rate file that
`data.pool_path` reads (harness/tasks/pool.py describes the file and the filter):

    python -m harness.loop.pass_rates --out pass_rates.json [--samples 8] [Hydra overrides, e.g. model=tiny]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from harness.config import compose, validate
from harness.loop.model_path import model_dir
from harness.rewards import grade
from harness.rollout.hf import HFEngine
from harness.tasks import load_training_set, render_prompts
from harness.tasks.arith import Problem


def measure_pass_rates(
    model_path: str, problems: Sequence[Problem], samples: int, max_new_tokens: int, seed: int = 0, batch: int = 64
) -> dict[str, float]:
    """Each problem's pass rate over `samples` T=1 completions of the model at `model_path` (HF engine, fp32),
    graded as in training (a truncated completion is wrong)."""

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
