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

Time limits. math-verify's own timeouts use ``signal.alarm``: whole seconds only, and it raises ValueError off the
main thread (a broad ``except`` then silently turns every reward into 0). We call it with its timeouts off and
enforce our own limit per completion (so one call can take at most ``len(completions) * timeout_s``), in one of
two ways:
- Main thread, ``workers == 1`` (the trainer's case): grade in-process under a ``setitimer`` alarm that raises
  a BaseException subclass, which math-verify's ``except Exception`` blocks cannot swallow. Measured 0.3-1 ms
  per completion on the shared 2-core machine, with no process to start. It cut every pathological input we
  tried within 5 ms of the limit: ``9^{9^{9^9}}`` (still running after 100 s untimed), ``10^{10^8}``,
  ``(10^{100})!``, 60-deep ``\\frac``, 3,000-term sums, and nested braces (parse time grows exponentially
  with depth: 10 -> 2 s, 15 -> 18 s). A signal cannot interrupt one long C call; none was found in
  math-verify 0.9, so this fast path is kept.
- Off the main thread, ``workers > 1``, or when someone else's interval timer is running: a persistent pool
  of worker subprocesses with a hard kill. A worker that overruns the limit is SIGKILLed and replaced (a
  ~1-2 s interpreter start, also paid once when the pool first starts), so nothing can hang. Measured ~2 ms
  per completion per worker, IPC included.
"""

from __future__ import annotations

import atexit
import logging
import math
import multiprocessing
import multiprocessing.connection
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from math_verify import LatexExtractionConfig, parse, verify

# Box contents longer than this are counted as unparsable without trying: no answer in this harness is that
# long, and parsing junk of that size would spend the whole time limit on every such completion.
MAX_BOX_CHARS = 1000
# The fallback pattern only looks at the end of a completion, where a final answer is written.
FALLBACK_TAIL_CHARS = 1000
# How long a fresh worker process may take to import math-verify (sympy) on a loaded 2-core machine.
WORKER_START_TIMEOUT_S = 120.0

_LATEX_ONLY = (LatexExtractionConfig(),)
# `\{` and `\}` are literal braces in LaTeX; matching them first keeps them out of the depth count.
_BOX_TOKEN_RE = re.compile(r"\\[{}]|\\boxed\s*\{|\{|\}")

# ASCII only: `\d` and `\s` would also match characters int() rejects (a model emitted "\x1f30" once).
_INT = re.compile(r"[ ]*[+-]?[0-9]{1,30}[ ]*")

# Per-completion outcome codes, shared by the in-process and the pool paths.
_CORRECT, _WRONG, _NO_ANSWER, _TIMEOUT, _BAD_GOLD = range(5)


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
    fallback = compile_fallback(fallback_pattern)

    codes = [_WRONG] * n
    truncated = [finished is not None and not finished[i] for i in range(n)]
    extracted: list[str | None] = [None] * n
    jobs: list[tuple[int, str, str]] = []  # (index, text handed to math-verify, gold)
    for i, text in enumerate(completions):
        if truncated[i]:
            continue
        target = last_boxed(text) if require_boxed else text
        if target is None and fallback is not None:
            target = _fallback_match(fallback, text)
        if target is None or not target.strip() or (require_boxed and len(target) > MAX_BOX_CHARS):
            codes[i] = _NO_ANSWER
            continue
        extracted[i] = target
        if require_boxed and _INT.fullmatch(target) and _INT.fullmatch(str(answers[i])):
            # Integer against integer (every AIME and arith answer): math-verify would compare the same numbers
            # (it also accepts "042" for 42), at ~4 ms a call through latex2sympy; this takes microseconds.
            codes[i] = _CORRECT if int(target.strip(" ")) == int(str(answers[i]).strip(" ")) else _WRONG
            continue
        jobs.append((i, f"\\boxed{{{target}}}" if require_boxed else target, str(answers[i])))

    processes = 0
    if jobs:
        if workers == 1 and _signals_usable():
            results = _grade_with_alarm(jobs, timeout_s)
        else:
            results, processes = _pool_grade(jobs, timeout_s, workers)
        for i, code in results.items():
            if code == _BAD_GOLD:
                raise ValueError(f"grade: gold answer {answers[i]!r} (index {i}) is not parsable by math-verify")
            codes[i] = code

    def frac(flags: list[bool]) -> float:
        return sum(flags) / n if n else 0.0

    format_fail = [c == _NO_ANSWER for c in codes]
    timed_out = [c == _TIMEOUT for c in codes]
    return GradeResult(
        rewards=[correct if c == _CORRECT else wrong for c in codes],
        correct=[c == _CORRECT for c in codes],
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
    if workers == 1 and _signals_usable():
        results = _grade_with_alarm(jobs, timeout_s)
    else:
        results, _ = _pool_grade(jobs, timeout_s, workers)
    return [results.get(i) == _CORRECT for i in range(len(answers))]


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


# ---------------------------------------------------------------- grading one completion (both paths)


class _Timeout(BaseException):
    """Raised by our SIGALRM handler; BaseException so math-verify's `except Exception` lets it through."""


def _grade_one(target: str, gold: str) -> int:
    gold_parsed = _parse_gold(gold)
    if not gold_parsed:
        return _BAD_GOLD
    pred = parse(target, extraction_config=_LATEX_ONLY, fallback_mode="no_fallback", parsing_timeout=None)
    if not pred:
        return _NO_ANSWER
    return _CORRECT if verify(gold_parsed, pred, timeout_seconds=None) else _WRONG


@lru_cache(maxsize=1)
def _warm_up() -> None:
    # The first parse in a process builds math-verify's regexes and grammar: >1 s on a loaded 2-core machine,
    # which would otherwise be charged to (and time out) whichever completion happens to be graded first.
    _grade_one("\\boxed{1}", "1")


@lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> list:
    # Gold answers are trusted data and repeat across a group of samples, so they are cached.
    return parse(f"${gold}$", extraction_config=_LATEX_ONLY, fallback_mode="no_fallback", parsing_timeout=None)


class _DropTimeoutWarning(logging.Filter):
    # math-verify warns once per process that its timeouts are off; here that is deliberate.
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutWarning())


# ---------------------------------------------------------------- in-process path (main thread)


def _signals_usable() -> bool:
    # An itimer already running belongs to someone else; do not clobber it.
    return (
        os.name == "posix"
        and threading.current_thread() is threading.main_thread()
        and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    )


def _raise_timeout(signum: int, frame: object) -> None:
    raise _Timeout


def _grade_with_alarm(jobs: list[tuple[int, str, str]], timeout_s: float) -> dict[int, int]:
    _warm_up()
    results: dict[int, int] = {}
    previous = signal.signal(signal.SIGALRM, _raise_timeout)
    try:
        for i, target, gold in jobs:
            try:
                signal.setitimer(signal.ITIMER_REAL, timeout_s)
                try:
                    results[i] = _grade_one(target, gold)
                except Exception:  # same policy as a worker: an internal error is no answer, not a crash
                    results[i] = _NO_ANSWER
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except _Timeout:
                results[i] = _TIMEOUT
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return results


# ---------------------------------------------------------------- process-pool path (any thread, hard kill)
# Workers are plain subprocesses (`python -c ...`) talking over a socketpair, not multiprocessing "spawn"
# children: spawn re-runs the parent's __main__ file in every child, which breaks (or re-trains!) any script
# without an `if __name__ == "__main__"` guard. A subprocess imports only this module (math-verify + sympy,
# no torch), and a stuck one is killed with SIGKILL.

_WORKER_CODE = "import sys; from harness.rewards import _worker_main; _worker_main(int(sys.argv[1]))"


def _worker_main(fd: int) -> None:
    """Worker loop: receive a list of (index, target, gold), send back (index, code) one at a time."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the trainer; we exit when the socket closes
    conn = multiprocessing.connection.Connection(fd)
    _warm_up()
    conn.send("ready")
    while True:
        try:
            batch = conn.recv()
        except (EOFError, OSError):
            return
        if batch is None:
            return
        for i, target, gold in batch:
            try:
                code = _grade_one(target, gold)
            except Exception:  # same policy as the in-process path
                code = _NO_ANSWER
            conn.send((i, code))


class _Worker:
    def __init__(self) -> None:
        parent, child = socket.socketpair()
        env = dict(os.environ)
        # The child must import this very `harness`, installed or not.
        root = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        self.process = subprocess.Popen(
            [sys.executable, "-c", _WORKER_CODE, str(child.fileno())],
            pass_fds=[child.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=env,
        )
        child.close()
        self.conn = multiprocessing.connection.Connection(parent.detach())
        self.pending: list[tuple[int, str, str]] = []  # sent, not yet answered, in the worker's order
        self.last_progress = 0.0
        self._ready = False

    def wait_ready(self) -> None:
        if self._ready:
            return
        try:
            started = self.conn.poll(WORKER_START_TIMEOUT_S) and self.conn.recv() == "ready"
        except (EOFError, OSError):
            started = False
        if not started:
            self.kill()
            raise RuntimeError(
                f"grading worker process did not start within {WORKER_START_TIMEOUT_S:.0f} s "
                f"(exit code {self.process.returncode}; its stderr is above)"
            )
        self._ready = True

    def submit(self, jobs: list[tuple[int, str, str]]) -> None:
        self.pending = list(jobs)
        self.conn.send(self.pending)
        self.last_progress = time.monotonic()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
            self.process.wait(timeout=2.0)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        self.conn.close()


class _Pool:
    def __init__(self) -> None:
        self._workers: list[_Worker] = []
        self.lock = threading.Lock()

    def grade(self, jobs: list[tuple[int, str, str]], timeout_s: float, size: int) -> tuple[dict[int, int], int]:
        """(code per job index, how many distinct worker processes answered at least one job)."""
        try:
            return self._grade(jobs, timeout_s, size)
        except BaseException:
            # Interrupted (e.g. Ctrl-C) mid-batch: answers still in flight would be read by the next call.
            for w in self._workers:
                w.kill()
            self._workers = []
            raise

    def _grade(self, jobs: list[tuple[int, str, str]], timeout_s: float, size: int) -> tuple[dict[int, int], int]:
        while len(self._workers) < size:
            self._workers.append(_Worker())
        active = self._workers[: min(size, len(jobs))]
        for w in active:  # all were started above, so their start-ups overlap
            w.wait_ready()
        for k, w in enumerate(active):
            w.submit(jobs[k :: len(active)])
        results: dict[int, int] = {}
        answered_by: set[int] = set()
        while any(w.pending for w in active):
            busy = [w for w in active if w.pending]
            deadline = min(w.last_progress for w in busy) + timeout_s
            ready = multiprocessing.connection.wait(
                [w.conn for w in busy], timeout=max(0.0, deadline - time.monotonic())
            )
            for w in busy:
                if w.conn in ready:
                    try:
                        i, code = w.conn.recv()
                    except (EOFError, OSError):  # the worker died (e.g. out of memory): give up on its item
                        self._replace(w, active, results)
                        continue
                    results[i] = code
                    answered_by.add(w.process.pid)
                    w.pending.pop(0)
                    w.last_progress = time.monotonic()
                # poll(): an answer may have arrived while another worker was being replaced (which blocks).
                elif time.monotonic() - w.last_progress >= timeout_s and not w.conn.poll():
                    self._replace(w, active, results)
        return results, len(answered_by)

    def _replace(self, worker: _Worker, active: list[_Worker], results: dict[int, int]) -> None:
        """Kill a worker stuck on (or dead at) its first pending item; its other items go to a fresh one."""
        results[worker.pending[0][0]] = _TIMEOUT
        rest = worker.pending[1:]
        worker.pending = []
        worker.kill()
        fresh = _Worker()
        self._workers[self._workers.index(worker)] = fresh
        active[active.index(worker)] = fresh
        fresh.wait_ready()
        if rest:
            fresh.submit(rest)

    def close(self) -> None:
        for w in self._workers:
            w.stop()
        self._workers = []


_POOL = _Pool()
atexit.register(_POOL.close)


def _pool_grade(jobs: list[tuple[int, str, str]], timeout_s: float, workers: int) -> tuple[dict[int, int], int]:
    with _POOL.lock:  # one grading call at a time owns the workers
        return _POOL.grade(jobs, timeout_s, workers)


def shutdown_workers() -> None:
    """Stop the grading worker processes (they are also stopped at exit); the next pool call restarts them."""
    with _POOL.lock:
        _POOL.close()
