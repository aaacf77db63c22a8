"""`python run.py --help`: the groups a user picks from and every key's help text, from the schemas themselves.

Hydra's own help lists every config group it knows, the `*_schema` groups this project registers for its
dataclass defaults among them, and no field help. Its template is kept (Hydra prints it, flags included), with the
two lists below put in through the `harness_help` resolver; nothing is composed into a run and nothing is written.
"""

from __future__ import annotations

import dataclasses
import textwrap

from harness.cli.checks import GROUP_NAMES, group_options
from harness.config.run import GROUPS, TOP_LEVEL, _TopLevel
from harness.objectives import FAMILIES
from harness.schema import describe

WIDTH = 110


def help_text(part: str) -> str:
    """`groups`: each group and its options; `keys`: each settable key, its type, default and help."""
    text = _groups() if part == "groups" else _keys()
    return text.replace("$", "$$")  # Hydra fills the template with string.Template: a bare $ would be a field


def _groups() -> str:
    lines = []
    for group in GROUP_NAMES:
        options = ", ".join(group_options(group))
        lines.append(textwrap.fill(options, WIDTH, initial_indent=f"{group}: ", subsequent_indent=" " * 4))
    return "\n".join(lines)


def _keys() -> str:
    sections = [("", _TopLevel), *GROUPS.items()]
    sections += [(f"objective ({family})", schema) for family, (_, schema) in FAMILIES.items()]
    lines: list[str] = []
    for where, schema in sections:
        lines.append(f"{where or 'top level'}:")
        prefix = "" if not where else f"{where.split()[0]}."
        for name, kind, default, text in describe(schema):
            if not where and name not in TOP_LEVEL or dataclasses.is_dataclass(default):
                continue
            head = f"  {prefix}{name} ({kind}, default {default!r})"
            lines.append(head if not text else textwrap.fill(text, WIDTH, initial_indent=f"{head}: ",
                                                             subsequent_indent=" " * 6))  # fmt: skip
    return "\n".join(lines)
