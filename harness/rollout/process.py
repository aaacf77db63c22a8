"""A rollout engine in its own process: the asynchronous loop's (trainer.max_staleness > 0) engine.

With the engine in the trainer's process, generation and the updates share one Python interpreter, and on the tiny
model both spend much of their time in Python: overlapped on 2 cores the updates took 0.81 s instead of 0.54 s
(docs/performance.md, B6). Here the engine (HF or vLLM, built by `engine_from_config` exactly as in-process) lives
in a spawned child; `sample` and `sync_weights` are messages on torch.multiprocessing queues, whose tensors travel
through shared memory rather than pickled bytes. Every call waits for its reply, so the caller's ordering (the
weight version loaded before a batch is sampled) holds as in-process, and seeds are decided in this process
(`RolloutEngine.generate`), so the samples are the in-process engine's.
"""

from __future__ import annotations

import os
import queue
import threading
import traceback
from collections.abc import Mapping
from multiprocessing.connection import wait
from typing import Any

import torch
import torch.multiprocessing as mp

from harness.rollout.base import Rollout, RolloutEngine, Sampling


def _serve(build: tuple, threads: int, requests: Any, replies: Any) -> None:
    """The child: build the engine, then answer ("sample", Sampling) and ("sync", state) until ("close",)."""
    from harness.rollout import engine_from_config

    # A daemon child is ended by its parent's normal exit only: after a SIGKILL of the trainer (preemption) it would
    # outlive it, holding a core and the model, so it watches the parent and leaves with it.
    parent = mp.parent_process()
    if parent is not None:
        threading.Thread(target=lambda: (wait([parent.sentinel]), os._exit(1)), daemon=True).start()
    torch.set_num_threads(threads)
    try:
        engine = engine_from_config(*build)
    except BaseException as e:
        replies.put(("error", _error(e)))
        return
    replies.put(("ready", {"seed": engine.seed, "max_topk": engine.max_topk, "max_model_len": engine.max_model_len}))
    while True:
        kind, *payload = requests.get()
        if kind == "close":
            engine.close()
            replies.put(("closed", None))
            return
        try:
            out = engine.sample(payload[0]) if kind == "sample" else engine.sync_weights(payload[0])
            replies.put(("ok", out))
        except BaseException as e:
            replies.put(("error", _error(e)))


def _error(e: BaseException) -> tuple[bool, str, str]:
    """(a setup error, as build_run reports them in one line; its first line; the traceback)."""
    setup = isinstance(e, ValueError | OSError | ImportError)
    return setup, (str(e).splitlines() or [type(e).__name__])[0], traceback.format_exc()


class ProcessEngine(RolloutEngine):
    """`engine_from_config(*build)` run in a child process with `threads` torch threads."""

    def __init__(self, build: tuple, threads: int) -> None:
        ctx = mp.get_context("spawn")  # a fork would copy the trainer's threads and vLLM's state mid-flight
        self._requests, self._replies = ctx.Queue(), ctx.Queue()
        self._proc = ctx.Process(target=_serve, args=(build, threads, self._requests, self._replies), daemon=True)
        self._proc.start()
        info = self._reply("building the rollout engine")
        self.seed, self.max_topk, self.max_model_len = info["seed"], info["max_topk"], info["max_model_len"]
        self._calls = 0  # seeds are drawn here, by RolloutEngine.generate, as in-process

    def sample(self, s: Sampling) -> Rollout:
        self._requests.put(("sample", s))
        return self._reply("sampling")

    def sync_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        self._requests.put(("sync", dict(state_dict)))
        self._reply("loading weights")

    def close(self) -> None:
        if self._proc.is_alive():
            self._requests.put(("close",))
            try:
                self._reply("closing", timeout_s=60)
            except RuntimeError:
                pass
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()

    def _reply(self, doing: str, timeout_s: float | None = None) -> Any:
        waited = 0.0
        while True:
            try:
                kind, value = self._replies.get(timeout=1.0)
                break
            except queue.Empty:
                waited += 1.0
                if not self._proc.is_alive():
                    raise RuntimeError(
                        f"rollout engine process (pid {self._proc.pid}) died while {doing} "
                        f"(exit code {self._proc.exitcode})"
                    ) from None
                if timeout_s is not None and waited >= timeout_s:
                    raise RuntimeError(
                        f"rollout engine process: no reply after {timeout_s:.0f} s while {doing}"
                    ) from None
        if kind == "error":
            setup, line, trace = value
            if setup:  # the in-process engine's one-line setup errors stay one line
                raise ValueError(line)
            raise RuntimeError(f"rollout engine process failed while {doing}: {line}\n{trace}")
        return value


def engine_threads(trainer_threads: int) -> int:
    """The child's torch threads: the cores the trainer leaves."""
    return max(1, (os.cpu_count() or 1) - trainer_threads)
