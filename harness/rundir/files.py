"""The run directory's files: atomic writes, JSONL reading, and the error a failed write raises.

Both the trainer (which writes a run directory) and analysis (which reads them) use these, so they live below
both. The directory's layout is in the README's "Where results land".
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

JSONL_FILES = ("metrics.jsonl", "eval.jsonl", "samples.jsonl")


class LogWriteError(RuntimeError):
    """A run-directory file (metrics, eval, samples, tokens, tables) could not be written: a full disk or a lost
    mount. Not an OSError, so the checkpoint path's own handling (skip one checkpoint, go on) never swallows it:
    the run stops, everything up to its newest checkpoint intact, and continues with trainer.resume=true."""

    def __init__(self, path: Path, error: OSError, step: int | None = None) -> None:
        at = "" if step is None else f" at step {step}"
        super().__init__(
            f"{path.name} could not be written{at} ({error.strerror or error}); the run stopped with everything up "
            "to its newest checkpoint intact: free space, then continue it with trainer.resume=true"
        )


@contextlib.contextmanager
def writing(path: Path, step: int | None = None) -> Iterator[None]:
    """OSError inside -> LogWriteError naming the file."""
    try:
        yield
    except OSError as e:
        raise LogWriteError(path, e, step) from e


# --- atomic files -------------------------------------------------------------------------------------------


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """Replace `path` with `data` so readers see the old or the new file, never a half-written one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_path(path.parent)  # makes the rename itself survive a power cut


def atomic_write_text(path: Path | str, text: str) -> None:
    """atomic_write_bytes of `text` as UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path | str, obj: Any) -> None:
    """atomic_write_text of `obj` as indented JSON; tensors/numpy become numbers and NaN/inf become null."""
    atomic_write_text(path, json.dumps(finite(to_python(obj, Path(path).name)), indent=2) + "\n")


def fsync_path(path: Path) -> None:
    """fsync a file or a folder (a folder's fsync makes renames inside it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- values ---------------------------------------------------------------------------------------------------


def to_python(value: Any, where: str) -> Any:
    """Plain Python copy of `value`: tensors and numpy values become numbers (0-dim) or nested lists."""
    if isinstance(value, dict):
        return {str(k): to_python(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_python(v, where) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if hasattr(value, "tolist"):  # torch.Tensor, numpy arrays and numpy scalars; works with requires_grad too
        return to_python(value.tolist(), where)
    raise ValueError(
        f"{where}: cannot log a {type(value).__name__}; allowed: numbers, str, bool, None, tensors, numpy, lists, dicts"
    )


def finite(value: Any) -> Any:
    """NaN and +-inf become None, because JSON has no spelling for them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


# --- JSONL reading --------------------------------------------------------------------------------------------


def parse_jsonl(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Records of the complete lines and the byte length they span.

    A line is complete when it ends in a newline and parses; the last line may be torn (a crash mid-write,
    or null bytes after a power cut) and is left out. A bad line anywhere else is corruption: ValueError.
    """
    data = path.read_bytes()
    pieces = data.split(b"\n")  # the last piece is whatever follows the final newline: b"" or a torn line
    records: list[dict[str, Any]] = []
    good_end = pos = 0
    for i, piece in enumerate(pieces[:-1]):
        pos += len(piece) + 1
        if not piece.strip():
            good_end = pos
            continue
        try:
            records.append(json.loads(piece))
        except ValueError:
            if i == len(pieces) - 2 and not pieces[-1]:
                break  # the last line is garbage: torn, drop it
            raise ValueError(f"{path}: line {i + 1} is not valid JSON (only the last line may be torn)") from None
        good_end = pos
    return records, good_end


def read_jsonl(path: Path | str) -> list[dict[str, Any]]:
    """All complete records of a JSONL file; a torn last line (a run still writing, or a crash) is skipped."""
    return parse_jsonl(Path(path))[0]
