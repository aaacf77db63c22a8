"""Evaluation on a benchmark with the rollout engine: avg@n, pass@k, maj@n, per-kind and per-problem results.

- avg@n: mean accuracy over n samples per problem (the papers' Avg@32 / avg@16); equal to pass@1.
- pass@k: the unbiased estimator 1 - C(n-c, k)/C(n, k) (Chen et al. 2021, eq. 1), reported for k = 1, 2, 4, ...
  below n, and n.
- maj@n: the answer most samples agree on is graded. Votes are grouped by answer text with whitespace and `$`
  removed and integers written without leading zeros; samples graded correct all equal the gold answer, so they
  form one group. Samples without a parsable answer do not vote. A tie goes to the answer seen first.

The record written to eval.jsonl holds these scores and, under "problems", one row per problem:
``{"id", "kind", "answer" (gold), "n", "correct" (count), "maj" (the voted answer or null), "maj_correct",
"predictions" (the n extracted answers, null where none, cut to PREDICTION_CHARS)}``.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from math import comb
from typing import TYPE_CHECKING, Any

from harness.config import RunConfig
from harness.loop.export import export_or_warn
from harness.lora import engine_state_dict
from harness.reward_model import evaluate_rm
from harness.rewards import GradeResult, grade
from harness.rollout.base import EvalSettings, sample_eval

if TYPE_CHECKING:
    from harness.loop.state import Run

PREDICTION_CHARS = 200  # a per-problem prediction longer than this is cut in eval.jsonl (votes use all of it)
_INT_RE = re.compile(r"^[+-]?\d+$")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n (c correct) is correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_ks(n: int) -> list[int]:
    """The k reported for n samples: powers of two below n, then n."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return [*ks, n]


def vote_key(answer: str) -> str:
    """What majority voting compares: no whitespace or `$`, integers without leading zeros or sign `+`."""
    key = "".join(answer.split()).strip("$")
    return str(int(key)) if _INT_RE.match(key) else key


def majority(predictions: Sequence[str | None], correct: Sequence[bool]) -> tuple[str | None, bool]:
    """(voted answer, whether it is correct) for one problem's samples; see the module docstring."""
    votes: Counter[str] = Counter()
    first: dict[str, str] = {}
    right_key = None
    for pred, ok in zip(predictions, correct, strict=True):
        if pred is None:
            continue
        key = vote_key(pred)
        if ok:
            right_key = key = right_key or key  # every correct sample joins the first correct one's group
        votes[key] += 1
        first.setdefault(key, pred)
    if not votes:
        return None, False
    key = max(votes, key=lambda k: votes[k])  # max keeps the first of equal counts; Counter keeps first-seen order
    return first[key], key == right_key


def evaluate(
    engine: Any,
    prompt_ids: Sequence[list[int]],
    problems: Sequence[Any],
    s: EvalSettings,
    grading: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Sample n completions per problem and grade them -> (record, samples).

    record: {"avg@n", "pass@k"..., "maj@n", "acc/<kind>"..., "problems": [...], ...} (module docstring);
    samples: the first completion of the first `s.samples_to_keep` problems. `grading`: keyword arguments of
    `rewards.grade` (fallback pattern, time limit, workers). `s.truncate_prompts`: prompts longer than the
    engine's `max_model_len - max_new_tokens` keep their last tokens (counted in "prompt_truncated_frac");
    otherwise such a prompt is a ValueError."""
    ro, n_cut = sample_eval(engine, prompt_ids, s)
    n = s.n
    answers = [problems[int(g)].answer for g in ro.group]
    graded = grade(ro.texts, answers, ro.finished.tolist(), **dict(grading or {}))

    rows, correct_counts, maj_hits, by_kind = per_problem(problems, ro.group.tolist(), graded, n)
    m = len(problems)
    record: dict[str, Any] = {
        f"avg@{n}": sum(graded.correct) / len(graded.correct),
        **{f"pass@{k}": sum(pass_at_k(n, c, k) for c in correct_counts) / m for k in pass_ks(n)},
        f"maj@{n}": sum(maj_hits) / m,
        "n_problems": m,
        "response_len_mean": float(ro.mask.sum(1).float().mean()),
        "truncated_frac": float((~ro.finished).float().mean()),
        "prompt_truncated_frac": n_cut / m,
        **{f"acc/{kind}": sum(v) / len(v) for kind, v in sorted(by_kind.items())},
        **{k.replace("reward/", ""): v for k, v in graded.metrics.items()},
        "problems": rows,
    }
    samples = [
        {
            "id": problems[int(ro.group[i])].id,
            "question": problems[int(ro.group[i])].question,
            "completion": ro.texts[i],
            "answer": answers[i],
            "prediction": graded.extracted[i],
            "correct": graded.correct[i],
        }
        for i in range(0, len(ro.texts), max(1, n))[: s.samples_to_keep]
    ]
    return record, samples


def per_problem(
    problems: Sequence[Any], group: list[int], graded: GradeResult, n: int
) -> tuple[list[dict[str, Any]], list[int], list[bool], dict[str, list[float]]]:
    """Each problem's row (its samples' predictions, the majority answer), its number of correct samples, whether
    the majority is right, and its accuracy filed under its kind."""
    by_problem: dict[int, list[int]] = defaultdict(list)  # problem index -> its sample indices
    for i, g in enumerate(group):
        by_problem[g].append(i)
    rows, correct_counts, maj_hits = [], [], []
    by_kind: dict[str, list[float]] = defaultdict(list)
    for p_index, p in enumerate(problems):
        idx = by_problem[p_index]
        preds = [graded.extracted[i] if not graded.format_fail[i] else None for i in idx]
        hits = [graded.correct[i] for i in idx]
        maj, maj_ok = majority(preds, hits)
        c = sum(hits)
        correct_counts.append(c)
        maj_hits.append(maj_ok)
        kind = getattr(p, "kind", "all")
        by_kind[kind].append(c / n)
        rows.append(
            {
                "id": p.id,
                "kind": kind,
                "answer": p.answer,
                "n": n,
                "correct": c,
                "maj": maj,
                "maj_correct": maj_ok,
                "predictions": [None if x is None else x[:PREDICTION_CHARS] for x in preds],
            }
        )
    return rows, correct_counts, maj_hits, by_kind


def eval_settings(cfg: RunConfig, step: int, tiny_model: bool) -> EvalSettings:
    """The evaluation's sampling and logging settings, the same in training (`eval_step`) and in `mode=eval`: the
    seed follows the step, so evaluating checkpoint k samples as training's evaluation at step k did."""
    return EvalSettings(
        seed=cfg.seed * 1_000_003 + step,
        n=cfg.eval.n,
        max_new_tokens=cfg.eval.max_new_tokens or cfg.trainer.max_new_tokens,
        temperature=cfg.eval.temperature,
        top_p=cfg.eval.top_p,
        samples_to_keep=cfg.trainer.samples_per_eval,
        truncate_prompts=cfg.eval.cut_prompts(tiny_model=tiny_model),
    )


def eval_step(run: Run, step: int) -> dict[str, float]:
    """Evaluate on the benchmark (rank 0, logged there); every rank gets the record. Updates `best`/`last_eval`."""
    cfg = run.cfg
    if cfg.eval.engine == "policy":  # a collective under FSDP2, as sync_weights
        state = run.ranks.full_state_dict(run.policy)
        if run.evaluator is not None:
            run.evaluator.sync_weights(engine_state_dict(run.policy, state))
    engine = run.evaluator if run.evaluator is not None else run.engine

    def on_main() -> dict[str, float]:
        common = eval_settings(cfg, step, tiny_model=cfg.model.path is None)
        if run.scorer is not None:  # RLHF: the reward model's mean score on held-out prompts
            record, samples = evaluate_rm(engine, run.eval_prompts, run.eval_set, run.scorer, common)
        else:
            record, samples = evaluate(
                engine, run.eval_prompts, run.eval_set, common, grading=cfg.reward.grade_kwargs()
            )
        run.log.log_eval(step, {"benchmark": cfg.benchmark.name, **record})
        run.log.log_samples(step, samples)
        run.clipped.write_table(run.run_dir / "clipped_tokens.csv", run.tokenizer.decode)
        return record

    record = run.ranks.from_main(on_main)
    score = record[run.score_key]
    run.best = score if run.best is None else max(run.best, score)
    run.last_eval = record
    if step >= 1 and (run.best_exported is None or score > run.best_exported):  # every rank: the export gathers
        if export_or_warn(run, "best", step, score) is not None:
            run.best_exported = score
    return record
