"""Every bench/ module imports, and every name it imports from the harness, at module level or inside a function,
exists: `make bench` once failed on a function-level import of a name that had moved (harness.loop.train.model_dir)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
MODULES = sorted(p.stem for p in BENCH.glob("*.py"))


@pytest.mark.parametrize("name", MODULES)
def test_bench_module_imports_and_its_harness_names_exist(name):
    importlib.import_module(f"bench.{name}")
    tree = ast.parse((BENCH / f"{name}.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(("harness", "bench")):
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name) or importlib.util.find_spec(f"{node.module}.{alias.name}"), (
                    f"bench/{name}.py line {node.lineno}: {node.module} has no {alias.name}"
                )
