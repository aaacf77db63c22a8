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

import logging
import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from math import comb
from typing import Any

from harness.rewards import grade

logger = logging.getLogger(__name__)

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
    *,
    n: int,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    top_p: float = 1.0,
    samples_to_keep: int = 0,
    grading: Mapping[str, Any] | None = None,
    truncate_prompts: bool = False,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Sample n completions per problem and grade them -> (record, samples).

    record: {"avg@n", "pass@k"..., "maj@n", "acc/<kind>"..., "problems": [...], ...} (module docstring);
    samples: the first completion of the first `samples_to_keep` problems. `grading`: keyword arguments of
    `rewards.grade` (fallback pattern, time limit, workers). `truncate_prompts`: prompts longer than the
    engine's `max_model_len - max_new_tokens` keep their last tokens (counted in "prompt_truncated_frac");
    otherwise such a prompt is a ValueError."""
    prompts, n_cut = fit_prompts(prompt_ids, getattr(engine, "max_model_len", None), max_new_tokens, truncate_prompts)
    ro = engine.generate(
        prompts, n=n, max_new_tokens=max_new_tokens, topk=1, temperature=temperature, seed=seed, top_p=top_p,
        progress=eval_label(len(prompts), n),
    )  # fmt: skip
    answers = [problems[int(g)].answer for g in ro.group]
    graded = grade(ro.texts, answers, ro.finished.tolist(), **dict(grading or {}))

    by_problem: dict[int, list[int]] = defaultdict(list)  # problem index -> its sample indices
    for i, g in enumerate(ro.group.tolist()):
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
        for i in range(0, len(ro.texts), max(1, n))[:samples_to_keep]
    ]
    return record, samples


def eval_label(problems: int, n: int) -> str:
    """The evaluation's progress bar label (harness.rollout.base.progress_bar: shown on a terminal only)."""
    return f"eval {problems} problems x {n}"


def fit_prompts(
    prompt_ids: Sequence[list[int]], max_model_len: int | None, max_new_tokens: int, truncate: bool
) -> tuple[list[list[int]], int]:
    prompts = [list(p) for p in prompt_ids]
    if max_model_len is None:
        return prompts, 0
    room = max_model_len - max_new_tokens
    too_long = sum(len(p) > room for p in prompts)
    if not too_long:
        return prompts, 0
    longest = max(len(p) for p in prompts)
    if not truncate or room < 1:
        raise ValueError(
            f"eval: {too_long} prompt(s) up to {longest} tokens do not fit model.max_model_len={max_model_len} "
            f"minus max_new_tokens={max_new_tokens}; raise model.max_model_len or set eval.truncate_prompts=true"
        )
    logger.warning(
        "eval: %d of %d prompts (up to %d tokens) cut to their last %d tokens to fit model.max_model_len=%d",
        too_long, len(prompts), longest, room, max_model_len,
    )  # fmt: skip
    return [p[-room:] if len(p) > room else p for p in prompts], too_long
