"""Docs that cannot rot: README.md and docs/*.md against the repository they describe.

- every relative Markdown link resolves to a file in the repository (anchors are not checked);
- every `make <target>` in a code block names a target of the Makefile;
- every `python run.py ...` (or `torchrun ... run.py ...`) line in a code block composes, as `--cfg job` would: the
  checks run.py makes before Hydra starts, then Hydra's composition, in-process (a sweep at its first values);
- every `python -m <module>` of this project in a code block names a module that exists;
- every ```python block that imports from this project runs its import statements;
- no file of the repository outside findings/ mentions the sibling checkout the project once read its data from;
- the README stays a short guide (at most 300 lines) that links every docs page, and no page quotes commit hashes.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from harness.cli.checks import check_command_line, check_group_options, check_override_keys
from harness.config import compose

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 300
PROJECT_PACKAGES = {"harness", "analysis", "bench", "tests"}
# Spelled in two parts so that this file does not mention it itself.
SIBLING = "../" + "shared"
# Launchers that are optional extras: a command naming one is composed only where its plugin is installed.
LAUNCHER_PLUGINS = {"ray": "hydra_plugins.hydra_ray_launcher"}
# A line that stands for something the reader fills in is not run: <run dir>, outputs/<...>, /path/to, "...".
PLACEHOLDER = re.compile(r"<[^>]*>|/path/to|\.\.\.")

FENCE = re.compile(r"^```([\w+-]*)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
COMMIT_HASH = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SEPARATORS = {"&&", "||", ";", "|"}


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def blocks(page: Path) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block of a page."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(page.read_text(encoding="utf-8"))]


def prose(page: Path) -> str:
    """A page without its code blocks and inline code: where its links are."""
    return INLINE_CODE.sub("", FENCE.sub("", page.read_text(encoding="utf-8")))


def shell_commands(body: str) -> list[tuple[str, list[str]]]:
    """(the line as written, its words) for every simple command of a shell block: continuation lines joined,
    comments dropped, `a && b` split, leading VAR=value assignments removed."""
    out = []
    for line in body.replace("\\\n", " ").splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:  # an unbalanced quote: not a command this test can read
            continue
        command: list[str] = []
        for word in [*words, ";"]:
            if word in SEPARATORS:
                while command and ENV_ASSIGNMENT.match(command[0]):
                    command.pop(0)
                if command:
                    out.append((line.strip(), command))
                command = []
            else:
                command.append(word)
    return out


def code_commands() -> list[tuple[str, str, list[str]]]:
    """(page, line, words) for every shell command in a non-Python code block of the README and the docs."""
    return [
        (rel(page), line, words)
        for page in PAGES
        for lang, body in blocks(page)
        if lang not in ("python", "yaml", "json")
        for line, words in shell_commands(body)
    ]


def run_py_args(words: list[str]) -> list[str] | None:
    """The arguments after `run.py` of `python run.py ...` or `torchrun ... run.py ...`; None for other commands."""
    if Path(words[0]).name.startswith("python") and len(words) > 1 and words[1] == "run.py":
        return words[2:]
    if words[0] == "torchrun" and "run.py" in words:
        return words[words.index("run.py") + 1 :]
    return None


RUN_COMMANDS = [(page, line, args) for page, line, words in code_commands() if (args := run_py_args(words)) is not None]
MAKE_COMMANDS = [(page, line, words) for page, line, words in code_commands() if words[0] == "make"]
MODULE_COMMANDS = [
    (page, line, words[2])
    for page, line, words in code_commands()
    if Path(words[0]).name.startswith("python") and len(words) > 2 and words[1] == "-m"
]
PYTHON_BLOCKS = [
    (rel(page), i, body) for page in PAGES for i, (lang, body) in enumerate(blocks(page)) if lang == "python"
]


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([A-Za-z][\w.-]*)[ \t]*:(?!=)", text, flags=re.MULTILINE))


def case_id(page: str, words: list[str]) -> str:
    """A test id: the page and the command as the shell reads it (no comment, no line breaks), cut short."""
    text = f"{page}: {' '.join(words)}"
    return text if len(text) <= 100 else text[:97] + "..."


def first_values(args: list[str]) -> list[str]:
    """The overrides of the first job of a sweep: `-m` dropped, every sweep (a,b / range / choice) at its first
    value, as Hydra's basic sweeper would launch it first."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = OverridesParser.create().parse_overrides([a for a in args if not a.startswith("-")])
    out = []
    for o in overrides:
        if o.is_sweep_override():
            out.append(f"{o.get_key_element()}={next(iter(o.sweep_string_iterator()))}")
        else:
            out.append(o.input_line)
    return out


# ---------------------------------------------------------------- links


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_relative_link_resolves_to_a_file_in_the_repository(page):
    broken = []
    for target in LINK.findall(prose(page)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):  # a URL or an anchor on the page
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.exists() or not path.is_relative_to(ROOT):
            broken.append(target)
    assert not broken, f"{rel(page)}: links to nothing in the repository: {broken}"


def test_the_readme_links_every_docs_page_and_each_page_says_what_it_is_for():
    linked = {(README.parent / t.split("#", 1)[0]).resolve() for t in LINK.findall(prose(README))}
    for page in PAGES[1:]:
        assert page.resolve() in linked, f"README.md does not link {rel(page)}"
        lines = page.read_text(encoding="utf-8").splitlines()
        assert lines[0].startswith("# ") and lines[1] == "" and lines[2].strip(), f"{rel(page)}: '# Title', then a line"


# ---------------------------------------------------------------- commands


def test_the_pages_show_commands_this_test_reads():
    # A guard on the parsing itself: if it stopped finding commands, every test below would pass vacuously.
    assert len(RUN_COMMANDS) >= 20 and len(MAKE_COMMANDS) >= 10 and len(PYTHON_BLOCKS) >= 4


@pytest.mark.parametrize("page,line,words", MAKE_COMMANDS, ids=[case_id(p, w) for p, _, w in MAKE_COMMANDS])
def test_every_make_command_names_a_makefile_target(page, line, words):
    targets = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    missing = sorted(set(targets) - makefile_targets())
    assert targets and not missing, f"{page}: `{line}`: no Makefile target {missing or '(none named)'}"


@pytest.mark.parametrize("page,line,args", RUN_COMMANDS, ids=[case_id(p, ["run.py", *a]) for p, _, a in RUN_COMMANDS])
def test_every_run_py_command_composes(page, line, args, monkeypatch, capsys):
    """What `python run.py <args> --cfg job` checks, in-process: run.py's own checks of the command line (group
    options, unknown keys, refused entries), then Hydra's composition of the first job."""
    if PLACEHOLDER.search(line):
        pytest.skip("a placeholder for the reader to fill in")
    launcher = next((a.split("=", 1)[1] for a in args if a.startswith("hydra/launcher=")), None)
    if launcher in LAUNCHER_PLUGINS and importlib.util.find_spec(LAUNCHER_PLUGINS[launcher]) is None:
        pytest.skip(f"hydra/launcher={launcher}: its plugin (an optional extra) is not installed")
    monkeypatch.setenv("WANDB_MODE", "offline")
    try:
        check_group_options(args)
        check_command_line(args)
        check_override_keys(args)
    except SystemExit:
        pytest.fail(f"{page}: `{line}`: {capsys.readouterr().err.strip()}")
    try:
        compose(*first_values(args), hydra_config=True)
    except Exception as e:  # noqa: BLE001 - any composition error is the finding
        pytest.fail(f"{page}: `{line}` does not compose: {type(e).__name__}: {e}")


@pytest.mark.parametrize("page,line,module", MODULE_COMMANDS, ids=[case_id(p, [m]) for p, _, m in MODULE_COMMANDS])
def test_every_python_m_command_of_this_project_names_a_module(page, line, module):
    if module.split(".")[0] not in PROJECT_PACKAGES:
        pytest.skip(f"{module}: not this project's")
    assert importlib.util.find_spec(module) is not None, f"{page}: `{line}`: no module {module}"


# ---------------------------------------------------------------- Python blocks


@pytest.mark.parametrize("page,index,body", PYTHON_BLOCKS, ids=[f"{p}#{i}" for p, i, _ in PYTHON_BLOCKS])
def test_every_python_block_that_imports_this_project_imports_cleanly(page, index, body):
    tree = ast.parse(body)
    imports = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    modules = [a.name for n in imports if isinstance(n, ast.Import) for a in n.names]
    modules += [n.module for n in imports if isinstance(n, ast.ImportFrom) and n.module]
    if not any(m.split(".")[0] in PROJECT_PACKAGES for m in modules):
        pytest.skip("imports nothing of this project")
    absent = sorted({m.split(".")[0] for m in modules} - PROJECT_PACKAGES)
    absent = [m for m in absent if importlib.util.find_spec(m) is None]
    if absent:
        pytest.skip(f"needs {', '.join(absent)}, an optional extra not installed here")
    exec(compile(ast.Module(body=imports, type_ignores=[]), f"{page} block {index}", "exec"), {})


# ---------------------------------------------------------------- the repository stands alone


def repository_files() -> list[Path]:
    """Every file git tracks or would track (untracked but not ignored), as paths that exist."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT, capture_output=True, check=True, timeout=60,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        pytest.skip("not a git checkout")
    return [ROOT / p for p in out.decode().split("\0") if p and (ROOT / p).is_file()]


def test_no_file_outside_findings_reads_or_names_the_sibling_checkout():
    offenders = []
    for path in repository_files():
        if rel(path).startswith("findings/"):
            continue
        data = path.read_bytes()
        if b"\0" not in data and SIBLING.encode() in data:
            offenders.append(rel(path))
    assert not offenders, f"these files mention {SIBLING}, which a clone of this repository does not have: {offenders}"


# ---------------------------------------------------------------- a short guide


def test_the_readme_is_a_short_guide():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; keep it to {README_MAX_LINES}"


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_no_page_quotes_commit_hashes(page):
    found = COMMIT_HASH.findall(page.read_text(encoding="utf-8"))
    assert not found, f"{rel(page)}: {found}: name what changed, not the commit (git log has the history)"
