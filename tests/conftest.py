"""Shared fixtures: a small tiny model built once per session (cached across sessions), composed configs."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from harness.config import compose  # noqa: F401  (tests import it from here)

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
# Built models are deterministic for their config, so a cache shared by test sessions is safe.
TEST_CACHE = Path(os.environ.get("HARNESS_TEST_CACHE", ROOT / ".cache" / "test-models"))

# A smaller sibling of model=tiny: same tokenizer recipe and architecture, fewer SFT steps, so the whole
# suite can build it in seconds. Its accuracy is low but non-zero, which is all the plumbing tests need.
SMALL_MODEL = [
    "model.hidden_size=64",
    "model.intermediate_size=128",
    "model.num_layers=2",
    "model.head_dim=32",  # vLLM CPU attention supports head_dim 32, 64, 80, ...; not 16
    "model.sft_steps=250",
    "model.corpus_size=4000",
    f"model.cache_dir={TEST_CACHE}",
]
FAST_TRAINER = [
    "trainer.prompts_per_step=4",
    "trainer.group_size=4",
    "trainer.max_new_tokens=16",
    "trainer.minibatches=2",
    "trainer.eval_every=1",
    "benchmark.max_problems=12",
    "logger=none",
    # One thread: these models are too small to gain from two, and OpenMP spin-waits badly when another
    # process holds the other core.
    "trainer.threads=1",
]


def pytest_configure(config: pytest.Config) -> None:
    """Build the small test model once, in the process that starts the session, before `pytest -n 2` (make test)
    starts its workers: otherwise each worker would build it at the same time, on the same two cores."""
    if hasattr(config, "workerinput") or config.option.collectonly or config.getoption("-n", None) in (None, 0):
        return
    if "not slow" in (config.option.markexpr or ""):  # the fast tier (make test-fast) uses no built model
        return
    from harness.config import validate
    from harness.loop.model_path import model_dir

    model_dir(validate(compose(*SMALL_MODEL)))


# The longest test files (minutes each on 2 cores): under `pytest -n 2 --dist loadfile` they are handed out first, so
# the short files fill in around them instead of one long file running alone at the end.
HEAVY_FIRST = (
    "test_faults.py",
    "test_preemption.py",
    "test_disk_full.py",
    "test_distributed.py",
    "test_run_directory.py",
    "test_launchers.py",
    "test_train.py",
    "test_eval_mode.py",
)


# Fixtures that build the small model or start runs: a test that uses one (directly or through another fixture) is
# `slow` whatever its file says, so `make test-fast` never waits on a model build.
SLOW_FIXTURES = ("small_model",)


# tryfirst: the marks added here must be in place before `-m` deselects (pytest's own hook of this name).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if any(name in getattr(item, "fixturenames", ()) for name in SLOW_FIXTURES):
            item.add_marker(pytest.mark.slow)
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


# ---------------------------------------------------------------- the fast tier starts no Python process
# A Python child costs an interpreter start and its imports (torch: seconds) before it does anything, and run.py adds
# a model build and training on top: the unit tier (`-m "not slow"`) runs in this process. An audit hook sees what
# subprocess, os.system, os.posix_spawn and os.exec* start, whoever calls them, without replacing anything; while a
# test not marked slow runs, it refuses a Python interpreter, torchrun or a command line naming run.py, and fails the
# test. The reward grader's worker is the one exception: grading in a separate, killable process is what
# test_rewards tests (the worker imports math-verify, not torch). multiprocessing's spawn and joblib's loky start
# Python through _posixsubprocess, which raises no audit event: their tests carry the mark by hand.
_LAUNCH_EVENTS = {"subprocess.Popen", "os.system", "os.posix_spawn", "os.exec", "os.spawn"}
_PYTHON = re.compile(r"(^|[\s/])(python[\d.]*|torchrun)(\s|$)|\brun\.py\b")
# `file` reads a program without running it: platform.architecture() probes the interpreter with `file -b <python>`
# (TRL's import does, where the bench extra is installed).
_PROBES = {"file"}
_fast_test: str | None = None  # the node id of the running test that is not marked slow
_refusal: BaseException | None = None  # the failure the audit hook raised in it


def _command_line(event: str, args: tuple) -> list[str]:
    if event == "os.system":
        return [os.fsdecode(args[0])]
    program, argv = args[1:3] if event == "os.spawn" else args[:2]
    argv = [argv] if isinstance(argv, str | bytes | os.PathLike) else list(argv or ())
    words = [os.fsdecode(a) for a in argv]
    return words if program is None or words[:1] == [os.fsdecode(program)] else [os.fsdecode(program), *words]


def _no_python_in_fast_tests(event: str, args: tuple) -> None:
    global _refusal
    if _fast_test is None or event not in _LAUNCH_EVENTS:
        return
    words = _command_line(event, args)
    if not any(_PYTHON.search(w) for w in words) or os.path.basename(words[0]) in _PROBES:
        return
    from harness.grading import _WORKER_CODE

    if _WORKER_CODE in words:
        return
    command = " ".join(words)[:300]
    _refusal = pytest.fail.Exception(
        f"{_fast_test} is not marked slow but started `{command}`: mark it `slow` (make test runs it), or test the "
        "code in this process",
        pytrace=False,
    )
    raise _refusal


sys.addaudithook(_no_python_in_fast_tests)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Setup, call and teardown of one test, its module- and session-scoped fixtures included."""
    global _fast_test, _refusal
    _fast_test, _refusal = (None if item.get_closest_marker("slow") else item.nodeid), None
    try:
        return (yield)
    finally:
        _fast_test = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """The refusal is raised inside the launching call, but a test that catches it, or launches from another thread
    (pytest only warns about a thread's exception), would pass or fail on its own assertions instead."""
    try:
        result = yield
    except BaseException as e:
        if _refusal is None or e is _refusal:
            raise
        raise _refusal from None
    if _refusal is not None:
        raise _refusal
    return result


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """Test models are tiny, and two OpenMP threads slow down ~15x when another process holds a core."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def small_model() -> list[str]:
    """Overrides selecting the small tiny model, built (or found in the cache) once per session."""
    from harness.config import validate
    from harness.loop.model_path import model_dir

    model_dir(validate(compose(*SMALL_MODEL)))
    return SMALL_MODEL


def wandb_run_record(run_dir: Path, wait_s: float = 30.0) -> dict:
    """The run record of the offline W&B run under `run_dir`: what `wandb sync` would upload as the run's name,
    group, job type and config, and the artifacts it logged (analysis/wandb_offline.py reads the log). wandb-core
    writes the file from its own process and flushes it after `finish` has returned (seen: a file holding only
    its header right after), so this waits for the run's exit record."""
    run = finished_wandb_run(run_dir, wait_s)
    return {"name": run.name, "group": run.group, "job_type": run.job_type, "config": run.config,
            "artifacts": run.artifacts, "id": run.run_id}  # fmt: skip


def finished_wandb_run(folder: Path, wait_s: float = 30.0):
    """The offline W&B run under `folder` once its exit record is written: wandb-core flushes the log from its own
    process after `finish` has returned, so a reader right after `finish` may find only the log's header."""
    import time

    from analysis import wandb_offline

    deadline = time.monotonic() + wait_s
    while True:
        run = wandb_offline.read(folder)
        if run.run_id and run.finished:
            return run
        assert time.monotonic() < deadline, f"{folder} holds no finished W&B run after {wait_s:.0f} s"
        time.sleep(0.1)
