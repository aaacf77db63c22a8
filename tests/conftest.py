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
    from harness.loop.model_path import model_dir

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
    from harness.loop.model_path import model_dir

    model_dir(validate(compose(*SMALL_MODEL)))
    return SMALL_MODEL


def wandb_run_record(run_dir: Path, wait_s: float = 30.0) -> dict:
    """The run record of the offline W&B run under `run_dir`: what `wandb sync` would upload as the run's name,
    group, job type and config. wandb 0.31 has no Python reader of its `.wandb` transaction log, so this reads its
    framing (LevelDB's log format: 32 KiB blocks of chunks, each with a 7-byte header: crc32, length, type
    1 = whole, 2/3/4 = first/middle/last piece) after the 7-byte file header, and parses each record with
    wandb's own protobuf schema. wandb-core writes the file from its own process and flushes it after `finish`
    has returned (seen: a file holding only its header right after), so this waits for the run's exit record."""
    import json
    import struct
    import time

    from wandb.proto import wandb_internal_pb2

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    deadline = time.monotonic() + wait_s
    while True:
        data = path.read_bytes()
        assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
        kinds: dict[str, wandb_internal_pb2.Record] = {}
        pos, piece, block = 7, b"", 32768
        while pos + 7 <= len(data):
            if block - pos % block < 7:  # too little room left for a header: the block's tail is padding
                pos += block - pos % block
                continue
            _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
            piece += data[pos + 7 : pos + 7 + length]
            pos += 7 + length
            if kind in (1, 4):
                record = wandb_internal_pb2.Record()
                record.ParseFromString(piece)
                piece = b""
                kinds.setdefault(record.WhichOneof("record_type"), record)
        if "run" in kinds and "exit" in kinds:
            run = kinds["run"].run
            # `_wandb` is W&B's own bookkeeping, not the run's config.
            config = {i.key: json.loads(i.value_json) for i in run.config.update if not i.key.startswith("_")}
            return {"name": run.display_name, "group": run.run_group, "job_type": run.job_type, "config": config}
        assert time.monotonic() < deadline, f"{path} holds no finished run after {wait_s:.0f} s: {sorted(kinds)}"
        time.sleep(0.1)
