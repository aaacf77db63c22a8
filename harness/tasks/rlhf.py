"""RLHF prompt sets (DPPO Fig. 10): UltraFeedback and HH-RLHF prompts, without answers, for a reward model to score.

Read with `harness.tasks.loaders.read_rows` (a local .jsonl/.parquet file, or a hub dataset where the hub is
reachable). Each row becomes a `Problem` with `answer` "" and `messages`, the prompt's turns as (role, content)
pairs ending in a user turn; `question` is the last user turn for a one-turn prompt, else the HH-style transcript.

Layouts:
- UltraFeedback (`load_ultrafeedback`): `HuggingFaceH4/ultrafeedback_binarized` (`prompt` string, `prompt_id`);
  verl's parquet (`prompt` as a chat list); `openbmb/UltraFeedback` (`instruction`); or only a `chosen` /
  `messages` chat list, whose turns before the last assistant turn are the prompt.
- HH-RLHF (`load_hh_rlhf`): `Anthropic/hh-rlhf` (`chosen`, a "\\n\\nHuman: ... \\n\\nAssistant: ..." transcript: the
  prompt is everything before its last assistant turn); a `prompt` transcript ending in "Assistant:"; or a
  `prompt` chat list.

Prompts are deduplicated by their turns (first kept); a row whose prompt cannot be read (HH has a few malformed
transcripts) is skipped and counted, and a row that fits no layout at all fails with its file and line.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from harness.tasks.arith import Problem
from harness.tasks.loaders import read_rows

Turns = tuple[tuple[str, str], ...]

_HH_TURN = re.compile(r"\n\n(Human|Assistant): ?")
_ROLES = {"Human": "user", "Assistant": "assistant"}


def load_ultrafeedback(source: str, *, split: str = "train", key: str = "data.path") -> tuple[list[Problem], dict]:
    def parse(where: str, row: dict[str, Any]) -> Turns | None:
        prompt = row.get("prompt")
        if isinstance(prompt, str):
            return (("user", prompt),)
        if isinstance(prompt, list):
            return _chat_turns(prompt, where)
        if isinstance(row.get("instruction"), str):
            return (("user", row["instruction"]),)
        for name in ("chosen", "messages"):
            if isinstance(row.get(name), list):
                return _before_last_assistant(_chat_turns(row[name], where))
        raise _no_layout(row, where, "'prompt', 'instruction', or a 'chosen'/'messages' chat list")

    return _prompt_set(source, split, key, "ultrafeedback", parse, ("prompt_id", "id"))


def load_hh_rlhf(source: str, *, split: str = "train", key: str = "data.path") -> tuple[list[Problem], dict]:
    def parse(where: str, row: dict[str, Any]) -> Turns | None:
        prompt = row.get("prompt")
        if isinstance(prompt, list):
            return _chat_turns(prompt, where)
        if isinstance(prompt, str):
            return _before_last_assistant(parse_transcript(prompt))
        if isinstance(row.get("chosen"), str):  # a whole dialogue: the prompt ends where its last answer starts
            turns = parse_transcript(row["chosen"])
            return _before_last_assistant(turns) if turns and turns[-1][0] == "assistant" else None
        raise _no_layout(row, where, "'chosen' (an HH transcript) or 'prompt'")

    return _prompt_set(source, split, key, "hh_rlhf", parse, ("id",))


def parse_transcript(text: str) -> Turns | None:
    """Parse "\\n\\nHuman: a\\n\\nAssistant: b" -> (("user", "a"), ("assistant", "b")); None if it does not alternate
    from a Human turn. A trailing empty "Assistant:" (a prompt waiting for its answer) is kept as ("assistant", "")."""
    if not text.startswith("\n\n"):
        text = "\n\n" + text.lstrip("\n")
    parts = _HH_TURN.split(text)
    if parts[0].strip():  # text before the first turn marker
        return None
    turns = tuple((_ROLES[parts[i]], parts[i + 1].strip()) for i in range(1, len(parts) - 1, 2))
    if not turns or any(role != ("user" if k % 2 == 0 else "assistant") for k, (role, _) in enumerate(turns)):
        return None
    return turns


def transcript_question(turns: Turns) -> str:
    """What `Problem.question` holds: a one-turn prompt's text, else the transcript ending in "Assistant:"."""
    if len(turns) == 1:
        return turns[0][1]
    names = {"user": "Human", "assistant": "Assistant", "system": "System"}
    return "".join(f"\n\n{names.get(r, r.capitalize())}: {c}" for r, c in turns) + "\n\nAssistant:"


# ---------------------------------------------------------------- shared


def _prompt_set(
    source: str, split: str, key: str, kind: str, parse: Callable[[str, dict[str, Any]], Turns | None],
    id_fields: tuple[str, ...],
) -> tuple[list[Problem], dict[str, int]]:  # fmt: skip
    counts = {"rows": 0, "unreadable": 0, "duplicates": 0}
    problems: list[Problem] = []
    seen: set[Turns] = set()
    ids: set[str] = set()
    for where, row in read_rows(source, split=split, key=key):
        counts["rows"] += 1
        turns = parse(where, row)
        if not turns or not turns[-1][1].strip() or turns[-1][0] != "user":
            counts["unreadable"] += 1
            continue
        norm = tuple((r, " ".join(c.split())) for r, c in turns)
        if norm in seen:
            counts["duplicates"] += 1
            continue
        seen.add(norm)
        raw_id = next((row[f] for f in id_fields if row.get(f) is not None), None)
        pid = f"{kind}-{raw_id}" if raw_id is not None else f"{kind}-row-{counts['rows']}"
        if pid in ids:
            pid = f"{kind}-row-{counts['rows']}"
        ids.add(pid)
        problems.append(Problem(id=pid, question=transcript_question(turns), answer="", kind=kind, messages=turns))
    counts["kept"] = len(problems)
    if not problems:
        raise ValueError(
            f"{key}: {source!r} has no usable prompts ({', '.join(f'{k} {v}' for k, v in counts.items())})"
        )
    return problems, counts


def _chat_turns(messages: list[Any], where: str) -> Turns:
    turns = []
    for m in messages:
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise ValueError(f"{where}: a chat message must be an object with string 'role' and 'content'")
        turns.append((m["role"], m["content"]))
    return tuple(turns)


def _before_last_assistant(turns: Turns | None) -> Turns | None:
    if not turns:
        return None
    last = max((i for i, (role, _) in enumerate(turns) if role == "assistant"), default=None)
    return turns[:last] if last is not None else turns


def _no_layout(row: dict[str, Any], where: str, expected: str) -> ValueError:
    have = ", ".join(sorted(row)) or "none"
    return ValueError(f"{where}: expected {expected} (fields present: {have})")
