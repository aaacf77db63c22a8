"""An offline W&B run folder (`<dir>/wandb/offline-run-*/`), read without a network or a W&B account: its run
record (name, group, job type, config), its history rows and the artifacts it logged. `wandb sync` would upload the
same records.

wandb has no public Python reader of its `.wandb` transaction log, so this reads the framing itself (LevelDB's log
format: 32 KiB blocks of chunks, each with a 7-byte header: crc32, length, type 1 = whole, 2/3/4 = first, middle,
last piece, after a 7-byte file header) and parses each record with wandb's own protobuf schema.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7


@dataclass
class OfflineRun:
    """What an offline run folder holds. `finished`: its exit record is there (wandb-core writes the file from its
    own process and may flush it after `finish` has returned)."""

    name: str = ""
    group: str = ""
    job_type: str = ""
    run_id: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    finished: bool = False


def transaction_log(folder: Path) -> Path:
    """The `.wandb` file of an offline run folder (`offline-run-*`), or of the one run under `folder`."""
    folder = Path(folder)
    found = sorted(folder.glob("run-*.wandb")) or sorted(folder.glob("**/offline-run-*/run-*.wandb"))
    if len(found) != 1:
        what = "no" if not found else f"{len(found)}"
        raise ValueError(f"{folder}: {what} W&B offline run log (run-*.wandb) found; name one offline-run-* folder")
    return found[0]


def records(path: Path) -> Iterator[Any]:
    """Every protobuf Record of a `.wandb` transaction log, in order."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B transaction log")
    pos, piece = HEADER, b""
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # too little room left for a header: the block's tail is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if pos + HEADER + length > len(data):  # a chunk still being written (the run is live)
            return
        piece += data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(piece)
            piece = b""
            yield record


def read(folder: Path) -> OfflineRun:
    """The run record, history rows (each a dict of its logged keys, W&B's own `_step` etc. included) and
    artifacts of an offline run folder."""
    out = OfflineRun()
    for record in records(transaction_log(folder)):
        kind = record.WhichOneof("record_type")
        if kind == "run" and not out.run_id:
            run = record.run
            out.name, out.group, out.job_type, out.run_id = run.display_name, run.run_group, run.job_type, run.run_id
            # `_wandb` is W&B's own bookkeeping, not the run's config.
            out.config = {i.key: json.loads(i.value_json) for i in run.config.update if not i.key.startswith("_")}
        elif kind == "config":
            out.config.update({i.key: json.loads(i.value_json) for i in record.config.update if i.key[:1] != "_"})
        elif kind == "history":
            out.history.append({_key(i): json.loads(i.value_json) for i in record.history.item})
        elif kind == "artifact":
            a = record.artifact
            files = sorted(e.path for e in a.manifest.contents)
            out.artifacts.append({"name": a.name, "type": a.type, "aliases": list(a.aliases), "files": files})
        elif kind == "exit":
            out.finished = True
    return out


def _key(item: Any) -> str:
    # A key with a "/" may be stored split into nested_key (wandb's flattening of nested dicts).
    return item.key or "/".join(item.nested_key)
