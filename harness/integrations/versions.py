"""The one rule both adapters apply to the framework they patch: a version outside the tested minor range is
refused in one line, since each relies on a private call whose signature moves between minor releases."""

from __future__ import annotations

Minor = tuple[int, int]


def require(package: str, version: str, supported: tuple[Minor, Minor], tested: str, why: str) -> None:
    """ImportError naming `package` `version`, the `supported` (low, high) minor range, `why` the adapter needs
    it, and the pip line for the release it is `tested` with; nothing when `version` is in range."""
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    low, high = supported
    if len(parts) < 2 or not low <= parts <= high:
        span = f"{low[0]}.{low[1]}.x" + ("" if low == high else f" to {high[0]}.{high[1]}.x")
        raise ImportError(f"{package} {version}: {why}; supported: {package} {span}; pip install '{package}=={tested}'")
