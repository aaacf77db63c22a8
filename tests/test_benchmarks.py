"""Benchmarks and training sets: the real AIME files, the loaders on small fixtures of each layout, grading
with the reward config, and avg@k / pass@k / maj@k on hand-computed cases."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from math import comb
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from harness.config import validate
from harness.loop.evaluate import evaluate, majority, pass_at_k, pass_ks, vote_key
from harness.rewards import grade
from harness.rollout.base import EvalSettings, Rollout
from harness.tasks import load_benchmark, load_training_set
from harness.tasks.loaders import load_benchmark_file, load_dapo_math, load_math, read_rows
from harness.tasks.templates import render
from tests.conftest import compose

ROOT = Path(__file__).resolve().parents[1]
AIME_DIR = ROOT / "data" / "aime"  # the copy in this repository (data/aime/README.md)
AIME24, AIME25 = AIME_DIR / "aime24.jsonl", AIME_DIR / "aime25.jsonl"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def aime_ids(year: int) -> list[str]:
    return [f"{year}-{part}-{i}" for part in ("I", "II") for i in range(1, 16)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def to_parquet(jsonl: Path, out: Path) -> Path:
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out


# ---------------------------------------------------------------- AIME


def test_aime_files_load_with_ids_and_integer_answers():
    for path, year, kind in ((AIME24, 2024, "aime24"), (AIME25, 2025, "aime25")):
        problems = load_benchmark_file(str(path), kind)
        assert [p.id for p in problems] == aime_ids(year)
        assert all(p.kind == kind and p.question.strip() for p in problems)
        assert all(re.fullmatch(r"0|[1-9]\d{0,2}", p.answer) for p in problems)
    # Spot checks against the answer keys data/aime/README.md lists.
    first = {p.id: p.answer for p in load_benchmark_file(str(AIME24), "aime24")}
    assert (first["2024-I-1"], first["2024-I-8"], first["2024-II-15"]) == ("204", "197", "315")


def test_aime24_25_through_the_config_is_both_years():
    raw = compose("benchmark=aime24_25", f"benchmark.path=[{AIME24},{AIME25}]")
    cfg = validate(raw)
    problems = load_benchmark(cfg.benchmark, cfg.data)
    assert len(problems) == 60
    assert [p.id for p in problems] == aime_ids(2024) + aime_ids(2025)
    assert [p.kind for p in problems] == ["aime24"] * 30 + ["aime25"] * 30
    # A prefix takes the years in turns, so a smaller eval keeps the mix.
    cfg = validate(compose("benchmark=aime24_25", f"benchmark.path=[{AIME24},{AIME25}]", "benchmark.max_problems=4"))
    assert [p.id for p in load_benchmark(cfg.benchmark, cfg.data)] == ["2024-I-1", "2025-I-1", "2024-I-2", "2025-I-2"]


def test_aime_benchmarks_read_the_copy_in_this_repository_by_default(monkeypatch):
    """benchmark=aime24 / aime25 / aime24_25 need no network: their default paths are the files in data/aime/,
    relative to the repository root (where run.py is started), and those files are the ones data/aime/README.md
    records (sha256)."""
    monkeypatch.chdir(ROOT)
    readme = (AIME_DIR / "README.md").read_text()
    for path in (AIME24, AIME25):
        assert f"`{path.name}` {hashlib.sha256(path.read_bytes()).hexdigest()}" in readme
    both = aime_ids(2024) + aime_ids(2025)
    for name, ids in (("aime24", aime_ids(2024)), ("aime25", aime_ids(2025)), ("aime24_25", both)):
        cfg = validate(compose(f"benchmark={name}"))
        paths = [cfg.benchmark.path] if isinstance(cfg.benchmark.path, str) else list(cfg.benchmark.path)
        assert paths and all(p.startswith("data/aime/") for p in paths), paths
        assert [p.id for p in load_benchmark(cfg.benchmark, cfg.data)] == ids


def test_every_aime_answer_grades_right_and_its_successor_wrong():
    problems = load_benchmark_file(str(AIME24), "aime24") + load_benchmark_file(str(AIME25), "aime25")
    golds = [p.answer for p in problems]
    right = grade([f"so the answer is \\boxed{{{a}}}" for a in golds], golds)
    padded = grade([f"\\boxed{{{int(a):03d}}}" for a in golds], golds)  # AIME's 3-digit answer sheet form
    wrong = grade([f"\\boxed{{{int(a) + 1}}}" for a in golds], golds)
    assert all(right.correct) and all(padded.correct) and not any(wrong.correct)
    assert right.rewards == [1.0] * 60 and wrong.rewards == [0.0] * 60


@pytest.mark.parametrize(
    "rows,message",
    [
        ([{"id": "a", "problem": "Q"}], r"bench.jsonl:1: missing field 'answer'"),
        ([{"id": "a", "problem": "Q", "answer": "12"}, {"id": "b", "answer": "3"}], r"bench.jsonl:2: missing field"),
        ([{"id": "a", "problem": "Q", "answer": "12.5"}], r"bench.jsonl:1: answer '12.5' is not an integer 0..999"),
        ([{"id": "a", "problem": "Q", "answer": "1000"}], r"bench.jsonl:1: answer '1000' is not an integer"),
        ([{"id": "a", "problem": "Q", "answer": "1"}, {"id": "a", "problem": "R", "answer": "2"}], r"duplicate id"),
    ],
)
def test_bad_benchmark_rows_name_file_and_line(tmp_path, rows, message):
    path = write_jsonl(tmp_path / "bench.jsonl", rows)
    with pytest.raises(ValueError, match=message) as err:
        load_benchmark_file(str(path), "aime24")
    assert "\n" not in str(err.value)


def test_bad_sources_fail_with_one_line(tmp_path):
    (tmp_path / "broken.jsonl").write_text('{"id": "a", "problem": "Q", "answer": "1"}\n{not json\n')
    (tmp_path / "table.csv").write_text("id,problem,answer\n")
    cases = [
        (str(tmp_path / "missing.jsonl"), FileNotFoundError, r"file '.*missing.jsonl' does not exist"),
        ("./also/missing.parquet", FileNotFoundError, r"does not exist"),
        ("not a hub name", FileNotFoundError, r"does not exist"),
        (str(tmp_path / "broken.jsonl"), ValueError, r"broken.jsonl:2 is not valid JSON"),
        (str(tmp_path / "table.csv"), ValueError, r"type '.csv'; allowed: .jsonl, .parquet"),
        (str(tmp_path), ValueError, r"is a directory"),
    ]
    for source, exc, message in cases:
        with pytest.raises(exc, match=message) as err:
            load_benchmark_file(source, "aime24")
        assert "\n" not in str(err.value)


def test_bad_benchmark_configs_fail_with_one_line():
    cases = [
        (["benchmark=aime24_25", "benchmark.path=/a.jsonl"], r"benchmark.path: benchmark=aime24_25 needs 2 source"),
        (["benchmark=aime24", "benchmark.path=null"], r"benchmark.path: benchmark=aime24 needs 1 source"),
        (["benchmark.path=/a.jsonl"], r"benchmark.path: benchmark=arith is generated"),
        (["benchmark.name=aime26"], r"benchmark.name: expected 'arith' \| 'aime24'"),
        (["data=math_lvl3to5", "data.levels=[0,3]"], r"data.levels: MATH levels are 1..5"),
        (["reward.fallback_pattern='(unclosed'"], r"reward.fallback_pattern: '\(unclosed' is not a valid regex"),
        (["reward.scheme=ternary"], r"reward.scheme: expected 'binary' \| 'signed'"),
    ]
    for overrides, message in cases:
        with pytest.raises(ValueError, match=message) as err:
            validate(compose(*overrides))
        assert "\n" not in str(err.value)


@pytest.mark.slow  # starts a Python process
def test_hub_name_without_network_says_to_pass_a_local_file():
    # A fresh interpreter, so the offline switches are read at import; they also keep the test off the network.
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    code = (
        "from harness.tasks.loaders import read_rows\nnext(read_rows('HuggingFaceH4/aime_2024', key='benchmark.path'))"
    )
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    last = res.stderr.strip().splitlines()[-1]
    assert res.returncode != 0
    assert last.startswith("ValueError: benchmark.path: hub dataset 'HuggingFaceH4/aime_2024' (split 'train')")
    assert "could not be downloaded" in last and "pass a local .jsonl or .parquet file instead" in last


# ---------------------------------------------------------------- training sets


def test_dapo_verl_layout_jsonl_and_parquet(tmp_path):
    jsonl = FIXTURES / "dapo_verl.jsonl"
    for source in (jsonl, to_parquet(jsonl, tmp_path / "dapo.parquet")):
        problems, counts = load_dapo_math(str(source))
        # 8 rows: 2 repeats of d-001 (one differs only in whitespace), 1 empty answer, 1 answer "?" math-verify
        # cannot parse; DAPO's instruction is stripped from the rest.
        assert counts == {"rows": 8, "other_level": 0, "duplicates": 2, "no_answer": 1, "ungradable": 1, "kept": 4}
        assert [(p.id, p.answer) for p in problems] == [
            ("dapo-d-001", "7"),
            ("dapo-d-002", "28"),
            ("dapo-d-004", "\\frac{3}{4}"),
            ("dapo-d-007", "6"),
        ]
        assert problems[0].question == "A box holds 3 red and 4 blue marbles. How many marbles are in the box?"
        assert all(p.kind == "dapo" and "Answer:" not in p.question for p in problems)
    kept, _ = load_dapo_math(str(jsonl), keep_instruction=True)
    assert kept[0].question.startswith("Solve the following math problem") and len(kept) == 4


def test_dapo_simple_layout():
    problems, counts = load_dapo_math(str(FIXTURES / "dapo_simple.jsonl"))
    # s3 repeats s1's text (its different answer loses); s2 differs inside the math, so it is a new problem.
    assert counts["duplicates"] == 1 and counts["kept"] == 3
    assert [(p.id, p.answer) for p in problems] == [("dapo-s1", "4"), ("dapo-s2", "4"), ("dapo-s4", "7")]


def test_math_levels_last_box_dedup_and_filter(tmp_path):
    jsonl = FIXTURES / "math.jsonl"
    for source in (jsonl, to_parquet_math(jsonl, tmp_path / "math.parquet")):
        problems, counts = load_math(str(source))
        # 9 rows: Level 2 and "Level ?" are out; one repeat; one solution without a box; one \boxed{\text{}}.
        assert counts == {"rows": 9, "other_level": 2, "duplicates": 1, "no_answer": 1, "ungradable": 1, "kept": 4}
        assert [(p.id, p.answer) for p in problems] == [
            ("math-l3-2", "5"),
            ("math-l4-3", "3"),  # the last box of the solution, not the first
            ("math-l5-4", "\\frac{1}{2}"),
            ("math-l5-9", "4"),  # an integer level works too
        ]
    assert [p.id for p in load_math(str(jsonl), levels=(5,))[0]] == ["math-l5-4", "math-l5-9"]


def to_parquet_math(jsonl: Path, out: Path) -> Path:
    # Parquet columns have one type: write the levels as MATH does ("Level 5").
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    for r in rows:
        r["level"] = r["level"] if isinstance(r["level"], str) else f"Level {r['level']}"
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out


def test_training_sets_through_the_config(tmp_path):
    cfg = validate(compose("data=dapo_math", f"data.path={FIXTURES / 'dapo_verl.jsonl'}"))
    assert cfg.data.template == "qwen_math"
    assert len(load_training_set(cfg.data)) == 4
    cfg = validate(compose("data=math_lvl3to5", f"data.path={FIXTURES / 'math.jsonl'}", "data.levels=[4,5]"))
    # Without level 3, row 6 (level 4) is no longer a repeat of row 2.
    assert [p.id for p in load_training_set(cfg.data)] == ["math-l4-3", "math-l5-4", "math-l4-6", "math-l5-9"]
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"problem": "Q"}])
    with pytest.raises(ValueError, match=r"bad.jsonl:1: missing field 'answer'"):
        load_dapo_math(str(bad))
    empty = write_jsonl(tmp_path / "none.jsonl", [{"problem": "Q", "answer": "?"}])
    with pytest.raises(ValueError, match=r"has no usable problems \(rows 1, .* ungradable 1"):
        load_dapo_math(str(empty))


def test_rows_carry_their_location(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", [{"a": 1}, {"a": 2}])
    (tmp_path / "r.jsonl").write_text((tmp_path / "r.jsonl").read_text().replace("\n", "\n\n", 1))
    rows = [(where.rsplit("/", 1)[1], row) for where, row in read_rows(str(path))]
    assert rows == [("r.jsonl:1", {"a": 1}), ("r.jsonl:3", {"a": 2})]  # line numbers count the blank line


# ---------------------------------------------------------------- templates and reward config


def test_qwen_math_template_is_question_then_instruction():
    text = render(None, "What is $1+1$?", "qwen_math")
    assert text == "What is $1+1$? Please reason step by step, and put your final answer within \\boxed{}.\n"


def test_reward_config_scheme_and_fallback():
    cfg = validate(compose("reward.scheme=signed", "reward.fallback_pattern='Answer:\\s*(.+)'", "reward.timeout_s=2"))
    kw = cfg.reward.grade_kwargs()
    assert (kw["correct"], kw["wrong"], kw["timeout_s"]) == (1.0, -1.0, 2.0)
    texts = ["work...\nAnswer: 42", "Answer: $41$.", "no answer at all", "Answer: 1\n\\boxed{42}", "\\boxed{42}"]
    result = grade(texts, ["42"] * 5, [True, True, True, True, False], **kw)
    assert result.rewards == [1.0, -1.0, -1.0, 1.0, -1.0]  # a box wins over the pattern; truncated is wrong
    assert result.extracted == ["42", "41", None, "42", None]
    assert result.format_fail == [False, False, True, False, False]
    assert grade(texts[:1], ["42"]).correct == [False]  # without the pattern only boxes count


# ---------------------------------------------------------------- avg@k, pass@k, maj@k


def test_pass_at_k_hand_values():
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)  # 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 4, 1) == 1.0 and pass_at_k(4, 1, 1) == 0.25
    assert pass_at_k(32, 3, 32) == 1.0
    assert pass_at_k(16, 5, 4) == pytest.approx(1 - comb(11, 4) / comb(16, 4))
    assert pass_ks(32) == [1, 2, 4, 8, 16, 32] and pass_ks(6) == [1, 2, 4, 6] and pass_ks(1) == [1]
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(2, 1, 3)


def test_majority_vote():
    assert vote_key(" 0 42 ") == "42" and vote_key("$\\frac{1}{2}$") == "\\frac{1}{2}"
    # 6 twice beats one correct 5.
    assert majority(["5", "6", "6", None], [True, False, False, False]) == ("6", False)
    # "07" and "7" are both correct: one group of 2, tied with "8" x2; the group seen first wins.
    assert majority(["07", "8", "7", "8"], [True, False, True, False]) == ("07", True)
    assert majority(["8", "07", "8", "7"], [False, True, False, True]) == ("8", False)
    # Correct answers written differently (math-verify found them equal) vote together.
    assert majority(["0.5", "\\frac{1}{2}", "1/3", "1/3"], [True, True, False, False]) == ("0.5", True)
    assert majority([None, None], [False, False]) == (None, False)


class ScriptedEngine:
    """A rollout engine that returns fixed completions: evaluate's bookkeeping is what these tests check."""

    def __init__(self, texts: list[str], finished: list[bool], max_model_len: int | None = None) -> None:
        self.texts, self.finished, self.max_model_len = texts, finished, max_model_len
        self.prompts: list[list[int]] = []

    def generate(
        self, prompts, n, max_new_tokens, topk=1, temperature=1.0, seed=None, top_p=1.0, progress=None
    ) -> Rollout:
        self.prompts, self.progress = prompts, progress
        b, t = len(prompts) * n, 3
        assert len(self.texts) == b
        return Rollout(
            prompt_ids=[p for p in prompts for _ in range(n)],
            response_ids=torch.zeros(b, t, dtype=torch.long),
            mask=torch.ones(b, t),
            behavior_logp=torch.zeros(b, t),
            topk_ids=torch.zeros(b, t, 1, dtype=torch.long),
            topk_logp=torch.zeros(b, t, 1),
            finished=torch.tensor(self.finished),
            group=torch.arange(len(prompts)).repeat_interleave(n),
            texts=list(self.texts),
        )


def test_evaluate_hand_computed_scores():
    problems = [
        SimpleNamespace(id="p0", question="Q0", answer="5", kind="aime24"),
        SimpleNamespace(id="p1", question="Q1", answer="7", kind="aime25"),
    ]
    texts = [
        "\\boxed{5}", "\\boxed{6}", "\\boxed{6}", "no box",  # p0: 1 of 4 correct; 6 wins the vote
        "\\boxed{07}", "\\boxed{7}", "\\boxed{8}", "\\boxed{7}",  # p1: 3 correct, the last one truncated
    ]  # fmt: skip
    finished = [True] * 7 + [False]
    engine = ScriptedEngine(texts, finished)
    settings = EvalSettings(n=4, max_new_tokens=3, temperature=1.0, seed=0, samples_to_keep=1)
    record, samples = evaluate(engine, [[1, 2], [3]], problems, settings)
    # p0: c=1, p1: c=2 (the truncated \boxed{7} is not graded).
    assert record["avg@4"] == pytest.approx(3 / 8)
    assert record["pass@1"] == pytest.approx(3 / 8)
    assert record["pass@2"] == pytest.approx(((1 - 3 / 6) + (1 - 1 / 6)) / 2)  # C(3,2)/C(4,2), C(2,2)/C(4,2)
    assert record["pass@4"] == 1.0
    assert record["maj@4"] == 0.5  # p0 votes 6 (wrong); p1 votes 7 (07 and 7 together: 2 vs 8 once)
    assert record["acc/aime24"] == 0.25 and record["acc/aime25"] == 0.5
    assert record["format_fail_frac"] == 1 / 8 and record["truncated_frac"] == 1 / 8
    assert record["prompt_truncated_frac"] == 0.0 and record["n_problems"] == 2
    assert record["problems"] == [
        {"id": "p0", "kind": "aime24", "answer": "5", "n": 4, "correct": 1, "maj": "6", "maj_correct": False,
         "predictions": ["5", "6", "6", None]},
        {"id": "p1", "kind": "aime25", "answer": "7", "n": 4, "correct": 2, "maj": "07", "maj_correct": True,
         "predictions": ["07", "7", "8", None]},
    ]  # fmt: skip
    assert samples == [
        {"id": "p0", "question": "Q0", "completion": "\\boxed{5}", "answer": "5", "prediction": "5", "correct": True}
    ]
    json.dumps(record)  # the eval.jsonl line is plain JSON
    assert engine.progress == "eval 2 problems x 4"  # the engine's progress bar (tests/test_rollout.py)


def test_evaluate_cuts_or_rejects_over_long_prompts():
    problems = [SimpleNamespace(id="p0", question="Q", answer="1", kind="k")]
    engine = ScriptedEngine(["\\boxed{1}"], [True], max_model_len=6)
    with pytest.raises(ValueError, match=r"1 prompt\(s\) up to 5 tokens do not fit model.max_model_len=6"):
        evaluate(engine, [[1, 2, 3, 4, 5]], problems, EvalSettings(n=1, max_new_tokens=3, temperature=1.0, seed=0))
    cut = EvalSettings(n=1, max_new_tokens=3, temperature=1.0, seed=0, truncate_prompts=True)
    record, _ = evaluate(engine, [[1, 2, 3, 4, 5]], problems, cut)
    assert engine.prompts == [[3, 4, 5]] and record["prompt_truncated_frac"] == 1.0 and record["avg@1"] == 1.0


def test_bench_summary_says_why_a_results_file_has_no_rows(tmp_path):
    """bench.summary tabulates the summary rows of bench/results/*.json and names each file that has none, with
    the reason: B4 (rl_step) run without TRL has no baseline to take a ratio to, which is not an old file."""
    from bench.summary import load_summaries

    row = {"id": "B1", "case": "c", "metric": "m", "value": 1.5, "target": ">= 1", "met": True}
    (tmp_path / "logprobs.json").write_text(json.dumps({"meta": {}, "rows": [], "summary": [row]}))
    (tmp_path / "rl_step.json").write_text(json.dumps({"meta": {"trl": None}, "rows": [{}], "summary": []}))
    (tmp_path / "rollout.json").write_text(json.dumps({"rows": []}))
    (tmp_path / "topk.json").write_text("{torn")
    rows, notes = load_summaries(tmp_path)
    assert rows == [row]
    assert notes == [
        "topk.json: unreadable (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))",
        "rollout.json: no summary block (written before bench.common, or by an older script)",
        "rl_step.json: no target checked: trl was not installed, so no baseline (make bench)",
    ]


def test_b6_ceiling_by_hand():
    """B6's ceiling: the engine's one-core time leaves the trainer its share of the cores, the rest of the updates
    get every core at best. Synchronous 0.9 s (generation 0.4, updates 0.4 on every core, 0.1 else), updates 0.8 s
    on the trainer's share: a k > 0 step needs 0.4 + 0.4 * (1 - 0.4 / 0.8) + 0.1 = 0.7 s at least. An engine
    slower than the updates (1.0 s) bounds the step alone: 1.0 + 0.1."""
    from bench.async_step import ceiling

    every_core = {"step_s": 0.9, "gen_s": 0.4, "train_s": 0.4}
    assert ceiling(every_core, {"gen_s": 0.4, "train_s": 0.8}) == pytest.approx(0.9 / 0.7)
    assert ceiling(every_core, {"gen_s": 1.0, "train_s": 0.8}) == pytest.approx(0.9 / 1.1)
