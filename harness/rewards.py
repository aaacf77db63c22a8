"""Grading completions against gold answers with math-verify, under a hard per-completion time limit.

Rules (reference/tiny-learnability.md):
- A truncated completion (``finished`` False) earns ``wrong`` without being parsed; otherwise RL learns to
  stop emitting the end token.
- With ``require_boxed`` (default) only the content of the last complete top-level ``\\boxed{...}`` is graded.
  math-verify without an anchor accepts a bare ``42`` or ``6*7=42`` anywhere in the text.
- ``fallback_pattern`` (optional, e.g. ``Answer:\\s*(.+)`` for DAPO-style prompts): when a completion has no
  complete box, the last match of this regex in its final ``FALLBACK_TAIL_CHARS`` characters is graded instead
  (group 1 if the pattern has a group, else the whole match). The regex runs in the calling process on that
  bounded tail, so a pattern without nested quantifiers costs microseconds.
- Only math-verify's LaTeX extraction is used: its plain-expression extraction runs sympy's ``parse_expr``,
  which evaluates Python code, and model text must never be executed.

Time limits: harness/grading.py runs math-verify under a hard per-completion limit.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

from harness.grading import BAD_GOLD, CORRECT, NO_ANSWER, TIMEOUT, WRONG, grade_jobs

# Box contents longer than this are counted as unparsable without trying: no answer in this harness is that
# long, and parsing junk of that size would spend the whole time limit on every such completion.
MAX_BOX_CHARS = 1000
# The fallback pattern only looks at the end of a completion, where a final answer is written.
FALLBACK_TAIL_CHARS = 1000

# `\{` and `\}` are literal braces in LaTeX; matching them first keeps them out of the depth count.
_BOX_TOKEN_RE = re.compile(r"\\[{}]|\\boxed\s*\{|\{|\}")

# ASCII only: `\d` and `\s` would also match characters int() rejects (a model emitted "\x1f30" once).
_INT = re.compile(r"[ ]*[+-]?[0-9]{1,30}[ ]*")


@dataclass
class GradeResult:
    rewards: list[float]
    correct: list[bool]
    format_fail: list[bool]
    """No parsable answer: no complete ``\\boxed{}`` (when required), an empty or over-long box, or one
    math-verify cannot parse. Truncated completions are not parsed and are not counted here."""
    timed_out: list[bool]
    """Parse + verify overran ``timeout_s`` (or the worker process died); graded ``wrong``."""
    extracted: list[str | None]
    """The text that was graded (box content or fallback match), None for truncated or answerless completions:
    what majority voting counts."""
    metrics: dict[str, float]
    """``reward/format_fail_frac``, ``reward/timeout_frac``, ``reward/truncated_frac`` (fractions of all)."""
    processes: int = 0
    """Worker processes that graded at least one completion (0: all graded in this process)."""


def grade(
    completions: list[str],
    answers: list[str],
    finished: list[bool] | None = None,
    *,
    require_boxed: bool = True,
    fallback_pattern: str | None = None,
    timeout_s: float = 5.0,
    correct: float = 1.0,
    wrong: float = 0.0,
    workers: int = 1,
) -> GradeResult:
    """Grade each completion against its gold answer (a LaTeX string such as ``42`` or ``\\frac{1}{2}``).

    ``finished[i]`` False marks a truncated completion (reward ``wrong``). ``timeout_s`` limits parse + verify of
    one completion. ``workers > 1`` grades in that many processes in parallel, ``0`` in one per core, ``1`` in
    this process (with signal.alarm limits when on the main thread). ``fallback_pattern``: see the
    module docstring."""
    n = len(completions)
    if len(answers) != n or (finished is not None and len(finished) != n):
        raise ValueError(
            f"grade: completions ({n}), answers ({len(answers)}) and finished "
            f"({'None' if finished is None else len(finished)}) must have the same length"
        )
    if not (isinstance(timeout_s, int | float) and math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"grade: timeout_s must be a positive number of seconds, got {timeout_s!r}")
    workers = _worker_count(workers, "grade")
    truncated = [finished is not None and not finished[i] for i in range(n)]
    codes, extracted, jobs = _triage(completions, answers, truncated, require_boxed, compile_fallback(fallback_pattern))
    processes = 0
    if jobs:
        results, processes = grade_jobs(jobs, timeout_s, workers)
        for i, code in results.items():
            if code == BAD_GOLD:
                raise ValueError(f"grade: gold answer {answers[i]!r} (index {i}) is not parsable by math-verify")
            codes[i] = code

    def frac(flags: list[bool]) -> float:
        return sum(flags) / n if n else 0.0

    format_fail = [c == NO_ANSWER for c in codes]
    timed_out = [c == TIMEOUT for c in codes]
    return GradeResult(
        rewards=[correct if c == CORRECT else wrong for c in codes],
        correct=[c == CORRECT for c in codes],
        format_fail=format_fail,
        timed_out=timed_out,
        extracted=extracted,
        metrics={
            "reward/format_fail_frac": frac(format_fail),
            "reward/timeout_frac": frac(timed_out),
            "reward/truncated_frac": frac(truncated),
        },
        processes=processes,
    )


def _triage(
    completions: list[str],
    answers: list[str],
    truncated: list[bool],
    require_boxed: bool,
    fallback: re.Pattern[str] | None,
) -> tuple[list[int], list[str | None], list[tuple[int, str, str]]]:
    """What each completion needs: a code where it is settled here (no answer; an integer against an integer),
    else a math-verify job (index, the text handed to it, gold). Returns (codes, extracted answers, jobs)."""
    codes = [WRONG] * len(completions)
    extracted: list[str | None] = [None] * len(completions)
    jobs: list[tuple[int, str, str]] = []
    for i, text in enumerate(completions):
        if truncated[i]:
            continue
        target = last_boxed(text) if require_boxed else text
        if target is None and fallback is not None:
            target = _fallback_match(fallback, text)
        if target is None or not target.strip() or (require_boxed and len(target) > MAX_BOX_CHARS):
            codes[i] = NO_ANSWER
            continue
        extracted[i] = target
        if require_boxed and _INT.fullmatch(target) and _INT.fullmatch(str(answers[i])):
            # Integer against integer (every AIME and arith answer): math-verify would compare the same numbers
            # (it also accepts "042" for 42), at ~4 ms a call through latex2sympy; this takes microseconds.
            codes[i] = CORRECT if int(target.strip(" ")) == int(str(answers[i]).strip(" ")) else WRONG
            continue
        jobs.append((i, f"\\boxed{{{target}}}" if require_boxed else target, str(answers[i])))
    return codes, extracted, jobs


def gradable(answers: list[str], *, timeout_s: float = 5.0, workers: int = 1) -> list[bool]:
    """Whether each gold answer is usable by ``grade``: math-verify parses it and a completion boxing it is
    graded correct within ``timeout_s``. Training-set loaders drop problems whose answer is not."""
    jobs: list[tuple[int, str, str]] = []
    for i, answer in enumerate(answers):
        target = last_boxed(f"\\boxed{{{answer}}}")  # exactly what grading would extract from such a box
        if target is not None and target.strip() and len(target) <= MAX_BOX_CHARS:
            jobs.append((i, f"\\boxed{{{target}}}", str(answer)))
    if not jobs:
        return [False] * len(answers)
    workers = _worker_count(workers, "gradable")
    results, _ = grade_jobs(jobs, timeout_s, workers)
    return [results.get(i) == CORRECT for i in range(len(answers))]


def _worker_count(workers: object, where: str) -> int:
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
        raise ValueError(f"{where}: workers must be an integer >= 0 (0 = one per core), got {workers!r}")
    return workers or os.cpu_count() or 1


def compile_fallback(pattern: str | None) -> re.Pattern[str] | None:
    """The fallback answer regex, compiled; a ValueError naming it if it is not a valid regex."""
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as e:
        raise ValueError(f"fallback answer pattern {pattern!r} is not a valid regular expression: {e}") from None


def _fallback_match(regex: re.Pattern[str], text: str) -> str | None:
    last = None
    for match in regex.finditer(text[-FALLBACK_TAIL_CHARS:]):
        last = match
    if last is None:
        return None
    answer = (last.group(1) if regex.groups else last.group(0)) or ""
    # "Answer: $42$." -> "42": math delimiters and a closing full stop are not part of the answer.
    return answer.strip().rstrip(".").strip().strip("$").strip() or None


def last_boxed(text: str) -> str | None:
    """Content of the ``\\boxed{...}`` that closes last, None if no box closes. A box enclosing another closes
    after it, so this is always an outermost box; a box that never closes is ignored (``\\boxed{ \\boxed{42}``
    gives ``42``). One linear pass: adversarial runs of unclosed boxes cost O(len(text))."""
    stack: list[tuple[bool, int]] = []  # (opens a box, index just after its "{")
    last: str | None = None
    for m in _BOX_TOKEN_RE.finditer(text):
        token = m.group()
        if token == "{" or token.startswith("\\boxed"):
            stack.append((token != "{", m.end()))
        elif token == "}" and stack:
            is_box, start = stack.pop()
            if is_box:
                last = text[start : m.start()]
    return last
