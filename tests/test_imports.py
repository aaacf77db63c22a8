"""The project's layers: modules import each other without a cycle (harness/, analysis/, bench/), the training loop
is imported only from above it (no library module of harness/ and no analysis module reaches into harness.loop),
nothing reaches into Hydra's private modules, and no module or function under harness/ outgrows its page."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_FUNCTION_LINES = 60  # one screen
MAX_MODULE_LINES = 400
PACKAGES = ("harness", "analysis", "bench")


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path) -> set[str]:
    """Every module name `path` imports anywhere in its text (function-level imports included), and for
    `from pkg import name` also `pkg.name`."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Module -> the project modules it imports. `from pkg import name` is an edge to `pkg.name` when that is a
    module, else to `pkg`."""
    files = {module_name(p, root): p for pkg in packages for p in (root / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        names = imported_names(path)
        edges = {n for n in names if n in files}
        # `from pkg import sub` names the submodule; the package itself counts only when a name is not a module.
        edges -= {n for n in edges if any(s.startswith(n + ".") and s in files for s in names)}
        graph[name] = edges - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = finished
    path: list[str] = []

    def visit(u: str) -> list[str] | None:
        state[u] = 1
        path.append(u)
        for v in sorted(graph.get(u, ())):
            if state.get(v) == 1:
                return path[path.index(v) :] + [v]
            if v not in state and (cycle := visit(v)):
                return cycle
        path.pop()
        state[u] = 2
        return None

    for u in sorted(graph):
        if u not in state and (cycle := visit(u)):
            return cycle
    return None


def test_find_cycle_sees_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_graph_reads_function_level_imports(tmp_path):
    pkg = tmp_path / "harness"
    (pkg / "loop").mkdir(parents=True)
    for f in ("__init__.py", "loop/__init__.py", "loop/train.py"):
        (pkg / f).write_text("")
    (pkg / "config.py").write_text("def f():\n    from harness.loop import train\n")
    assert import_graph(tmp_path)["harness.config"] == {"harness.loop.train"}


def test_no_import_cycle_among_project_modules():
    assert find_cycle(import_graph()) is None


def test_the_loop_is_imported_only_from_above_it():
    """harness.loop runs a job; the libraries below it (config, rollout, rewards, the run directory's format, ...)
    and analysis, which reads run directories, never import it."""
    below = [
        f"{name} imports {sorted(n for n in imported_names(path) if n.startswith('harness.loop'))}"
        for pkg in ("harness", "analysis")
        for path in (ROOT / pkg).rglob("*.py")
        if not (name := module_name(path)).startswith("harness.loop")
        and any(n == "harness.loop" or n.startswith("harness.loop.") for n in imported_names(path))
    ]
    assert not below, below


def test_nothing_imports_hydras_private_modules():
    private = [
        str(path.relative_to(ROOT))
        for pkg in (*PACKAGES, "tests")
        for path in (ROOT / pkg).rglob("*.py")
        if any(n.startswith("hydra._internal") for n in imported_names(path))
    ] + [p for p in ("run.py",) if any(n.startswith("hydra._internal") for n in imported_names(ROOT / p))]
    assert not private, private


def test_no_module_under_harness_is_longer_than_its_page():
    long = [
        f"{path.relative_to(ROOT)} ({n} lines)"
        for path in (ROOT / "harness").rglob("*.py")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, long


def test_no_function_under_harness_is_longer_than_a_screen():
    long = []
    for path in (ROOT / "harness").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.name} ({n} lines)")
    assert not long, long


# What a verl or TRL user imports to compute a loss: the objectives, their aggregation and divergences, the
# advantages and the log-prob kernels. None of it may pull in the run machinery, even through another module.
ALGORITHM = ("harness.objectives", "harness.divergence", "harness.advantages", "harness.logprobs")
RUN_MACHINERY = ("harness.loop", "harness.config", "harness.cli", "harness.rundir", "harness.rollout", "harness.tasks")


def reachable(graph: dict[str, set[str]], start: list[str]) -> set[str]:
    seen, todo = set(), list(start)
    while todo:
        if (u := todo.pop()) not in seen:
            seen.add(u)
            todo += graph.get(u, ())
    return seen


def test_reachable_follows_imports_through_other_modules():
    assert reachable({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a"}}, ["a"]) == {"a", "b", "c"}


def test_the_algorithm_imports_nothing_of_the_run_machinery():
    graph = import_graph()
    start = [m for m in graph if any(m == a or m.startswith(a + ".") for a in ALGORITHM)]
    assert "harness.objectives.dppo" in start
    pulled = sorted(m for m in reachable(graph, start) if any(m == r or m.startswith(r + ".") for r in RUN_MACHINERY))
    assert not pulled, pulled
