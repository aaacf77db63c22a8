import random
import re
from collections import Counter

import pytest

from harness.rewards import grade
from harness.tasks.arith import ArithConfig, Problem, balanced_sample, demonstration, make_splits


def _value(question: str) -> int:
    # Evaluate "a+b", "a*b" or "a+b*c" by hand (no eval), with * binding tighter than +.
    expr = re.fullmatch(r"([\d+*]+)", question).group(1)
    return sum(_product(term) for term in expr.split("+"))


def _product(term: str) -> int:
    out = 1
    for factor in term.split("*"):
        out *= int(factor)
    return out


def test_problem_counts_match_the_recipe():
    train, held_out = make_splits(ArithConfig())
    counts = Counter(p.kind for p in train + held_out)
    # add: 100 big x 10 small, both orders, minus the 10x10 pairs counted twice = 1,900.
    # mul: products <= 999 over 0..99 x 0..99 = 3,390 (tiny-learnability.md). add_mul: 10^3 = 1,000.
    assert counts == {"add": 1900, "mul": 3390, "add_mul": 1000}
    assert len(held_out) == 600 and len(train) == 6290 - 600


def test_split_is_by_problem_balanced_and_correct():
    train, held_out = make_splits(ArithConfig())
    assert not {p.question for p in train} & {p.question for p in held_out}
    assert len({p.id for p in train + held_out}) == len(train) + len(held_out)
    assert Counter(p.kind for p in held_out) == {"add": 200, "mul": 200, "add_mul": 200}
    for p in train + held_out:
        assert str(_value(p.question)) == p.answer
        assert 0 <= int(p.answer) <= 999 and p.answer == str(int(p.answer))


def test_deterministic_and_seeded():
    assert make_splits(ArithConfig()) == make_splits(ArithConfig())
    other = make_splits(ArithConfig(seed=1))[1]
    assert {p.id for p in other} != {p.id for p in make_splits(ArithConfig())[1]}
    # A kind's held-out set depends only on (seed, kind, its knob), not on which other kinds are enabled.
    add_only = make_splits(ArithConfig(kinds=("add",), n_eval=200))[1]
    assert add_only == [p for p in make_splits(ArithConfig())[1] if p.kind == "add"]


def test_difficulty_knobs():
    train, held_out = make_splits(ArithConfig(kinds=["add", "mul"], add_max=19, mul_max=12, n_eval=20))
    adds = [p for p in train + held_out if p.kind == "add"]
    muls = [p for p in train + held_out if p.kind == "mul"]
    assert len(adds) == 2 * 20 * 10 - 100  # 0..19 x 0..9, both orders, minus the doubly counted 10x10
    assert len(muls) == 13 * 13  # every product of 0..12 is <= 144
    assert max(int(p.answer) for p in adds) == 19 + 9


def test_demonstrations_format_and_grade_correct():
    add_mul = Problem(id="add_mul:3+4*5", question="3+4*5", answer="23", kind="add_mul")
    assert demonstration(add_mul) == "4*5=20 3+20=23 \\boxed{23}"
    assert demonstration(Problem(id="mul:7*8", question="7*8", answer="56", kind="mul")) == "\\boxed{56}"
    train, held_out = make_splits(ArithConfig())
    sample = held_out + train[::25]
    result = grade([demonstration(p) for p in sample], [p.answer for p in sample], [True] * len(sample))
    assert all(result.correct), [p for p, ok in zip(sample, result.correct, strict=True) if not ok][:5]
    # ... and a demonstration graded against a different answer is wrong, so the check above has teeth.
    shifted = grade([demonstration(p) for p in sample[:50]], [str(int(p.answer) + 1) for p in sample[:50]])
    assert not any(shifted.correct)


def test_balanced_sample_equal_shares():
    train, _ = make_splits(ArithConfig())
    drawn = balanced_sample(train, 300, random.Random(0))
    assert Counter(p.kind for p in drawn) == {"add": 100, "mul": 100, "add_mul": 100}
    assert balanced_sample(train, 50, random.Random(3)) == balanced_sample(train, 50, random.Random(3))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kinds": ("add", "div")}, "kinds"),
        ({"kinds": ()}, "kinds"),
        ({"kinds": "add"}, "kinds"),
        ({"add_max": 5}, "add_max"),
        ({"mul_max": 0}, "mul_max"),
        ({"n_eval": 100}, "n_eval"),  # not a multiple of 3 kinds
        ({"n_eval": 3000}, "n_eval"),  # would hold out every add_mul problem
        ({"seed": 1.5}, "seed"),
    ],
)
def test_bad_config_names_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ArithConfig(**kwargs)


def test_demonstration_rejects_foreign_ids():
    with pytest.raises(ValueError, match="not an arith id"):
        demonstration(Problem(id="aime:1", question="?", answer="1", kind="add"))


def test_chain_is_opt_in_and_shows_every_running_sum():
    assert "chain" not in ArithConfig().kinds  # the default mix, and so the default tiny model, are unchanged
    train, held_out = make_splits(ArithConfig(kinds=("chain",), n_eval=600))
    assert len(train) + len(held_out) == 10**4 and len(held_out) == 600
    assert all(str(_value(p.question)) == p.answer for p in train[::97] + held_out)
    # 3+4=7, 7+5=12, 12+8=20: three running sums, then the box.
    p = Problem(id="chain:3+4+5+8", question="3+4+5+8", answer="20", kind="chain")
    assert demonstration(p) == "3+4=7 7+5=12 12+8=20 \\boxed{20}"
    sample = held_out[:100]
    assert all(grade([demonstration(q) for q in sample], [q.answer for q in sample]).correct)
    with pytest.raises(ValueError, match="not a chain id"):
        demonstration(Problem(id="chain:3+4+5", question="3+4+5", answer="12", kind="chain"))
