import os
import signal
import threading
import time
from pathlib import Path

import pytest

from harness.rewards import MAX_BOX_CHARS, grade

# 9^(9^(9^9)): math-verify/sympy grind on it for minutes (measured: still running after 100 s).
BOMB = "\\boxed{9^{9^{9^{9}}}}"
NESTED = "\\boxed{" + "\\frac{" * 60 + "1" + "}{2}" * 60 + "}"  # 60-deep fraction: parses for seconds
# Parse time grows exponentially with brace depth (measured: depth 10 ~2 s, 15 ~18 s, 20 > 20 s).
DEEP_BRACES = "\\boxed{" + "{" * 30 + "42" + "}" * 30 + "}"


def _in_thread(fn):
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("value", fn()))
    thread.start()
    thread.join()
    return out["value"]


# (completion, finished, correct, format_fail)
CASES = [
    ("so 6*7=42, \\boxed{42}", True, True, False),
    ("\\boxed{41}", True, False, False),
    ("\\boxed{042}", True, True, False),  # leading zeros are the same integer
    ("\\boxed{42.0}", True, True, False),
    ("\\boxed{\\frac{84}{2}}", True, True, False),
    ("the answer is 42", True, False, True),  # no box: bare numbers are not accepted
    ("$42$", True, False, True),
    ("\\boxed{42}", False, False, False),  # truncated: not even parsed
    ("\\boxed{41}\\boxed{42}", True, True, False),  # the last box is the answer
    ("\\boxed{42}\\boxed{41}", True, False, False),
    ("\\boxed{\\boxed{42}}", True, True, False),
    ("\\boxed{42", True, False, True),  # unclosed
    ("\\boxed{}", True, False, True),
    ("\\boxed{41} and then \\boxed{42", True, False, False),  # the last *complete* box
    ("\\boxed{ oops \\boxed{42}", True, True, False),  # an unclosed box does not swallow a later one
    ("\\boxed{4}2}", True, False, False),
    ("}}}{{{\\boxed \\\\ \x00 ☃ \\boxed{\\frac{", True, False, True),  # garbage
    # Escaped braces do not end the box early; math-verify equates the singleton set {42} with 42.
    ("\\boxed{\\{42\\}}", True, True, False),
    ("\\boxed{" + "{" * 500 + "42" + "}" * 500 + "}", True, False, True),  # parser recursion limit, no crash
    ("\\boxed{" * 5000, True, False, True),  # linear-time scan: this must not take seconds
    ("\\boxed{" + "1" * (MAX_BOX_CHARS + 1) + "}", True, False, True),
]


def test_grading_table():
    completions, finished, want_correct, want_fail = map(list, zip(*CASES, strict=True))
    start = time.perf_counter()
    result = grade(completions, ["42"] * len(CASES), finished, timeout_s=5.0)
    assert time.perf_counter() - start < 5.0
    assert result.correct == want_correct
    assert result.format_fail == want_fail
    assert result.rewards == [1.0 if c else 0.0 for c in want_correct]
    assert not any(result.timed_out)
    assert result.metrics == {
        "reward/format_fail_frac": pytest.approx(sum(want_fail) / len(CASES)),
        "reward/timeout_frac": 0.0,
        "reward/truncated_frac": pytest.approx(1 / len(CASES)),
    }


def test_reward_values_and_non_integer_golds():
    result = grade(["\\boxed{1/2}", "\\boxed{0.5}", "\\boxed{\\frac{1}{3}}", "none"], ["\\frac{1}{2}"] * 4,
                   correct=2.0, wrong=-1.0)  # fmt: skip
    assert result.rewards == [2.0, 2.0, -1.0, -1.0]
    assert result.format_fail == [False, False, False, True]


def test_require_boxed_off_accepts_latex_anywhere():
    text = "the answer is $42$"
    assert grade([text], ["42"], require_boxed=False).correct == [True]
    assert grade([text], ["42"]).format_fail == [True]


def test_model_text_is_never_executed(tmp_path: Path):
    marker = tmp_path / "pwned"
    payload = f"__import__('os').system('touch {marker}')"
    loose = grade([f"\\boxed{{{payload}}}", payload], ["0", "0"], require_boxed=False)
    strict = grade([f"\\boxed{{{payload}}}"], ["0"])
    assert not marker.exists() and not any(loose.correct + strict.correct)


def test_empty_and_mismatched_inputs():
    empty = grade([], [])
    assert empty.rewards == [] and empty.metrics["reward/timeout_frac"] == 0.0
    with pytest.raises(ValueError, match="same length"):
        grade(["\\boxed{1}"], ["1", "2"])
    with pytest.raises(ValueError, match="same length"):
        grade(["\\boxed{1}"], ["1"], [True, False])
    with pytest.raises(ValueError, match="timeout_s"):
        grade(["\\boxed{1}"], ["1"], timeout_s=0)
    with pytest.raises(ValueError, match="workers"):
        grade(["\\boxed{1}"], ["1"], workers=-1)
    with pytest.raises(ValueError, match="gold answer"):
        grade(["\\boxed{1}"], ["\\frac{"])


def test_worker_thread_grades_like_the_main_thread():
    completions = [f"\\boxed{{{i % 7}}}" for i in range(40)]
    answers = [str(i % 5) for i in range(40)]
    main = grade(completions, answers)
    threaded = _in_thread(lambda: grade(completions, answers))
    assert threaded.correct == main.correct
    # i % 7 == i % 5 for i in 0..4 and 35..39: ten correct, so a silent all-zero failure cannot pass.
    assert sum(main.correct) == 10
    assert grade(completions, answers, workers=2).correct == main.correct


@pytest.mark.serial  # a wall-clock bound: measured with no other test competing for the cores
def test_pathological_input_is_cut_at_the_limit():
    completions = ["\\boxed{42}", BOMB, NESTED, DEEP_BRACES, "\\boxed{42}"]
    start = time.perf_counter()
    result = grade(completions, ["42"] * 5, timeout_s=0.5)
    # Three limits of 0.5 s, and the limit is not charged to the cheap completions around them.
    assert time.perf_counter() - start < 2.5
    assert result.timed_out == [False, True, True, True, False]
    assert result.correct == [True, False, False, False, True]
    assert result.metrics["reward/timeout_frac"] == pytest.approx(3 / 5)


def test_pathological_input_is_killed_off_the_main_thread():
    # Off the main thread the stuck worker process is killed; a fresh one grades the rest.
    completions = ["\\boxed{42}", BOMB, "\\boxed{42}", "\\boxed{41}"]
    result = _in_thread(lambda: grade(completions, ["42"] * 4, timeout_s=0.5))
    assert result.timed_out == [False, True, False, False]
    assert result.correct == [True, False, True, False]


def test_tiny_limit_times_out_legit_inputs():
    # One parse + verify takes ~0.3-1 ms, so a 0.1 ms limit cuts nearly all of them: the limit is really applied.
    # (Fractions, because integer-vs-integer answers take a fast path that never reaches math-verify.)
    result = grade(
        [f"\\boxed{{\\frac{{{i}}}{{7}}}}" for i in range(100)], [f"{i}/7" for i in range(100)], timeout_s=1e-4
    )
    assert result.metrics["reward/timeout_frac"] > 0.5
    assert not any(c and t for c, t in zip(result.correct, result.timed_out, strict=True))


def test_outer_alarm_is_left_alone():
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(True))
    signal.setitimer(signal.ITIMER_REAL, 100.0)
    try:
        assert grade(["\\boxed{3}"], ["3"]).correct == [True]  # graded in the pool instead
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0 < remaining <= 100.0 and signal.getsignal(signal.SIGALRM) is not None and not fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


ADVERSARIAL = {
    "200 kB of nested braces": "\\boxed{" + "{" * 100_000 + "}" * 100_000 + "}",
    "tower of powers": "\\boxed{10^{10^{10^{10}}}}",
    "huge factorial": "\\boxed{99999!}",
    "unbalanced latex": "\\boxed{\\frac{1}{\\left( 2 \\right.}",
    "NUL bytes": "\\boxed{4\x002}",
    "invalid UTF-8 (surrogate escapes)": b"\\boxed{\xff\xfe42}".decode("utf-8", "surrogateescape"),
}


@pytest.mark.serial  # a wall-clock bound: measured with no other test competing for the cores
@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_adversarial_completions_finish_within_the_limit(name):
    t0 = time.perf_counter()
    result = grade([ADVERSARIAL[name]], ["42"], timeout_s=1.0)
    elapsed = time.perf_counter() - t0
    assert result.rewards == [0.0]
    assert elapsed < 1.0 + 0.5, f"{name}: {elapsed:.2f} s"


def test_integer_fast_path_only_takes_plain_ascii_integers():
    # "\x1f30" once crashed int(); Unicode digits and control characters go to math-verify instead.
    result = grade(["\\boxed{\x1f30}", "\\boxed{٣}", "\\boxed{ 30 }", "\\boxed{+30}"], ["30", "3", "30", "30"])
    assert result.correct[2:] == [True, True]
    assert len(result.rewards) == 4


def test_grading_512_completions_uses_every_core():
    # Fractions go through math-verify (integers take a fast path that needs no worker).
    answers = [f"\\frac{{{i % 13 + 1}}}{{{i % 7 + 2}}}" for i in range(512)]
    completions = [f"so \\boxed{{{a}}}" if i % 4 else "\\boxed{\\frac{1}{1000}}" for i, a in enumerate(answers)]
    result = grade(completions, answers, workers=0)
    assert result.processes == os.cpu_count()
    assert result.correct == [i % 4 != 0 for i in range(512)]
    assert grade(["\\boxed{7}"], ["7"], workers=0).processes == 0  # the integer fast path starts no worker
