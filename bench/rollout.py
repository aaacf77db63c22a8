"""B3: rollout throughput, the harness's vLLM engine against its HF ``generate`` engine, and the cost of top-K.

Run: ``python -m bench.rollout [--prompts 64] [--n 8] [--tokens 128] [--hf-reps 1] [--reps 3] [--threads 1]``

Model: bench/tiny32k.py (tiny-preset shape, 32k vocab, random init), fp32, on CPU. Both engines are the
harness's own (``harness.rollout.make_engine``), built in this process from the same folder and called with the
same prompts (arithmetic questions rendered with the chat template), n, max_new_tokens, temperature 1, seed.

Cases (performance.md B3, at tiny scale):
- ``vllm vs hf``: generated tokens/s of ``engine.generate(..., topk=1)``. Generated tokens = the rollout's mask
  sum (EOS included, padding excluded); the time is the whole ``generate`` call, harness post-processing
  included, since that is what a training step pays.
- ``vllm K=20 vs K=1``: time of vLLM ``generate`` with ``topk=20`` over ``topk=1``, same seed.

EOS is not ignored: the engines' contract stops a sample at EOS and neither exposes an ignore-EOS switch. With a
random-init model over 32768 tokens, EOS is sampled with p ~ 3e-5 per token, so nearly every sample runs the full
length on both engines; tokens/s counts only the tokens each engine actually produced.

Timing: a small warm-up call per engine (first-call allocations, vLLM's profiling), then the median of timed
calls; the K=1 and K=20 vLLM calls alternate so load from other processes hits both alike. Repetitions: at this
shape one HF call takes minutes on a 2-core CPU, so the defaults are 1 HF call and 2 calls per vLLM variant,
not the >= 20 of performance.md; the reps used are printed and stored. Threads: torch runs with ``--threads``
(HF generates with it) and vLLM with the harness default of 1 generate thread (rollout.threads).

Targets: vLLM >= 2x HF tokens/s; K=20 costs <= 15% over K=1. Writes bench/results/rollout.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results" / "rollout.json"
SPEEDUP_TARGET = 2.0
TOPK_COST_TARGET = 0.15
TOPK = 20


def timed(call: Callable[[], torch.Tensor]) -> tuple[float, float]:
    """(seconds, generated tokens) of one call that returns a rollout mask."""
    t0 = time.perf_counter()
    mask = call()
    return time.perf_counter() - t0, float(mask.sum())


def prompts_for(tokenizer, count: int) -> list[list[int]]:
    from harness.tasks.arith import ArithConfig, make_splits
    from harness.tasks.templates import render

    train, _ = make_splits(ArithConfig())
    texts = [render(tokenizer, p.question, "chat") for p in train[:count]]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--tokens", type=int, default=32, help="max new tokens (the issue names 128: ~4x the time)")
    parser.add_argument("--hf-reps", type=int, default=1, help="timed HF calls (median)")
    parser.add_argument("--reps", type=int, default=1, help="timed vLLM calls per K (1: make bench in 10 min)")
    parser.add_argument("--warmup-tokens", type=int, default=8, help="length of each engine's warm-up call")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the box is shared)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if min(args.prompts, args.n, args.tokens, args.hf_reps, args.reps, args.threads) < 1:
        raise ValueError("--prompts, --n, --tokens, --hf-reps, --reps and --threads must be >= 1")
    os.environ.setdefault("WANDB_MODE", "disabled")
    torch.set_num_threads(args.threads)

    from bench.tiny32k import build
    from harness.rollout import make_engine

    t_start = time.perf_counter()
    path = str(build())
    max_len = 512
    engines = {
        kind: make_engine(kind, path, "fp32", args.seed, max_len, device="cpu", max_topk=TOPK)
        for kind in ("hf", "vllm")
    }
    prompts = prompts_for(engines["hf"].tokenizer, args.prompts)

    def call(kind: str, topk: int, tokens: int = args.tokens) -> Callable[[], torch.Tensor]:
        return lambda: engines[kind].generate(prompts, args.n, tokens, topk=topk, seed=args.seed + 1).mask

    for kind in engines:
        call(kind, TOPK, args.warmup_tokens)()
    hf = [timed(call("hf", 1)) for _ in range(args.hf_reps)]
    vllm: dict[int, list[tuple[float, float]]] = {1: [], TOPK: []}
    for rep in range(args.reps):
        for k in (1, TOPK) if rep % 2 == 0 else (TOPK, 1):
            vllm[k].append(timed(call("vllm", k)))
    for engine in engines.values():
        engine.close()

    def tok_s(runs: list[tuple[float, float]]) -> float:
        return statistics.median(tokens / s for s, tokens in runs)

    def secs(runs: list[tuple[float, float]]) -> float:
        return statistics.median(s for s, _ in runs)

    shape = f"{args.prompts}x{args.n}x{args.tokens}"
    speedup = tok_s(vllm[1]) / tok_s(hf)
    topk_cost = secs(vllm[TOPK]) / secs(vllm[1]) - 1
    rows = [
        {
            "case": f"vllm vs hf, {shape}",
            "ours": "vllm",
            "baseline": "hf",
            "ours_tok_s": tok_s(vllm[1]),
            "baseline_tok_s": tok_s(hf),
            "ours_s": secs(vllm[1]),
            "baseline_s": secs(hf),
            "ours_reps": len(vllm[1]),
            "baseline_reps": len(hf),
            "generated_tokens": statistics.median(t for _, t in vllm[1]),
            "ratio": speedup,
        },
        {
            "case": f"vllm K={TOPK} vs K=1, {shape}",
            "ours": f"vllm K={TOPK}",
            "baseline": "vllm K=1",
            "ours_tok_s": tok_s(vllm[TOPK]),
            "baseline_tok_s": tok_s(vllm[1]),
            "ours_s": secs(vllm[TOPK]),
            "baseline_s": secs(vllm[1]),
            "ours_reps": len(vllm[TOPK]),
            "baseline_reps": len(vllm[1]),
            "generated_tokens": statistics.median(t for _, t in vllm[TOPK]),
            "ratio": secs(vllm[TOPK]) / secs(vllm[1]),
        },
    ]
    print(f"{'case':<28} {'ours tok/s':>10} {'base tok/s':>10} {'ours s':>8} {'base s':>8} {'reps':>7} {'ratio':>6}")
    for r in rows:
        reps = f"{r['ours_reps']}/{r['baseline_reps']}"
        print(
            f"{r['case']:<28} {r['ours_tok_s']:>10.0f} {r['baseline_tok_s']:>10.0f} {r['ours_s']:>8.2f} "
            f"{r['baseline_s']:>8.2f} {reps:>7} {r['ratio']:>6.2f}"
        )
    print(
        f"ratio: vllm/hf tokens/s (target >= {SPEEDUP_TARGET}); time K={TOPK}/K=1 (target <= {1 + TOPK_COST_TARGET}). "
        f"reps: median of {args.reps} vLLM and {args.hf_reps} HF calls (fewer than 20: one HF call takes minutes)"
    )
    summary = [
        {
            "id": "B3",
            "case": rows[0]["case"],
            "metric": "tokens/s ratio",
            "value": round(speedup, 3),
            "target": f">= {SPEEDUP_TARGET:g}",
            "met": speedup >= SPEEDUP_TARGET,
        },
        {
            "id": "B3",
            "case": rows[1]["case"],
            "metric": f"extra time of K={TOPK} over K=1",
            "value": round(topk_cost, 3),
            "target": f"<= {TOPK_COST_TARGET:g}",
            "met": topk_cost <= TOPK_COST_TARGET,
        },
    ]
    import transformers
    import vllm as vllm_pkg

    meta = {
        "model": path,
        "vocab": 32768,
        "dtype": "fp32",
        "device": "cpu",
        "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "vllm": vllm_pkg.__version__,
        "torch_threads": args.threads,
        "vllm_generate_threads": 1,
        "prompts": args.prompts,
        "n": args.n,
        "max_new_tokens": args.tokens,
        "mean_prompt_tokens": sum(map(len, prompts)) / len(prompts),
        "ignore_eos": False,
        "temperature": 1.0,
        "hf_reps": args.hf_reps,
        "vllm_reps": args.reps,
        "reps_note": "fewer than performance.md's 20: one HF call at this shape takes minutes on a 2-core CPU",
        "wall_s": time.perf_counter() - t_start,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows, "summary": summary}, indent=2) + "\n")
    print(f"wrote {args.out} ({meta['wall_s']:.0f} s)")


if __name__ == "__main__":  # vLLM spawns helpers that re-import this module
    main()
