"""Shared fixtures: a small tiny model built once per session (cached across sessions), composed configs."""

from __future__ import annotations

import os
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
    from harness.config import validate
    from harness.loop.state import model_dir

    model_dir(validate(compose(*SMALL_MODEL)))


# The longest test files (minutes each on 2 cores): under `pytest -n 2 --dist loadfile` they are handed out first, so
# the short files fill in around them instead of one long file running alone at the end.
HEAVY_FIRST = (
    "test_faults.py",
    "test_disk_full.py",
    "test_distributed.py",
    "test_run_directory.py",
    "test_launchers.py",
    "test_train.py",
    "test_eval_mode.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


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
    from harness.loop.state import model_dir

    model_dir(validate(compose(*SMALL_MODEL)))
    return SMALL_MODEL
