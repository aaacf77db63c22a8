"""Benchmarks and training sets from a local file (JSONL or Parquet) or a Hugging Face hub dataset, as `Problem`s.

Sources. `source` is a local path when one exists there; otherwise a hub name (`owner/name`), read with
`datasets.load_dataset(name, split=split)`. A missing local file is a FileNotFoundError; a hub name that cannot
be fetched (no network, unknown name, unknown split) is one ValueError line that says to pass a local file.

Layouts (each loader accepts the ones listed; a row that fits none fails with its file and line):

- benchmarks (`load_benchmark_file`): `problem` (or `question`), `answer`, optional `id` (else the row number).
  AIME answers must be integers 0..999 (an int, or a decimal string; leading zeros are dropped).
- DAPO-Math-17k (`load_dapo_math`): the verl layout of `BytedTsinghua-SIA/DAPO-Math-17k`, a `prompt` chat list
  whose user turn wraps the problem in DAPO's "Solve the following ... Answer:" instruction (stripped here,
  the run's own template applies) and `reward_model.ground_truth`; or `problem` + `answer`; or
  `open-r1/DAPO-Math-17k-Processed`'s `prompt` string + `solution` (its answer).
- MATH (`load_math`): `problem`, `solution` (the answer is its last complete `\\boxed{}`) or `answer`, and `level`
  ("Level 4" or 4). Rows outside `levels` (including "Level ?") are dropped.

Training sets are deduplicated by problem text (whitespace-normalised, first occurrence kept: the hub copy of
DAPO-Math-17k repeats each of its ~17k problems ~100 times) and filtered to answers the grader can use
(`rewards.gradable`: math-verify parses them and a boxed copy grades correct). Each loader returns its counts,
which `load_problems` logs.
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from harness.errors import first_line
from harness.rewards import gradable, last_boxed
from harness.tasks.arith import Problem

FILE_TYPES = (".jsonl", ".parquet")
AIME_MAX_ANSWER = 999
# Parquet and hub rows are read in batches of this many: memory stays bounded for the 1.8M-row DAPO file.
BATCH_ROWS = 4096
# Below this many distinct answers the gradability check runs in-process; above, on all cores.
POOL_MIN_ANSWERS = 2000

# `name` or `owner/name` (as models.py): anything else that is not an existing path is a mistyped path.
_HUB_NAME_RE = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
_DAPO_PREFIX = "Solve the following math problem step by step."
_DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:"'
_LEVEL_RE = re.compile(r"^(?:level\s*)?(\d+)$", re.IGNORECASE)
_INT_RE = re.compile(r"^\d+$")


# ---------------------------------------------------------------- reading rows


def read_rows(source: str, *, split: str = "train", key: str = "path") -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, row) for every row of a local .jsonl/.parquet file or a hub dataset split; `where` is
    ``file:line`` (``name[split] row i`` on the hub) for error messages. `key` names the config key in errors."""
    path = check_source(source, key)
    if path is None:
        yield from _hub_rows(source, split, key)
    elif path.suffix == ".jsonl":
        yield from _jsonl_rows(path, key)
    else:
        yield from _parquet_rows(path)


REPO_ROOT = Path(__file__).resolve().parents[2]


def check_source(source: str, key: str, read: bool = False) -> Path | None:
    """The local file `source` names (None for a hub dataset name), or a one-line error: a missing file, a
    folder, a type other than .jsonl/.parquet. With `read`, a .jsonl file is also decoded once, so a file that
    is not UTF-8 is named at config time, before any model is built (~0.1 s per 10 MB)."""
    path = Path(source).expanduser()
    if not path.is_absolute() and not path.exists() and (REPO_ROOT / path).exists():
        # The repository's own files (data/aime/, tests/fixtures/) are named relative to its root; a run started
        # from another folder (a sweep's job, a test's temporary folder) still finds them.
        path = REPO_ROOT / path
    if path.is_file():
        if path.suffix not in FILE_TYPES:
            kind = path.suffix or "(none)"
            raise ValueError(f"{key}: {source!r} has type {kind!r}; allowed: {', '.join(FILE_TYPES)}")
        if read and path.suffix == ".jsonl":
            _check_utf8(path, key)
        return path
    if path.exists():
        raise ValueError(f"{key}: {source!r} is a directory; pass one {' or '.join(FILE_TYPES)} file")
    looks_like_path = source.startswith(("/", ".", "~")) or path.suffix in FILE_TYPES
    if looks_like_path or not _HUB_NAME_RE.match(source):
        raise FileNotFoundError(
            f"{key}: file {source!r} does not exist (expected a local {' or '.join(FILE_TYPES)} file "
            "or a hub dataset name like 'owner/name')"
        )
    return None


def _check_utf8(path: Path, key: str) -> None:
    with path.open("rb") as f:
        for lineno, line in enumerate(f, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{key}: {path}:{lineno} is not UTF-8 (byte {line[e.start]:#04x} at column {e.start + 1}); "
                    "save the file as UTF-8"
                ) from None


def hub_reachable() -> bool:
    """Whether the hub's host resolves (HF_ENDPOINT's, else huggingface.co); always True under HF_HUB_OFFLINE,
    where `datasets` reads its cache only. Asked first because without a network `datasets` retries for ~30 s
    with a warning per try before it fails."""
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    host = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname or "huggingface.co"
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return False
    return True


def _jsonl_rows(path: Path, key: str) -> Iterator[tuple[str, dict[str, Any]]]:
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                raise ValueError(f"{key}: {path}:{lineno} is not UTF-8; save the file as UTF-8") from None
            except ValueError:
                raise ValueError(f"{key}: {path}:{lineno} is not valid JSON") from None
            if not isinstance(row, dict):
                raise ValueError(f"{key}: {path}:{lineno} is not a JSON object")
            yield f"{path}:{lineno}", row


def _parquet_rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    import pyarrow.parquet as pq

    row = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS):
        for record in batch.to_pylist():
            row += 1
            yield f"{path}:row {row}", record


def _hub_rows(name: str, split: str, key: str) -> Iterator[tuple[str, dict[str, Any]]]:
    try:
        import datasets
    except ImportError:
        raise ValueError(
            f"{key}: reading hub dataset {name!r} needs the 'datasets' package (pip install datasets); "
            f"or pass a local {' or '.join(FILE_TYPES)} file"
        ) from None
    if not hub_reachable():
        raise ValueError(
            f"{key}: hub dataset {name!r} cannot be downloaded: no network to the hub from here; pass a local "
            f"{' or '.join(FILE_TYPES)} file instead (or set HF_HUB_OFFLINE=1 to read the hub cache)"
        )
    try:
        ds = datasets.load_dataset(name, split=split)
    except Exception as e:  # no network, an unknown name or split: all one answer for the user
        reason = first_line(e)
        raise ValueError(
            f"{key}: hub dataset {name!r} (split {split!r}) could not be downloaded ({type(e).__name__}: {reason}); "
            f"pass a local {' or '.join(FILE_TYPES)} file instead"
        ) from None
    row = 0
    for table in ds.with_format("arrow").iter(batch_size=BATCH_ROWS):
        for record in table.to_pylist():
            row += 1
            yield f"{name}[{split}] row {row}", record


# ---------------------------------------------------------------- benchmarks


def load_benchmark_file(
    source: str, kind: str, *, split: str = "train", integer_answers: bool = True, key: str = "benchmark.path"
) -> list[Problem]:
    """The problems of one benchmark source, in file order, with `kind` set (e.g. "aime24").

    `integer_answers`: answers must be integers 0..999 (AIME), normalised to a decimal string without leading
    zeros."""
    problems: list[Problem] = []
    seen: set[str] = set()
    for index, (where, row) in enumerate(read_rows(source, split=split, key=key), 1):
        question = _field(row, ("problem", "question"), where)
        answer = _field(row, ("answer",), where)
        if integer_answers:
            answer = _integer_answer(answer, where)
        raw_id = row.get("id")
        pid = str(index if raw_id is None else raw_id)
        if pid in seen:
            raise ValueError(f"{where}: duplicate id {pid!r}; benchmark ids must be unique")
        seen.add(pid)
        problems.append(Problem(id=pid, question=question, answer=answer, kind=kind))
    if not problems:
        raise ValueError(f"{key}: {source!r} holds no problems")
    return problems


def _integer_answer(answer: str, where: str) -> str:
    text = answer.strip()
    if not _INT_RE.match(text) or int(text) > AIME_MAX_ANSWER:
        raise ValueError(f"{where}: answer {answer!r} is not an integer 0..{AIME_MAX_ANSWER} (AIME answers are)")
    return str(int(text))


# ---------------------------------------------------------------- training sets


class _Parsed(NamedTuple):
    question: str
    answer: str
    id: str
    text: str
    """The problem text duplicates are found on (whitespace is normalised)."""


def load_dapo_math(
    source: str, *, split: str = "train", keep_instruction: bool = False, key: str = "data.path"
) -> tuple[list[Problem], dict[str, int]]:
    """DAPO-Math-17k (any layout in the module docstring) -> (problems of kind "dapo", counts).

    `keep_instruction`: the question keeps DAPO's "Solve ... Answer:" wrapper (verl's DAPO recipe prompts with
    it); duplicates are still found on the bare problem text."""
    strip = (lambda text: text) if keep_instruction else _strip_dapo_instruction

    def parse(where: str, row: dict[str, Any], n: int) -> _Parsed:
        prompt = row.get("prompt")
        if isinstance(prompt, list):
            text = _user_turn(prompt, where)
            reward_model = row.get("reward_model")
            if isinstance(reward_model, dict) and reward_model.get("ground_truth") is not None:
                answer = _text(reward_model["ground_truth"], "reward_model.ground_truth", where)
            else:
                answer = _field(row, ("answer",), where)
        elif isinstance(prompt, str):  # open-r1/DAPO-Math-17k-Processed
            text = prompt
            answer = _field(row, ("solution", "answer"), where)
        else:
            text = _field(row, ("problem", "question"), where)
            answer = _field(row, ("answer",), where)
        extra = row.get("extra_info")
        index = extra.get("index") if isinstance(extra, dict) else row.get("id")
        pid = f"dapo-row-{n}" if index is None else f"dapo-{index}"
        return _Parsed(strip(text), answer, pid, _strip_dapo_instruction(text))

    return _training_set(source, split, key, "dapo", parse)


def load_math(
    source: str, *, levels: tuple[int, ...] = (3, 4, 5), split: str = "train", key: str = "data.path"
) -> tuple[list[Problem], dict[str, int]]:
    """MATH problems of the given difficulty levels -> (problems of kind "math", counts).

    The level stays in the id (``math-l4-<n>``) rather than the kind: the trainer draws kinds in equal shares,
    and MATH's levels are not equally common."""
    wanted = set(levels)

    def parse(where: str, row: dict[str, Any], n: int) -> _Parsed | None:
        level = _level(row.get("level"))
        if level not in wanted:
            return None
        question = _field(row, ("problem", "question"), where)
        if row.get("answer") is not None:
            answer = _text(row["answer"], "answer", where)
        else:
            answer = last_boxed(_field(row, ("solution",), where)) or ""
        return _Parsed(question, answer, f"math-l{level}-{n}", question)

    return _training_set(source, split, key, "math", parse)


def _training_set(
    source: str, split: str, key: str, kind: str, parse: Callable[[str, dict[str, Any], int], _Parsed | None]
) -> tuple[list[Problem], dict[str, int]]:
    """Read, parse, dedup by problem text, and keep gradable answers. `parse(where, row, row_number)` returns
    None for a row the set leaves out (another MATH level)."""
    counts = {"rows": 0, "other_level": 0, "duplicates": 0, "no_answer": 0, "ungradable": 0}
    rows: list[_Parsed] = []
    seen: set[str] = set()
    ids: set[str] = set()
    for where, row in read_rows(source, split=split, key=key):
        counts["rows"] += 1
        parsed = parse(where, row, counts["rows"])
        if parsed is None:
            counts["other_level"] += 1
            continue
        norm = " ".join(parsed.text.split())
        if norm in seen:
            counts["duplicates"] += 1
            continue
        seen.add(norm)
        answer = parsed.answer.strip()
        if not answer:
            counts["no_answer"] += 1
            continue
        pid = parsed.id if parsed.id not in ids else f"{kind}-row-{counts['rows']}"
        ids.add(pid)
        rows.append(_Parsed(parsed.question.strip(), answer, pid, norm))

    distinct = sorted({r.answer for r in rows})
    workers = min(os.cpu_count() or 1, 16) if len(distinct) >= POOL_MIN_ANSWERS else 1
    usable = dict(zip(distinct, gradable(distinct, workers=workers), strict=True))
    problems = [Problem(id=r.id, question=r.question, answer=r.answer, kind=kind) for r in rows if usable[r.answer]]
    counts["ungradable"] = len(rows) - len(problems)
    counts["kept"] = len(problems)
    if not problems:
        raise ValueError(f"{key}: {source!r} has no usable problems ({_describe(counts)})")
    return problems, counts


def _describe(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items())


def _strip_dapo_instruction(text: str) -> str:
    text = text.strip()
    if text.startswith(_DAPO_PREFIX) and "\n\n" in text:
        text = text.split("\n\n", 1)[1]
    return text.split(_DAPO_SUFFIX, 1)[0].strip()


def _user_turn(messages: list[Any], where: str) -> str:
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str):
            return m["content"]
    raise ValueError(f"{where}: 'prompt' has no user message with string content")


def _level(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = _LEVEL_RE.match(str(value).strip()) if value is not None else None
    return int(match.group(1)) if match else None


def _field(row: dict[str, Any], names: tuple[str, ...], where: str) -> str:
    for name in names:
        if row.get(name) is not None:
            return _text(row[name], name, where)
    have = ", ".join(sorted(row)) or "none"
    raise ValueError(f"{where}: missing field {' or '.join(repr(n) for n in names)} (fields present: {have})")


def _text(value: Any, name: str, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"{where}: field {name!r} must be a string or an integer, got {type(value).__name__}")
