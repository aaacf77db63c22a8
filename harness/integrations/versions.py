"""How an adapter judges the framework version it patches. A version older than the tested minor range is refused in
one line: the private calls the adapter makes came in with that range. A newer one is refused too unless the adapter
says it may run (`newer_runs`): then it warns once and each adapter checks the calls it makes itself (verl's does;
TRL's does not run newer releases, since a setting TRL adds to its loss would otherwise go unread)."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

Minor = tuple[int, int]

log = logging.getLogger(__name__)
_warned: set[tuple[str, str]] = set()


def _span(supported: tuple[Minor, Minor]) -> str:
    low, high = supported
    return f"{low[0]}.{low[1]}.x" + ("" if low == high else f" to {high[0]}.{high[1]}.x")


def require(
    package: str,
    version: str,
    supported: tuple[Minor, Minor],
    tested: str,
    why: str,
    *,
    newer_runs: bool = False,
) -> None:
    """ImportError naming `package` `version`, the `supported` (low, high) minor range, `why` the adapter needs
    it, and the pip line for the release it is `tested` with; nothing when `version` is in range. With
    `newer_runs`, a version above the range logs one warning per process instead."""
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    low, high = supported
    if len(parts) == 2 and low <= parts <= high:
        return
    if newer_runs and len(parts) == 2 and parts > high:
        if (package, version) not in _warned:
            _warned.add((package, version))
            log.warning(
                "%s %s is newer than the tested %s: running, since the calls the adapter makes are there; if it "
                "fails, pip install '%s==%s'",
                package,
                version,
                _span(supported),
                package,
                tested,
            )
        return
    raise ImportError(
        f"{package} {version}: {why}; supported: {package} {_span(supported)}; pip install '{package}=={tested}'"
    )


def missing_parameters(fn: Callable[..., Any], names: tuple[str, ...]) -> list[str]:
    """The `names` that `fn` does not take as keyword parameters (all of them when it takes **kwargs: none)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return []
    return [n for n in names if n not in params or params[n].kind is inspect.Parameter.POSITIONAL_ONLY]
