"""Synthetic arithmetic with integer answers 0..999 (the "task v2" of reference/tiny-learnability.md).

Four kinds of problem, each a small fact table so a 2.6M-param model can learn it (the first three are the
default mix):

- ``add``: ``a+b`` with one operand in 0..``add_max`` and the other in 0..9, either order (1,900 problems).
- ``mul``: ``a*b`` with a, b in 0..``mul_max`` and product <= 999 (3,390 problems).
- ``add_mul``: ``a+b*c`` with 1-digit operands (1,000 problems); its demonstration is a scratchpad.
- ``chain`` (opt-in, not in the default mix): ``a+b+c+d`` with 1-digit operands (10,000 problems); its
  demonstration shows every running sum, ``a+b=X X+c=Y Y+d=Z \\boxed{Z}``: 21 tokens with the end token,
  against 9-11 for the default mix; the longer responses of findings/CALIBRATION.md section 12.

The question is the bare expression (``3+4*5``); the chat template frames it. The split is by problem: every
problem is enumerated once, shuffled per kind with a seeded RNG, and the first
``n_eval / len(kinds)`` of each kind form the held-out set, so train and eval never share a question.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

KINDS = ("add", "mul", "add_mul", "chain")
DEFAULT_KINDS = ("add", "mul", "add_mul")
MAX_ANSWER = 999
CHAIN_TERMS = 4

_ID_RE = re.compile(r"^(add|mul|add_mul):(\d+)([+*])(\d+)(?:\*(\d+))?$")
_CHAIN_ID_RE = re.compile(rf"^chain:(\d(?:\+\d){{{CHAIN_TERMS - 1}}})$")


@dataclass(frozen=True)
class ArithConfig:
    """Which problems exist and how many are held out. The fields are the task's difficulty knobs."""

    kinds: tuple[str, ...] = DEFAULT_KINDS
    """Problem kinds to include, any non-empty subset of ("add", "mul", "add_mul", "chain")."""
    add_max: int = 99
    """``add``: the larger operand ranges over 0..add_max, the other over 0..9 (9..990 keeps answers <= 999)."""
    mul_max: int = 99
    """``mul``: both factors range over 0..mul_max; products above 999 are dropped."""
    n_eval: int = 600
    """Held-out problems, split equally between the kinds."""
    seed: int = 0
    """Seed of the per-kind shuffle that decides which problems are held out."""

    def __post_init__(self) -> None:
        # Hydra hands sequences over as ListConfig/list; normalise so the config stays hashable.
        kinds = self.kinds
        if isinstance(kinds, str) or not isinstance(kinds, Sequence):
            raise ValueError(f"ArithConfig.kinds must be a sequence of names from {KINDS}, got {kinds!r}")
        object.__setattr__(self, "kinds", tuple(kinds))
        if not self.kinds or len(set(self.kinds)) != len(self.kinds) or set(self.kinds) - set(KINDS):
            raise ValueError(
                f"ArithConfig.kinds must be a non-empty subset of {KINDS} without repeats, got {self.kinds!r}"
            )
        for name, low, high in (("add_max", 9, 990), ("mul_max", 1, MAX_ANSWER)):
            value = getattr(self, name)
            if not _is_int(value) or not low <= value <= high:
                raise ValueError(f"ArithConfig.{name} must be an integer in {low}..{high}, got {value!r}")
        if not _is_int(self.seed):
            raise ValueError(f"ArithConfig.seed must be an integer, got {self.seed!r}")
        k = len(self.kinds)
        if not _is_int(self.n_eval) or self.n_eval <= 0 or self.n_eval % k:
            raise ValueError(f"ArithConfig.n_eval must be a positive multiple of len(kinds)={k}, got {self.n_eval!r}")
        for kind in self.kinds:
            total = len(_enumerate(kind, self))
            if self.n_eval // k >= total:
                raise ValueError(
                    f"ArithConfig.n_eval: {self.n_eval // k} held-out '{kind}' problems would leave none of its "
                    f"{total} for training; use n_eval < {total * k}"
                )


@dataclass(frozen=True)
class Problem:
    id: str
    """``kind:expression``, unique across the task, e.g. ``add_mul:3+4*5``."""
    question: str
    answer: str
    """The integer answer as a decimal string without leading zeros ("" for RLHF prompts, which have none)."""
    kind: str
    messages: tuple[tuple[str, str], ...] = ()
    """RLHF prompts (harness/tasks/rlhf.py): the prompt's (role, content) turns, ending in a user turn; the chat
    template renders these instead of `question`. Empty for every other task."""


def make_splits(cfg: ArithConfig) -> tuple[list[Problem], list[Problem]]:
    """Returns (train, eval). Eval holds ``cfg.n_eval / len(kinds)`` problems of each kind, grouped by kind in
    ``cfg.kinds`` order; train holds every other problem, grouped the same way. Deterministic in ``cfg``."""
    per_kind = cfg.n_eval // len(cfg.kinds)
    train: list[Problem] = []
    held_out: list[Problem] = []
    for kind in cfg.kinds:
        problems = _enumerate(kind, cfg)
        # A string seed makes each kind's shuffle independent of which other kinds are enabled.
        random.Random(f"arith:{cfg.seed}:{kind}").shuffle(problems)
        held_out += problems[:per_kind]
        train += problems[per_kind:]
    return train, held_out


def demonstration(p: Problem) -> str:
    """The supervised completion: ``\\boxed{N}`` for add/mul, a scratchpad ``b*c=X a+X=Y \\boxed{Y}`` for add_mul,
    the running sums ``a+b=X X+c=Y Y+d=Z \\boxed{Z}`` for chain."""
    if p.kind == "chain":
        return _chain_demonstration(p)
    match = _ID_RE.match(p.id)
    if match is None or match.group(1) != p.kind:
        raise ValueError(f"Problem.id {p.id!r} is not an arith id of kind {p.kind!r}")
    if p.kind != "add_mul":
        return f"\\boxed{{{p.answer}}}"
    a, b, c = int(match.group(2)), int(match.group(4)), int(match.group(5))
    return f"{b}*{c}={b * c} {a}+{b * c}={a + b * c} \\boxed{{{a + b * c}}}"


def _chain_demonstration(p: Problem) -> str:
    match = _CHAIN_ID_RE.match(p.id)
    if match is None:
        raise ValueError(f"Problem.id {p.id!r} is not a chain id of {CHAIN_TERMS} one-digit terms")
    terms = [int(t) for t in match.group(1).split("+")]
    sums = list(itertools.accumulate(terms))
    steps = [f"{before}+{t}={after}" for before, t, after in zip(sums[:-1], terms[1:], sums[1:], strict=True)]
    return " ".join(steps) + f" \\boxed{{{sums[-1]}}}"


def balanced_sample(problems: Sequence[Problem], n: int, rng: random.Random) -> list[Problem]:
    """``n`` problems drawn with replacement, the kinds taking turns from a random start so each kind gets an
    equal share (within one); uniform within a kind. This is how the recipe feeds SFT and RL batches."""
    by_kind: dict[str, list[Problem]] = {}
    for p in problems:
        by_kind.setdefault(p.kind, []).append(p)
    if not by_kind:
        raise ValueError("balanced_sample: problems is empty")
    kinds = sorted(by_kind)
    start = rng.randrange(len(kinds))
    return [rng.choice(by_kind[kinds[(start + i) % len(kinds)]]) for i in range(n)]


def _enumerate(kind: str, cfg: ArithConfig) -> list[Problem]:
    if kind == "add":
        pairs = {(a, b) for a in range(cfg.add_max + 1) for b in range(10)}
        pairs |= {(b, a) for a, b in pairs}
        return [_problem(kind, f"{a}+{b}", a + b) for a, b in sorted(pairs)]
    if kind == "mul":
        return [
            _problem(kind, f"{a}*{b}", a * b)
            for a in range(cfg.mul_max + 1)
            for b in range(cfg.mul_max + 1)
            if a * b <= MAX_ANSWER
        ]
    if kind == "chain":
        return [_problem(kind, "+".join(map(str, t)), sum(t)) for t in itertools.product(range(10), repeat=CHAIN_TERMS)]
    return [_problem(kind, f"{a}+{b}*{c}", a + b * c) for a in range(10) for b in range(10) for c in range(10)]


def _problem(kind: str, expr: str, value: int) -> Problem:
    # The bare expression, as in the recipe: a "What is ...?" wrapper spends BPE merges on the wrapper and gave a
    # more peaked warm start (T=1 18% / greedy 23% / pass@8 56% vs 25% / 35% / 66% bare, SFT step 300).
    return Problem(id=f"{kind}:{expr}", question=expr, answer=str(value), kind=kind)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
