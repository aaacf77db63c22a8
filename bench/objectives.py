"""B5: every objective's RL step time on one batch, against GRPO, with the tiny model on CPU.

Run: ``python -m bench.objectives [--reps 20] [--warmup 1] [--threads 1] [--model DIR]``

Why the tiny model and not shared logits: B2 already times the loss path from logits, where a 151936-token
vocabulary makes the log-prob pass dwarf any objective. Here the model is ~2.6M parameters with a ~1k vocabulary
(the one the CPU runs train), so the objective, its input checks, its metrics and their host syncs are a large
share of the step: the harshest honest setting for "an objective costs no more than GRPO".

Batch: a step of 4 prompts x 8 samples (<= 24 new tokens, the trainer's default length) in 4 mini-batches of
8 rows. The trainer's default step is 32 prompts x 8; one of its 64-row mini-batch updates takes ~1-2 s here, and
23 variants x (3 + 20) runs of that would take ~15 minutes, so the step is scaled down. A smaller mini-batch only
makes the comparison harsher: the model's cost shrinks with the rows, an objective's fixed per-call cost does
not. Random prompts are sampled by harness's HF rollout engine with top-20 log-probs (the real Rollout layout),
rewards are random 0/1 per sequence, advantages Dr.GRPO, and the policy's weights are perturbed slightly so
pi != mu and the trust regions have something to clip or mask.

What is timed, per objective, is one mini-batch update exactly as harness/loop/step.py runs it: ``policy_logprobs``
(packed forward with grad; with the top-K gather when the objective needs it), the objective, ``aggregate``,
``zero_grad``, ``backward``, ``clip_grad_norm_`` and ``float()`` of every metric, the loss and the grad norm.
The optimizer step is left out so every rep sees the same weights (AdamW costs the same for every objective).
Objectives anchored on pi_old (``anchor: old``) also need the trainer's no-grad recompute over the whole step's
batch, once per step; it is timed as its own variant and added to their step time:
``step = minibatches * update (+ recompute)``.

Timing: bench.common (all variants in each rep, rotating order; warm-up, then medians), wall and process CPU
time both recorded. The target is judged on CPU time: on this shared 2-core box the wall-time medians of a
~100 ms update spread by about +-10% from other jobs' load alone (pg_is, which does less than GRPO, measured
0.89x), more than the objectives differ; the objective itself costs ~1-2 ms of CPU next to a ~100 ms model
forward+backward. On an idle machine the two clocks agree (one thread, no I/O). Even CPU time varies by a few
% under load (shared caches), so each objective is also timed alone, from a log-prob leaf through aggregate,
backward and the metric reads, over 100 reps: ``obj +%`` is its cost beyond GRPO's as a share of GRPO's whole
update, the part of the step ratio that is the objective's own doing. The summary's ratio is paired: per rep,
the objective's CPU time over GRPO's in the same rep, median over reps (``paired``); the ratio of the two
medians is in the table beside it.
Target (issue B5, performance.md B4): each objective's step time <= 1.05x GRPO's. For ``anchor: old`` the
summary also has the update alone: their step carries one extra no-grad forward over the batch by definition
(pi_old must be measured before the first update), which the step ratio shows and the objective cannot avoid.
Writes bench/results/objectives.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench.common import base_meta, interleaved_samples, reuse_freed_memory, summary_row, write_results
from harness.advantages import compute_advantages
from harness.batch import TrainBatch, build_batch, objective_inputs, policy_logprobs
from harness.logprobs import LogProbOutput
from harness.models import load_policy
from harness.objectives import OBJECTIVE_NAMES, Objective, aggregate, get_objective
from harness.rollout import make_engine

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
PROMPTS, GROUP, MAX_NEW_TOKENS, MINIBATCHES = 4, 8, 24, 4  # the defaults are 32, 8, 24, 4 (see the docstring)
AGG = "seq-mean-token-sum-norm"
RECOMPUTE = "pi_old recompute"
OBJECTIVE_ONLY_REPS = 100
WEIGHT_NOISE = 0.02  # relative: enough for ratios of ~0.9-1.1 and some masked tokens


def find_tiny_model() -> Path:
    """The tiny model the default config trains (conf/config.yaml, model=tiny): cached, or built once as the
    trainer would. Resolved through the config, not by globbing the cache, which holds other builds too."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from harness.config import register_schemas, validate
    from harness.loop.model_path import model_dir

    register_schemas()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config")
    return Path(model_dir(validate(OmegaConf.to_container(cfg, resolve=False))))


def make_batch(model_path: Path, seed: int) -> TrainBatch:
    engine = make_engine("hf", str(model_path), "fp32", seed, max_model_len=512, max_topk=20, device="cpu")
    try:
        gen = torch.Generator().manual_seed(seed)
        vocab = engine.model.config.vocab_size
        # Random prompts of 8-16 tokens (an arithmetic question's length); ids from 16 up keep clear of the
        # tiny tokenizer's special tokens.
        lengths = torch.randint(8, 17, (PROMPTS,), generator=gen).tolist()
        prompts = [torch.randint(16, vocab, (n,), generator=gen).tolist() for n in lengths]
        ro = engine.generate(prompts, GROUP, MAX_NEW_TOKENS, topk=20, temperature=1.0, seed=seed)
        pad_id = engine.pad_id
    finally:
        engine.close()
    rewards = torch.randint(0, 2, (len(ro.group),), generator=gen).float()
    adv, _ = compute_advantages(rewards, ro.group, "drgrpo")
    return build_batch(ro, adv, pad_id, topk=20)


def update_run(
    policy: torch.nn.Module, obj: Objective, mb: TrainBatch, old_logp: torch.Tensor, horizon: float
) -> Callable[[], None]:
    """One mini-batch update as harness/loop/step.py does it, without the optimizer step."""
    mb_old = old_logp if obj.needs_old else None

    def run() -> None:
        lp = policy_logprobs(policy, mb, 1.0, with_topk=obj.topk > 1)
        entropy = float((lp.entropy * mb.mask).sum() / mb.mask.sum().clamp(min=1))
        out = obj(**objective_inputs(mb, lp.logp, lp.topk_logp, mb_old))
        loss = aggregate(out.loss_mat, mb.mask, AGG, horizon)
        policy.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        {key: float(v) for key, v in out.metrics.items()}
        float(loss.detach()), float(grad_norm), entropy

    return run


def objective_run(
    obj: Objective, mb: TrainBatch, lp: LogProbOutput, old_logp: torch.Tensor, horizon: float
) -> Callable[[], None]:
    """The objective alone: from a log-prob leaf (no model) through aggregate, backward and the metric reads."""
    mb_old = old_logp if obj.needs_old else None
    topk_logp = lp.topk_logp if obj.topk > 1 else None

    def run() -> None:
        logp = lp.logp.detach().clone().requires_grad_(True)
        out = obj(**objective_inputs(mb, logp, topk_logp, mb_old))
        loss = aggregate(out.loss_mat, mb.mask, AGG, horizon)
        loss.backward()
        {key: float(v) for key, v in out.metrics.items()}
        float(loss.detach())

    return run


def recompute_run(policy: torch.nn.Module, batch: TrainBatch) -> Callable[[], None]:
    def run() -> None:
        with torch.no_grad():
            policy_logprobs(policy, batch, 1.0)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20, help="timed repetitions per variant (median)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per variant first")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the box is shared)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--model", type=Path, default=None, help="model folder (default: the default config's tiny model)"
    )
    parser.add_argument(
        "--reuse-freed-memory",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="raise glibc's mmap/trim thresholds so reps do not re-fault their buffers (bench.common)",
    )
    args = parser.parse_args()
    if args.reps < 1 or args.warmup < 0 or args.threads < 1:
        raise ValueError("--reps and --threads must be >= 1 and --warmup >= 0")
    torch.set_num_threads(args.threads)
    reused = reuse_freed_memory() if args.reuse_freed_memory else False
    torch.manual_seed(args.seed)
    model_path = args.model or find_tiny_model()
    device = torch.device("cpu")

    t0 = time.perf_counter()
    batch = make_batch(model_path, args.seed)
    policy, _ = load_policy(str(model_path))
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * (WEIGHT_NOISE * p.std()))
    with torch.no_grad():
        old_logp = policy_logprobs(policy, batch, 1.0).logp
    # The trainer's first mini-batch: a quarter of a shuffled step, rows with no advantage skipped.
    rows = torch.randperm(len(batch), generator=torch.Generator().manual_seed(args.seed)).chunk(MINIBATCHES)[0]
    rows = rows[(batch.advantages[rows] != 0).any(1)]
    mb = batch.select(rows)
    mb_old = old_logp[rows][:, : mb.mask.shape[1]]
    horizon = float(MAX_NEW_TOKENS)

    objs = {name: get_objective(name) for name in OBJECTIVE_NAMES}
    runs = {name: update_run(policy, obj, mb, mb_old, horizon) for name, obj in objs.items()}
    runs[RECOMPUTE] = recompute_run(policy, batch)
    samples = interleaved_samples(runs, device, args.warmup, args.reps)
    wall = {name: statistics.median(w for w, _ in ts) for name, ts in samples.items()}
    cpu = {name: statistics.median(c for _, c in ts) for name, ts in samples.items()}
    # Paired: each rep's CPU time over GRPO's in the same rep (a few seconds apart), then the median over reps,
    # so load that drifts over the run cancels out of the ratio.
    paired = {
        name: statistics.median(c / g for (_, c), (_, g) in zip(ts, samples["grpo"], strict=True))
        for name, ts in samples.items()
    }
    # The objective's own share, without the model: cheap, so many more reps (a ~1 ms run is noisier).
    with torch.no_grad():
        lp = policy_logprobs(policy, mb, 1.0, with_topk=True)
    obj_runs = {name: objective_run(obj, mb, lp, mb_old, horizon) for name, obj in objs.items()}
    obj_samples = interleaved_samples(obj_runs, device, args.warmup, max(args.reps, OBJECTIVE_ONLY_REPS))
    obj_cpu = {name: statistics.median(c for _, c in ts) for name, ts in obj_samples.items()}

    def step(ms: dict[str, float], obj: Objective) -> float:
        return MINIBATCHES * ms[obj.name] + (ms[RECOMPUTE] if obj.needs_old else 0.0)

    def paired_step_ratio(obj: Objective) -> float:
        # step / grpo step = (M * update + recompute) / (M * grpo update), with both terms relative to grpo.
        return paired[obj.name] + (paired[RECOMPUTE] / MINIBATCHES if obj.needs_old else 0.0)

    print(HEADER, flush=True)
    out_rows = []
    for name, obj in objs.items():
        out_rows.append(
            {
                "objective": name,
                "family": obj.cfg.family,
                "anchor": obj.cfg.anchor,
                "topk": obj.topk,
                "update_ms": wall[name],
                "update_cpu_ms": cpu[name],
                "update_ratio": wall[name] / wall["grpo"],
                "update_cpu_ratio": cpu[name] / cpu["grpo"],
                "objective_cpu_ms": obj_cpu[name],
                # What this objective costs beyond GRPO's, as a share of GRPO's whole update (model included).
                "objective_extra_pct": 100.0 * (obj_cpu[name] - obj_cpu["grpo"]) / cpu["grpo"],
                "recompute_cpu_ms": cpu[RECOMPUTE] if obj.needs_old else 0.0,
                "step_ms": step(wall, obj),
                "step_cpu_ms": step(cpu, obj),
                "step_ratio": step(wall, obj) / step(wall, objs["grpo"]),
                "step_cpu_ratio": step(cpu, obj) / step(cpu, objs["grpo"]),
                "update_cpu_ratio_paired": paired[name],
                "step_cpu_ratio_paired": paired_step_ratio(obj),
                "samples_wall_cpu_ms": samples[name],
            }
        )
        print(format_row(out_rows[-1]), flush=True)
    print(
        f"batch: {len(batch)} rows x T={batch.mask.shape[1]}, mini-batch {len(mb)} rows x T={mb.mask.shape[1]} "
        f"({int(mb.mask.sum())} response tokens); pi_old recompute over the whole batch: {wall[RECOMPUTE]:.1f} ms "
        f"wall, {cpu[RECOMPUTE]:.1f} ms CPU"
    )
    summary = []
    for r in out_rows:
        if r["objective"] == "grpo":
            continue
        summary.append(
            summary_row("B5", r["objective"], "step CPU-time ratio vs grpo", r["step_cpu_ratio_paired"], "<= 1.05")
        )
        if r["anchor"] == "old":  # the objective's own cost, apart from the extra forward its anchor needs
            summary.append(
                summary_row(
                    "B5", r["objective"], "update CPU-time ratio vs grpo", r["update_cpu_ratio_paired"], "<= 1.05"
                )
            )
    meta = {
        **base_meta(args.threads, args.reps, args.warmup, reused),
        "model": str(model_path),
        "batch_rows": len(batch),
        "minibatch_rows": len(mb),
        "minibatch_tokens": int(mb.mask.sum()),
        "minibatches": MINIBATCHES,
        "agg": AGG,
        "wall_s": time.perf_counter() - t0,
    }
    path = write_results("objectives", meta, out_rows, summary)
    print(f"wrote {path} ({meta['wall_s']:.0f} s)")


HEADER = (
    f"{'objective':<18} {'anchor':<8} {'K':>3} {'upd ms':>7} {'upd CPU':>8} {'upd/grpo':>8} {'CPU/grpo':>8} "
    f"{'step CPU':>9} {'step/grpo':>9} {'CPU/grpo':>8} {'paired':>7} {'obj CPU':>8} {'obj +%':>7}"
)


def format_row(r: dict) -> str:
    return (
        f"{r['objective']:<18} {r['anchor']:<8} {r['topk']:>3} {r['update_ms']:>7.1f} {r['update_cpu_ms']:>8.1f} "
        f"{r['update_ratio']:>8.3f} {r['update_cpu_ratio']:>8.3f} {r['step_cpu_ms']:>9.1f} {r['step_ratio']:>9.3f} "
        f"{r['step_cpu_ratio']:>8.3f} {r['step_cpu_ratio_paired']:>7.3f} {r['objective_cpu_ms']:>8.2f} "
        f"{r['objective_extra_pct']:>7.2f}"
    )


if __name__ == "__main__":
    main()
