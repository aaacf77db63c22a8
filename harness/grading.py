"""math-verify on (index, text, gold) jobs under a hard per-completion time limit: the executor behind
`harness.rewards.grade`.

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
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from functools import lru_cache
from pathlib import Path

from math_verify import LatexExtractionConfig, parse, verify

# How long a fresh worker process may take to import math-verify (sympy) on a loaded 2-core machine.
WORKER_START_TIMEOUT_S = 120.0

_LATEX_ONLY = (LatexExtractionConfig(),)

# Per-completion outcome codes, shared by the in-process and the pool paths.
CORRECT, WRONG, NO_ANSWER, TIMEOUT, BAD_GOLD = range(5)


def grade_jobs(jobs: list[tuple[int, str, str]], timeout_s: float, workers: int) -> tuple[dict[int, int], int]:
    """{index: outcome code} of each (index, text, gold) job, and how many worker processes graded: in this process
    under an alarm when `workers == 1` on the main thread, else in the worker pool."""
    if workers == 1 and _signals_usable():
        return _grade_with_alarm(jobs, timeout_s), 0
    return _pool_grade(jobs, timeout_s, workers)


# ---------------------------------------------------------------- grading one completion (both paths)


class _Timeout(BaseException):
    """Raised by our SIGALRM handler; BaseException so math-verify's `except Exception` lets it through."""


def _grade_one(target: str, gold: str) -> int:
    gold_parsed = _parse_gold(gold)
    if not gold_parsed:
        return BAD_GOLD
    pred = parse(target, extraction_config=_LATEX_ONLY, fallback_mode="no_fallback", parsing_timeout=None)
    if not pred:
        return NO_ANSWER
    return CORRECT if verify(gold_parsed, pred, timeout_seconds=None) else WRONG


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
                    results[i] = NO_ANSWER
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except _Timeout:
                results[i] = TIMEOUT
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return results


# ---------------------------------------------------------------- process-pool path (any thread, hard kill)
# Workers are plain subprocesses (`python -c ...`) talking over a socketpair, not multiprocessing "spawn"
# children: spawn re-runs the parent's __main__ file in every child, which breaks (or re-trains!) any script
# without an `if __name__ == "__main__"` guard. A subprocess imports only this module (math-verify + sympy,
# no torch), and a stuck one is killed with SIGKILL.

_WORKER_CODE = "import sys; from harness.grading import _worker_main; _worker_main(int(sys.argv[1]))"


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
                code = NO_ANSWER
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
        results[worker.pending[0][0]] = TIMEOUT
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
