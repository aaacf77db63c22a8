"""How the harness words an error for a person: one line. The libraries (models, data loaders) and the loop's
services (run log, checkpoints) share it, so it lives below both."""

from __future__ import annotations

import sys


def first_line(e: BaseException) -> str:
    """An exception as one line: the first line of its message, or its type's name if it has none."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def fail(message: str, code: int = 2) -> None:
    """`error: <message>` on stderr and exit `code`: a command line or config that cannot run, said in one line."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)
