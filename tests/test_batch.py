"""The trainer's packed forward (harness.batch): same values and gradients as the padded layout, packs that never
exceed the longest row, and the probe that keeps a model which would mix packed rows on the padded layout."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.batch import TrainBatch, pack_lengths, pack_rows, packing_works, policy_logprobs


@given(st.lists(st.integers(1, 40), min_size=1, max_size=60))
@settings(max_examples=200, deadline=None)
def test_packs_hold_every_item_once_within_the_longest(lengths):
    packs = pack_lengths(lengths)
    assert sorted(i for p in packs for i in p) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in p) <= max(lengths) for p in packs)
    assert len(packs) <= len(lengths)


def test_short_rows_fill_the_longest_rows_packs():
    assert pack_lengths([10, 3, 7, 2, 5]) == [[0], [2, 3], [4, 1]]


def tiny_qwen3(vocab: int = 64):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    return Qwen3ForCausalLM(config).eval()


def random_batch(prompt_lens, response_lens, vocab=64, k=3, pad_id=0, seed=0) -> TrainBatch:
    """Left-padded prompts and right-padded responses, as build_batch lays out a rollout."""
    gen = torch.Generator().manual_seed(seed)
    b, p, t = len(prompt_lens), max(prompt_lens), max(response_lens)
    ids = torch.randint(1, vocab, (b, p + t), generator=gen)
    attention = torch.zeros(b, p + t, dtype=torch.long)
    for i, (pl, tl) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        attention[i, p - pl : p + tl] = 1
    ids = ids.masked_fill(attention == 0, pad_id)
    mask = attention[:, p:].float()
    return TrainBatch(
        input_ids=ids,
        attention_mask=attention,
        position_ids=(attention.cumsum(1) - 1).clamp(min=0),
        prompt_len=p,
        response_ids=ids[:, p:],
        mask=mask,
        behavior_logp=torch.zeros(b, t),
        topk_ids=torch.randint(0, vocab, (b, t, k), generator=gen),
        topk_behavior_logp=torch.zeros(b, t, k),
        advantages=mask.clone(),
    )


def forward_and_grads(model, batch, packed):
    model.zero_grad(set_to_none=True)
    out = policy_logprobs(model, batch, with_topk=True, packed=packed)
    (out.logp * batch.mask * torch.linspace(-1, 1, batch.mask.numel()).view_as(batch.mask)).sum().backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    m = batch.mask
    return out.logp.detach() * m, out.entropy * m, out.topk_logp * m[..., None], grads


@pytest.mark.parametrize(
    "prompt_lens,response_lens",
    [([3, 5, 2, 4, 6, 1], [7, 1, 12, 3, 2, 5]), ([4], [9]), ([2, 2, 2], [1, 1, 1])],
)
def test_packed_forward_matches_the_padded_layout(prompt_lens, response_lens):
    model = tiny_qwen3()
    batch = random_batch(prompt_lens, response_lens)
    assert packing_works(model)
    packed = forward_and_grads(model, batch, packed=True)
    padded = forward_and_grads(model, batch, packed=False)
    for a, b in zip(packed, padded, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), float((a - b).abs().max())
    plan = pack_rows(batch)
    assert plan.input_ids.shape[1] == max(p + t - 1 for p, t in zip(prompt_lens, response_lens, strict=True))
    assert int(plan.valid.sum()) == sum(response_lens) == plan.source.numel()


def test_packed_positions_past_a_response_are_zero():
    model = tiny_qwen3()
    batch = random_batch([3, 4], [2, 6])
    out = policy_logprobs(model, batch, with_topk=True)
    assert (out.logp[0, 2:] == 0).all() and (out.entropy[0, 2:] == 0).all() and (out.topk_logp[0, 2:] == 0).all()
    assert (out.logp[0, :2] < 0).all()


class _MixingDecoder(torch.nn.Module):
    """A causal "decoder" that averages every earlier token's embedding regardless of position ids: packed rows
    would leak into each other."""

    def __init__(self, embed: torch.nn.Embedding) -> None:
        super().__init__()
        self.embed = embed

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        x = self.embed(input_ids)
        if attention_mask is not None:
            x = x * attention_mask[..., None]
        steps = torch.arange(1, x.shape[1] + 1, dtype=x.dtype)[None, :, None]
        return type("Out", (), {"last_hidden_state": x.cumsum(1) / steps})()


class _MixingLM(torch.nn.Module):
    def __init__(self, vocab: int = 64, hidden: int = 16) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.decoder = _MixingDecoder(torch.nn.Embedding(vocab, hidden))
        self.head = torch.nn.Linear(hidden, vocab, bias=False)

    def get_decoder(self):
        return self.decoder

    def get_output_embeddings(self):
        return self.head


def test_a_model_that_mixes_packed_rows_gets_the_padded_layout():
    model = _MixingLM()
    batch = random_batch([3, 5, 2], [4, 2, 6])
    assert not packing_works(model)
    auto = policy_logprobs(model, batch, packed=True)
    padded = policy_logprobs(model, batch, packed=False)
    assert torch.equal(auto.logp, padded.logp)
