import hashlib
import os
import time
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from safetensors.torch import load_file

from harness.models import (
    BUILD_VERSION,
    CHAT_TEMPLATE,
    SPECIAL_TOKENS,
    TinyModelConfig,
    build_tiny,
    default_cache_dir,
    load_policy,
    tiny_model_dir,
)
from harness.rewards import grade
from harness.tasks.arith import ArithConfig, demonstration, make_splits
from harness.tasks.templates import BOXED_SUFFIX, QWEN_MATH_SUFFIX, render

SMALL = TinyModelConfig(
    vocab_size=300, hidden_size=64, num_layers=2, head_dim=16, intermediate_size=128,
    sft_steps=5, sft_batch=16, sft_warmup=2, corpus_size=2000,
)  # fmt: skip
TASK = ArithConfig(kinds=("add", "add_mul"), n_eval=40)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return build_tiny(SMALL, TASK, tmp_path_factory.mktemp("cache"), progress=False)


@pytest.mark.slow  # builds a tiny model
def test_build_caches_atomically(built: Path):
    assert built == tiny_model_dir(SMALL, TASK, built.parent) and built.name.startswith("tiny-")
    # No temp folder left behind; the builders' lock file stays (removing it would race a waiter).
    assert sorted(p.name for p in built.parent.iterdir()) == sorted([built.name, f".{built.name}.lock"])
    weights = built / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    start = time.perf_counter()
    assert build_tiny(SMALL, TASK, built.parent, progress=False) == built
    assert time.perf_counter() - start < 1.0 and weights.stat().st_mtime_ns == mtime
    # Any config change is a different model.
    assert tiny_model_dir(TinyModelConfig(), TASK, built.parent) != built
    assert tiny_model_dir(SMALL, ArithConfig(), built.parent) != built


@pytest.mark.slow  # builds a tiny model
def test_a_second_builder_waits_for_the_first_and_reuses_its_model(built: Path, tmp_path: Path):
    """Two runs starting on an empty cache (the findings suite's first two jobs): the one that finds the build
    lock held starts nothing of its own, and returns the model the holder leaves."""
    import fcntl
    import shutil
    import threading

    final = tiny_model_dir(SMALL, TASK, tmp_path)
    result: list[Path] = []
    with open(tmp_path / f".{final.name}.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # the first builder, mid-build
        waiter = threading.Thread(target=lambda: result.append(build_tiny(SMALL, TASK, tmp_path, progress=False)))
        waiter.daemon = True
        waiter.start()
        waiter.join(timeout=3.0)
        # Without the lock the waiter would by now be building in a temp folder of its own, or done with it.
        assert waiter.is_alive() and not result
        assert sorted(p.name for p in tmp_path.iterdir()) == [f".{final.name}.lock"]
        shutil.copytree(built, final)  # the first builder's rename
    waiter.join(timeout=10.0)
    assert result == [final]
    assert (final / "model.safetensors").read_bytes() == (built / "model.safetensors").read_bytes()


@pytest.mark.slow  # builds a tiny model
def test_a_killed_builders_half_written_folder_is_removed_by_the_next_build(tmp_path: Path):
    """A builder killed mid-build (SIGTERM, OOM) leaves its temp folder; the next builder, holding the lock,
    knows no one else is building and removes it."""
    final = tiny_model_dir(SMALL, TASK, tmp_path)
    dead = tmp_path / f".{final.name}-k1ll3d"
    dead.mkdir()
    (dead / "model.safetensors").write_bytes(b"half")
    assert build_tiny(SMALL, TASK, tmp_path, progress=False) == final
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([final.name, f".{final.name}.lock"])


@pytest.mark.slow  # builds a tiny model
def test_reload_restores_every_weight(built: Path):
    saved = load_file(built / "model.safetensors")
    model, tokenizer = load_policy(str(built))
    state = model.state_dict()
    for name, tensor in saved.items():
        assert torch.equal(state[name], tensor), name
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied
    # Nothing was left to random init: two loads give bit-identical logits.
    again, _ = load_policy(str(built))
    ids = tokenizer([render(tokenizer, "What is 3+4*5?")], return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        assert torch.equal(model(**ids).logits, again(**ids).logits)


@pytest.mark.slow  # builds a tiny model
def test_build_is_deterministic(built: Path, tmp_path: Path):
    other = build_tiny(SMALL, TASK, tmp_path, progress=False)
    a, b = load_file(built / "model.safetensors"), load_file(other / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (built / "tokenizer.json").read_bytes() == (other / "tokenizer.json").read_bytes()
    # ... and the seed matters: SFT changed the weights differently.
    reseeded = build_tiny(TinyModelConfig(**{**SMALL.__dict__, "seed": 1}), TASK, tmp_path, progress=False)
    c = load_file(reseeded / "model.safetensors")
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


@pytest.mark.slow  # builds a tiny model
def test_unused_tokens_are_a_tail_the_warm_start_pushes_down(built: Path, tmp_path: Path):
    """model.unused_tokens appends tokens no task string contains: the vocabulary grows by exactly that many, a
    sampled one stays in the decoded text (where it spoils the answer), and SFT takes probability away from them.
    (That the default model keeps its cache name is test_pool.py's check of the name its pool records.)"""
    import dataclasses

    tailed = dataclasses.replace(SMALL, unused_tokens=50, sft_steps=30)
    assert tiny_model_dir(tailed, TASK, tmp_path) != tiny_model_dir(
        dataclasses.replace(tailed, unused_tokens=0), TASK, tmp_path
    )
    model, tok = load_policy(str(build_tiny(tailed, TASK, tmp_path, progress=False)))
    _, plain = load_policy(str(built))
    assert len(tok) == len(plain) + 50 == model.config.vocab_size
    first, last = tok.convert_tokens_to_ids(["<|unused0|>", "<|unused49|>"])
    assert (first, last) == (len(plain), len(plain) + 49)
    answer = (
        tok("\\boxed{1", add_special_tokens=False)["input_ids"]
        + [first]
        + tok("}", add_special_tokens=False)["input_ids"]
    )
    assert tok.decode(answer, skip_special_tokens=True) == "\\boxed{1<|unused0|>}"
    untrained, _ = load_policy(
        str(build_tiny(dataclasses.replace(tailed, sft_steps=0), TASK, tmp_path, progress=False))
    )
    ids = tok([render(tok, "What is 3+4*5?")], return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        tail = [m(**ids).logits[0, -1].softmax(-1)[first:].sum().item() for m in (untrained, model)]
    assert tail[1] < tail[0] < 0.2, tail  # 50 of ~350 tokens start near a uniform share, then lose mass


# The digest of everything the tiny model is built from besides its configs, for each BUILD_VERSION. The cache key
# (tiny_model_dir) holds the configs only, so a change to a question, a demonstration or the chat template would
# otherwise reuse a stale cached model, and the sanity pools' pass rates would belong to a model no one builds.
BUILD_INPUTS = {2: {"default": "cbef60560682c952", "chain": "9e59ef2df7e6cf5c"}}


def _build_inputs_digest(task: ArithConfig) -> str:
    train, held_out = make_splits(task)
    lines = [CHAT_TEMPLATE, *SPECIAL_TOKENS, *(f"{p.id}\t{p.question}\t{demonstration(p)}" for p in train + held_out)]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def test_the_build_inputs_match_the_build_version():
    measured = {
        "default": _build_inputs_digest(ArithConfig()),
        "chain": _build_inputs_digest(ArithConfig(kinds=("chain",))),
    }
    assert measured == BUILD_INPUTS.get(BUILD_VERSION), (
        "the tiny model's training text changed: bump BUILD_VERSION in harness/models.py (cached models are then "
        "rebuilt), remeasure findings/pools/*.json, and record the new digests here"
    )


@pytest.mark.slow  # builds a tiny model
def test_chat_template_and_special_tokens(built: Path):
    model, tok = load_policy(str(built))
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token, tok.pad_token_id) == ("<|end|>", 0, "<|pad|>", 3)
    assert tok.padding_side == "left"
    assert model.generation_config.eos_token_id == 0 and model.generation_config.pad_token_id == 3
    assert model.config.vocab_size == len(tok) <= SMALL.vocab_size
    chat = [{"role": "user", "content": "What is 12+7?"}, {"role": "assistant", "content": "\\boxed{19}"}]
    text = tok.apply_chat_template(chat, tokenize=False)
    assert text == "<|user|>What is 12+7?<|assistant|>\\boxed{19}<|end|>"
    assert render(tok, "What is 12+7?") == "<|user|>What is 12+7?<|assistant|>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<|user|>") and ids[-1] == tok.eos_token_id
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == "What is 12+7?\\boxed{19}"
    with pytest.raises(Exception, match="only user and assistant"):
        tok.apply_chat_template([{"role": "system", "content": "x"}], tokenize=False)


def test_templates():
    assert render(None, "What is 2+2?", "plain") == "What is 2+2?\n"
    assert render(None, "What is 2+2?", "qwen_math") == "What is 2+2?" + QWEN_MATH_SUFFIX + "\n"
    assert QWEN_MATH_SUFFIX == " Please reason step by step, and put your final answer within \\boxed{}."
    with pytest.raises(ValueError, match="chat, plain, qwen_math, chat_boxed"):
        render(None, "q", "alpaca")
    with pytest.raises(ValueError, match="chat_template"):
        render(object(), "q", "chat")
    with pytest.raises(ValueError, match="chat_template"):
        render(object(), "q", "chat_boxed")


def test_chat_boxed_puts_the_instruction_in_the_user_turn():
    class Chat:  # the one method render calls, as a ChatML tokenizer would answer it
        chat_template = "chatml"

        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            (m,) = messages
            return f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n<|im_start|>assistant\n"

    text = render(Chat(), "12+7", "chat_boxed")
    assert text == "<|im_start|>user\n12+7 Put your final answer within \\boxed{}.<|im_end|>\n<|im_start|>assistant\n"
    assert BOXED_SUFFIX == " Put your final answer within \\boxed{}."


@pytest.mark.parametrize("missing", ["/definitely/not/here", "./not-here", "~/not-here", "not a model!"])
def test_load_policy_missing_path_is_one_line(missing):
    with pytest.raises(FileNotFoundError) as err:
        load_policy(missing)
    assert missing in str(err.value) and "\n" not in str(err.value)


def test_load_policy_unreachable_hub_id_is_one_line(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(OSError, match="could not be found locally or downloaded") as err:
        load_policy("no-such-org/no-such-model")
    assert "\n" not in str(err.value) and err.value.__suppress_context__


def test_load_policy_folder_that_is_not_a_model(tmp_path):
    with pytest.raises(OSError, match="is not a loadable model"):
        load_policy(str(tmp_path))


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("HARNESS_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "trust-region-harness"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"hidden_size": 0}, "hidden_size"),
        ({"vocab_size": 100}, "vocab_size"),
        ({"num_heads": 4, "num_kv_heads": 3}, "num_heads"),
        ({"sft_lr": -1.0}, "sft_lr"),
        ({"sft_steps": -1}, "sft_steps"),
    ],
)
def test_bad_tiny_config_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        TinyModelConfig(**kwargs)


@pytest.mark.slow
def test_default_warm_start_accuracy():
    """The default build is the RL starting point: 15-35% held-out accuracy at T=1 (recipe: ~21%)."""
    task = ArithConfig()
    # Built with every core, as `make run` builds it (train() sets that many threads first): the cached model is
    # the one the default run then trains, whichever of the two builds it.
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        model, tok = load_policy(str(build_tiny(TinyModelConfig(), task, default_cache_dir())))
    finally:
        torch.set_num_threads(threads)
    _, held_out = make_splits(task)
    torch.manual_seed(0)
    texts, finished = [], []
    for start in range(0, len(held_out), 200):
        chunk = held_out[start : start + 200]
        enc = tok([render(tok, p.question) for p in chunk], return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=24)
        new = out[:, enc["input_ids"].shape[1] :]
        texts += tok.batch_decode(new, skip_special_tokens=True)
        finished += (new == tok.eos_token_id).any(dim=1).tolist()
    result = grade(texts, [p.answer for p in held_out], finished)
    accuracy = sum(result.correct) / len(held_out)
    assert 0.15 <= accuracy <= 0.35, accuracy
    assert sum(finished) / len(finished) > 0.95  # the warm start learned to stop
