"""RLHF with a learned reward (harness/reward_model.py, harness/tasks/rlhf.py): the tiny reward model's score is a
known function of the text, batched scores equal single forwards, non-reward-model folders are refused in one
line, and the UltraFeedback / HH-RLHF loaders read their layouts. No training here: each test takes ~a second."""

from __future__ import annotations

import json

import pytest
import torch

from harness.reward_model import (
    RewardModel,
    build_tiny_reward_model,
    check_reward_model_path,
    conversation,
    digit_signs,
    tiny_score,
)
from harness.tasks import render_prompts
from harness.tasks.rlhf import load_hh_rlhf, load_ultrafeedback, parse_transcript
from tests.conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures"


@pytest.fixture(scope="module")
def tokenizer(small_model):
    from transformers import AutoTokenizer

    from harness.config import compose, validate
    from harness.loop.model_path import model_dir

    return AutoTokenizer.from_pretrained(str(model_dir(validate(compose(*small_model)))))


def chat(question: str, answer: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


def test_tiny_reward_model_scores_a_known_function_of_the_text(tokenizer):
    rm = RewardModel.load("tiny", policy_tokenizer=tokenizer, batch_size=3)
    answers = ["hello there", "the answer is 4", "12+34=46", "1 2 3 4 5 6 7 8 9 10"]
    convs = [chat("What is 2+2?", a) for a in answers]
    scores = rm.score(convs)
    assert scores == sorted(scores) and len(set(scores)) == 4  # more digit tokens, higher reward
    signs = digit_signs(tokenizer)
    for conv, score in zip(convs, scores, strict=True):
        ids = rm.encode(conv)  # through the tokenizer's chat template: <|user|>Q<|assistant|>A<|end|>
        assert (
            ids == tokenizer(tokenizer.apply_chat_template(conv, tokenize=False), add_special_tokens=False)["input_ids"]
        )
        with torch.no_grad():
            direct = float(rm.model(input_ids=torch.tensor([ids])).logits[0, 0])
        assert score == pytest.approx(direct, abs=1e-6)  # batched and padded == one unpadded forward
        assert score == pytest.approx(tiny_score(float(signs[ids].mean())), abs=1e-5)
    assert tiny_score(-1.0) == pytest.approx(-1.0) and tiny_score(1.0) == pytest.approx(1.0)


def test_a_row_ending_in_the_pad_token_is_read_at_its_real_end(tokenizer):
    rm = RewardModel(build_tiny_reward_model(tokenizer), tokenizer, batch_size=4)
    pad, digit = tokenizer.pad_token_id, tokenizer.convert_tokens_to_ids("7")
    rows = [[digit, digit, pad], [digit], [pad, pad, digit, digit, digit, digit]]
    rm.model.config.pad_token_id = None  # one unpadded row: the head reads its last position, whatever the token
    with torch.no_grad():
        single = [float(rm.model(input_ids=torch.tensor([r])).logits[0, 0]) for r in rows]
    # HF's head reads each row at its last token that is not the pad id: row 0 would be read one token early.
    assert rm.score_ids(rows) == pytest.approx(single, abs=1e-6)


def test_reward_model_folder_loads_and_scores_like_the_built_one(tokenizer, tmp_path):
    built = build_tiny_reward_model(tokenizer)
    built.save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    check_reward_model_path(str(tmp_path / "rm"))
    loaded = RewardModel.load(str(tmp_path / "rm"), batch_size=2)
    convs = [chat("Say a number", "42"), chat("Say a word", "cat")]
    assert loaded.score(convs) == pytest.approx(RewardModel(built, tokenizer).score(convs), abs=1e-6)


def test_a_folder_that_is_not_a_reward_model_is_refused_in_one_line(tmp_path, small_model):
    from harness.config import compose, validate
    from harness.loop.model_path import model_dir

    causal = str(model_dir(validate(compose(*small_model))))
    with pytest.raises(ValueError) as err:
        check_reward_model_path(causal)
    assert str(err.value).startswith("reward.model_path: ") and "Qwen3ForCausalLM" in str(err.value)
    two = tmp_path / "two"
    two.mkdir()
    (two / "config.json").write_text(json.dumps({"architectures": ["LlamaForSequenceClassification"],
                                                 "id2label": {"0": "a", "1": "b"}}))  # fmt: skip
    with pytest.raises(ValueError, match="^reward.model_path: .* has 2 output labels"):
        check_reward_model_path(str(two))
    with pytest.raises(ValueError, match="^reward.model_path: .* not a sequence-classification"):
        RewardModel.load(causal)


def test_ultrafeedback_and_hh_rlhf_layouts(tmp_path):
    problems, counts = load_ultrafeedback(str(FIXTURES / "ultrafeedback.jsonl"))
    assert counts == {"rows": 25, "unreadable": 0, "duplicates": 1, "kept": 24}
    assert problems[0].messages == (("user", "What is 12+7?"),) and problems[0].id == "ultrafeedback-train000"
    rows = [
        {"instruction": "openbmb layout"},
        {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "verl layout"}]},
        {"chosen": [{"role": "user", "content": "chat only"}, {"role": "assistant", "content": "ok"}]},
    ]
    path = tmp_path / "uf.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    turns = [p.messages for p in load_ultrafeedback(str(path))[0]]
    assert turns == [(("user", "openbmb layout"),), (("system", "Be brief."), ("user", "verl layout")),
                     (("user", "chat only"),)]  # fmt: skip

    problems, counts = load_hh_rlhf(str(FIXTURES / "hh_rlhf.jsonl"))
    assert counts["unreadable"] == 1 and counts["kept"] == 12  # the malformed transcript is skipped
    assert problems[0].messages == (("user", "What is 5+5?"), ("assistant", "10."), ("user", "And 10+10?"))
    assert problems[0].question.endswith("\n\nHuman: And 10+10?\n\nAssistant:")
    assert parse_transcript("\n\nAssistant: starts with the answer") is None
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "no layout"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: expected 'chosen'"):
        load_hh_rlhf(str(bad))


def test_multi_turn_prompts_go_through_the_chat_template(tokenizer):
    problems, _ = load_hh_rlhf(str(FIXTURES / "hh_rlhf.jsonl"))
    (ids,) = render_prompts(tokenizer, problems[:1], "chat")
    assert tokenizer.decode(ids) == "<|user|>What is 5+5?<|assistant|>10.<|end|><|user|>And 10+10?<|assistant|>"
    # The reward model sees the same turns plus the completion as the assistant's answer.
    assert conversation(problems[0], "20.")[-2:] == [
        {"role": "user", "content": "And 10+10?"},
        {"role": "assistant", "content": "20."},
    ]


@pytest.mark.slow  # trains the small model
def test_rlhf_run_trains_on_reward_model_scores_and_reports_rm_score(tmp_path, small_model, monkeypatch):
    from harness.config import validate
    from harness.loop.train import train
    from harness.rundir.files import read_jsonl
    from tests.conftest import FAST_TRAINER, compose

    calls: list[tuple[list, list[str], list[float]]] = []
    original = RewardModel.rewards

    def record(self, problems, completions):
        scores, metrics = original(self, problems, completions)
        calls.append((list(problems), list(completions), scores))
        return scores, metrics

    monkeypatch.setattr(RewardModel, "rewards", record)
    raw = compose(
        *small_model,
        *FAST_TRAINER,
        "rollout=hf",
        "reward.kind=reward_model",
        "reward.model_path=tiny",
        "data=ultrafeedback",
        f"data.path={FIXTURES / 'ultrafeedback.jsonl'}",
        "benchmark=ultrafeedback",
        f"benchmark.path={FIXTURES / 'ultrafeedback_test.jsonl'}",
        "trainer.total_steps=2",
        "trainer.eval_every=2",
        "trainer.lr=1e-3",
    )
    summary = train(validate(raw), tmp_path / "run", raw)
    assert summary["status"] == "completed" and summary["score_key"] == "rm_score"
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    evals = read_jsonl(tmp_path / "run" / "eval.jsonl")
    assert [e["step"] for e in evals] == [0, 2] and summary["final_score"] == evals[-1]["rm_score"]
    # Calls: eval 0, step 1, step 2, eval 2. Each step's reward is the reward model's score of its completions.
    assert len(calls) == 4
    for row, (problems, _, scores) in zip(rows, calls[1:3], strict=True):
        assert row["reward/mean"] == pytest.approx(sum(scores) / len(scores), abs=1e-6)
        assert len(set(scores)) > 1 and row["optim/updates"] > 0  # scores differ within groups: updates happen
        assert {p.kind for p in problems} == {"ultrafeedback"}
    for (_, _, scores), e in zip((calls[0], calls[3]), evals, strict=True):
        assert e["rm_score"] == pytest.approx(sum(scores) / len(scores), abs=1e-6)
        assert e["n_problems"] == 6 and len(e["problems"]) == 6
    # A logged score is the reward model's own forward of that (prompt, completion).
    from transformers import AutoTokenizer

    from harness.loop.model_path import model_dir

    tok = AutoTokenizer.from_pretrained(str(model_dir(validate(raw))))
    rm = build_tiny_reward_model(tok)
    problems, texts, scores = calls[1]
    ids = tok(tok.apply_chat_template(conversation(problems[0], texts[0]), tokenize=False), add_special_tokens=False)
    with torch.no_grad():
        assert float(rm(input_ids=torch.tensor([ids["input_ids"]])).logits[0, 0]) == pytest.approx(scores[0], abs=1e-6)
