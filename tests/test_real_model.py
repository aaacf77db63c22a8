"""The SmolLM2 folder `make real-model` builds, checked against the GGUF file it came from (harness/real_model.py).

Three references, none of them the build's own code path: the GGUF's tensors dequantised by the `gguf` package and
compared with every saved tensor; a Llama forward written out here on those GGUF tensors, in llama.cpp's layout (its
permuted q/k rows and interleaved rotary pairs), whose log-probs of a fixed conversation the harness's own log-prob
code must reproduce on the saved folder; and transformers' own GGUF load of the file. A weight transposed or left
in llama.cpp's q/k row order, a tokenizer swapped, a lost tied head or a wrong rotary base fails one of them.

Skipped unless `make real-model` has run; `make test-real-model` builds the folder first (CI calls it).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from harness.real_model import CACHE, gguf_path, model_dir

ROOT = Path(__file__).resolve().parents[1]
MODEL, GGUF = model_dir(ROOT / CACHE), gguf_path(ROOT / CACHE)

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.slow,  # loads a 134.5M-parameter model (and the GGUF twice)
    pytest.mark.skipif(
        not ((MODEL / "config.json").is_file() and GGUF.is_file()),
        reason=f"needs the real model: `make real-model` builds {CACHE}/",
    ),
]

# A fixed conversation: the chat_boxed prompt of an arith problem and an answer, ending with the end-of-turn token.
QUESTION = "40+2"
ANSWER = "40 + 2 = 42."


@pytest.fixture(scope="module")
def reader():
    gguf = pytest.importorskip("gguf", reason="the gguf package (the real extra; make real-model installs it)")
    return gguf.GGUFReader(GGUF)


def field(reader, key: str):
    return reader.fields[key].contents()


@pytest.fixture(scope="module")
def gguf_weights(reader) -> dict[str, torch.Tensor]:
    """Every GGUF tensor, dequantised by gguf itself, under its llama.cpp name ([out, in] like torch's Linear)."""
    from gguf.quants import dequantize

    return {t.name: torch.from_numpy(dequantize(t.data, t.tensor_type).copy()) for t in reader.tensors}


@pytest.fixture(scope="module")
def policy():
    from harness.models import load_policy

    model, tokenizer = load_policy(str(MODEL))
    return model.eval(), tokenizer


def unpermute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's converter stores q/k rows with each head's two rotary halves interleaved
    (`w.reshape(heads, 2, d // 2, n).swapaxes(1, 2)`); this puts them back in Hugging Face's order."""
    out, n = w.shape
    return w.reshape(heads, out // heads // 2, 2, n).transpose(1, 2).reshape(out, n)


def hf_name(gguf_name: str) -> tuple[str, str | None]:
    """The saved tensor a GGUF tensor becomes, and which q/k rows to un-permute ("q", "k" or None)."""
    top = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
    if gguf_name in top:
        return top[gguf_name], None
    _, layer, part, _ = gguf_name.split(".")
    names = {
        "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
        "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    }  # fmt: skip
    return f"model.layers.{layer}.{names[part]}.weight", {"attn_q": "q", "attn_k": "k"}.get(part)


def test_every_saved_weight_is_the_dequantised_gguf_tensor(reader, gguf_weights):
    from safetensors.torch import load_file

    saved = load_file(MODEL / "model.safetensors")
    heads = {"q": field(reader, "llama.attention.head_count"), "k": field(reader, "llama.attention.head_count_kv")}
    expected = {}
    for name, w in gguf_weights.items():
        target, permuted = hf_name(name)
        expected[target] = unpermute(w, heads[permuted]) if permuted else w
    # Tied embeddings: the head is the embedding, saved once (the GGUF has no output.weight either).
    assert "output.weight" not in gguf_weights and set(saved) == set(expected), set(saved) ^ set(expected)
    for name, w in expected.items():
        assert saved[name].dtype == torch.float32 and saved[name].shape == w.shape, name
        assert torch.equal(saved[name], w), f"{name}: max |diff| {(saved[name] - w).abs().max():.3g}"


def test_tokenizer_is_the_ggufs(reader, policy):
    _, tok = policy
    tokens, merges = field(reader, "tokenizer.ggml.tokens"), field(reader, "tokenizer.ggml.merges")
    assert len(tok) == len(tokens) == field(reader, "llama.vocab_size") == 49152
    assert tok.convert_ids_to_tokens(list(range(len(tokens)))) == tokens  # every id names the GGUF's token
    saved = json.loads((MODEL / "tokenizer.json").read_text(encoding="utf-8"))["model"]
    assert saved["type"] == "BPE" and [" ".join(m) if isinstance(m, list) else m for m in saved["merges"]] == merges
    special = [field(reader, f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "padding")]
    assert [tok.bos_token_id, tok.eos_token_id, tok.pad_token_id] == special == [1, 2, 2]
    assert tok.chat_template == field(reader, "tokenizer.chat_template")
    # SmolLM2 writes every digit as its own token: "0".."9" are ids 32..41, so "40+2" is 36 32 27 34.
    assert tokens[32:42] == list("0123456789") and tokens[27] == "+"
    assert tok(QUESTION, add_special_tokens=False)["input_ids"] == [36, 32, 27, 34]


def conversation(tok) -> tuple[list[int], list[int]]:
    from harness.tasks.templates import render

    prompt = tok(render(tok, QUESTION, "chat_boxed"), add_special_tokens=False)["input_ids"]
    return prompt, tok(ANSWER, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]


def harness_logprobs(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    """The answer's log-probs as the trainer computes them: a Rollout, build_batch, policy_logprobs."""
    from harness.batch import build_batch, policy_logprobs
    from harness.rollout.base import Rollout

    t = len(response)
    ro = Rollout(
        prompt_ids=[prompt], response_ids=torch.tensor([response]), mask=torch.ones(1, t),
        behavior_logp=torch.zeros(1, t), topk_ids=torch.zeros(1, t, 1, dtype=torch.long),
        topk_logp=torch.zeros(1, t, 1), finished=torch.tensor([True]), group=torch.zeros(1, dtype=torch.long),
        texts=[ANSWER],
    )  # fmt: skip
    with torch.no_grad():
        return policy_logprobs(model, build_batch(ro, torch.zeros(1), pad_id=2, topk=1)).logp[0]


def reference_logits(reader, w: dict[str, torch.Tensor], ids: list[int]) -> torch.Tensor:
    """A Llama forward on the GGUF's own tensors, in float64, the way llama.cpp runs them: q/k rows as stored and
    rotary pairs (2i, 2i+1) adjacent, which is what the stored permutation is for. [L, V] logits."""
    n_head, n_kv = field(reader, "llama.attention.head_count"), field(reader, "llama.attention.head_count_kv")
    eps, base = field(reader, "llama.attention.layer_norm_rms_epsilon"), field(reader, "llama.rope.freq_base")
    w = {k: v.double() for k, v in w.items()}
    x = w["token_embd.weight"][ids]  # [L, H]
    length, hidden = x.shape
    d = hidden // n_head
    angle = torch.arange(length, dtype=torch.float64)[:, None] * base ** (-torch.arange(0, d, 2).double() / d)
    cos, sin = angle.cos(), angle.sin()  # [L, d/2]

    def rms(v, g):
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * g

    def rope(v):  # [heads, L, d], pairs (2i, 2i+1)
        a, b = v[..., 0::2], v[..., 1::2]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)

    causal = torch.full((length, length), -math.inf, dtype=torch.float64).triu(1)
    for i in range(field(reader, "llama.block_count")):
        p = f"blk.{i}."
        h = rms(x, w[p + "attn_norm.weight"])
        q = rope((h @ w[p + "attn_q.weight"].T).view(length, n_head, d).transpose(0, 1))
        k = rope((h @ w[p + "attn_k.weight"].T).view(length, n_kv, d).transpose(0, 1))
        v = (h @ w[p + "attn_v.weight"].T).view(length, n_kv, d).transpose(0, 1)
        k, v = k.repeat_interleave(n_head // n_kv, 0), v.repeat_interleave(n_head // n_kv, 0)
        att = ((q @ k.transpose(1, 2)) / math.sqrt(d) + causal).softmax(-1) @ v  # [heads, L, d]
        x = x + att.transpose(0, 1).reshape(length, hidden) @ w[p + "attn_output.weight"].T
        h = rms(x, w[p + "ffn_norm.weight"])
        gate, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "ffn_down.weight"].T
    return rms(x, w["output_norm.weight"]) @ w["token_embd.weight"].T  # the tied head


def answer_logprobs(logits: torch.Tensor, prompt: list[int], response: list[int]) -> torch.Tensor:
    """log p(response token t | everything before it) from full-sequence logits [L, V]."""
    rows = logits[len(prompt) - 1 : len(prompt) + len(response) - 1].double().log_softmax(-1)
    return rows.gather(1, torch.tensor(response)[:, None])[:, 0]


def test_harness_logprobs_match_a_forward_on_the_gguf_tensors(reader, gguf_weights, policy):
    model, tok = policy
    prompt, response = conversation(tok)
    ours = harness_logprobs(model, prompt, response)
    reference = answer_logprobs(reference_logits(reader, gguf_weights, prompt + response), prompt, response)
    assert len(prompt) == 44 and len(response) == 11  # 4 0 " +" " " 2 " =" " " 4 2 . <|im_end|>
    # fp32 through 30 layers against float64: ~1e-5 apart; a broken conversion is off by 0.1 or more.
    assert (ours.double() - reference).abs().max() < 1e-3, (ours, reference)
    assert reference.exp().mean() > 0.5  # the model finds its own kind of answer likely (0.67): not noise


def test_harness_logprobs_match_transformers_gguf_load(reader, policy):  # reader: skipped without gguf, as the load
    from transformers import AutoModelForCausalLM

    model, tok = policy
    prompt, response = conversation(tok)
    loaded = AutoModelForCausalLM.from_pretrained(GGUF.parent, gguf_file=GGUF.name, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = loaded(input_ids=torch.tensor([prompt + response])).logits[0]
    theirs = answer_logprobs(logits, prompt, response)
    assert (harness_logprobs(model, prompt, response).double() - theirs).abs().max() < 1e-4
