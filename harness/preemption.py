"""A stop from outside: SLURM sends SIGTERM on preemption and before a time limit (`--signal` and submitit send
SIGUSR1/SIGUSR2 earlier), a user presses Ctrl-C. The handler only records the signal; the training loop ends at
the next step boundary, every rank agreeing on it, writes a checkpoint there, and the run ends "preempted":
summary.json says which signal and at which step, W&B marks the run preempting, and run.py exits
PREEMPTED_EXIT_CODE, on which a launcher can requeue the command with `trainer.resume=auto`.

A step that would outlast the grace period is abandoned: an alarm raises StepAbandoned in the main thread and the
run ends "preempted" at once, with the last scheduled checkpoint, because the scheduler's SIGKILL follows soon after
(SLURM's KillWait: 30 s by default). A second Ctrl-C stops at once, as Ctrl-C always did.

The record is process-wide: a sweep's later jobs in the same process (the basic launcher) do not start after a
stop; they end "preempted" too, and the rerun with `trainer.resume=auto` starts them.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import FrameType
from typing import Any

logger = logging.getLogger(__name__)

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL (sysexits.h): a temporary failure, the command may be retried as it is
SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGCONT")  # the ones a stop may be asked with


class StepAbandoned(BaseException):
    """Raised by the grace alarm inside the running step. A BaseException, like KeyboardInterrupt, so that an
    `except Exception` in a library (a rollout engine, W&B) cannot swallow it."""


@dataclass(frozen=True)
class Stop:
    signal: str
    received_at: str  # UTC, ISO 8601

    def record(self) -> dict[str, Any]:
        return {"signal": self.signal, "received_at": self.received_at}


_stop: Stop | None = None  # the first stop this process received
_replaced: dict[int, Any] = {}  # the handlers the last StopSignals replaced: hand_on calls the stop's one


def requested() -> Stop | None:
    """The stop this process has received, if any."""
    return _stop


def request(signum: int) -> None:
    """Record a stop as the handler does (the first one wins)."""
    global _stop
    if _stop is None:
        _stop = Stop(signal.Signals(signum).name, datetime.now(UTC).isoformat(timespec="seconds"))


_ended_preempted = 0  # runs of this process that ended "preempted" (a run whose last step was done completes)


def ended_preempted(count: bool = False) -> int:
    """How many runs of this process ended "preempted"; `count`: one more did."""
    global _ended_preempted
    _ended_preempted += int(count)
    return _ended_preempted


def clear() -> None:
    """Forget the stop received (a process that goes on to run another job deliberately, and tests)."""
    global _stop
    _stop = None


class StopSignals:
    """Context manager: while it is open, `names` (SIGTERM, ...) record a stop instead of killing the process, and
    the grace alarm (`grace_s` > 0) abandons a step that runs on past it. On exit the alarm is cancelled and the
    previous handlers come back. Outside the main thread (where Python cannot install handlers) it does nothing."""

    def __init__(self, names: Sequence[str], grace_s: float) -> None:
        self.signals = [signal.Signals[n] for n in names]
        self.grace_s = float(grace_s)
        self.previous: dict[int, Any] = {}
        self.active = False

    def __enter__(self) -> StopSignals:
        global _replaced
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in self.signals:
            self.previous[sig] = signal.signal(sig, self._handle)
        self.previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, self._abandon)
        self.active = True
        _replaced = dict(self.previous)
        if _stop is not None:  # received before this run started (an earlier job of this sweep)
            self._start_alarm()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.active:
            return
        self.step_done()
        for sig, previous in self.previous.items():
            signal.signal(sig, previous)
        self.active = False

    def step_done(self) -> None:
        """The step the stop arrived in has ended (the run is stopping at its boundary): no alarm any more."""
        if self.active:
            signal.setitimer(signal.ITIMER_REAL, 0)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if _stop is not None:
            if signum == signal.SIGINT:  # a second Ctrl-C: the user wants out now
                raise KeyboardInterrupt
            return
        request(signum)
        when = f"abandoning it after {self.grace_s:g} s" if self.grace_s > 0 else "however long it takes"
        # print, not logging: a handler may interrupt a logging call holding the handler's lock
        print(
            f"\n{signal.Signals(signum).name}: stopping after the current step ({when}) with a checkpoint; "
            "resume with trainer.resume=auto",
            file=sys.stderr,
            flush=True,
        )
        self._start_alarm()

    def _start_alarm(self) -> None:
        if self.grace_s > 0:
            signal.setitimer(signal.ITIMER_REAL, self.grace_s)

    def _abandon(self, signum: int, frame: FrameType | None) -> None:
        raise StepAbandoned(f"the step outlasted trainer.preempt_grace_s={self.grace_s:g} s after {_name()}")


def _name() -> str:
    return _stop.signal if _stop else "the stop"


def hand_on() -> None:
    """After a stopped job has written its checkpoint and summary: call the handler ours replaced for the signal
    received, when it is Python code. Under the submitit launcher that is submitit's own, which requeues the job
    (on its USR signal) and exits; the requeued job continues with trainer.resume=auto."""
    if _stop is None:
        return
    sig = signal.Signals[_stop.signal]
    previous = _replaced.get(sig)
    if callable(previous) and previous is not signal.default_int_handler:
        previous(sig, None)
