"""Rollout engines (HF generate, vLLM CPU) against the Rollout contract, an independent fp32 trainer forward,
each other, and the precision axis. The model is a random 2-layer Qwen3 with a 290-token word-level vocab, built
here; its EOS embedding is pointed along the mean final hidden state so that some samples stop and some don't."""

from __future__ import annotations

import copy
import io
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from harness.rollout import HFEngine, Rollout, ScoringEngine, make_engine
from harness.rollout.base import call_seed, force_sampled_into_topk, mask_through_first_eos, pad_ragged

EOS, PAD = 0, 1
PROMPTS = [[5, 6, 7, 100], [8, 9], [120, 121, 122, 123, 124, 125], [40, 41, 42]]
N, MAX_NEW, K = 3, 16, 3
TOL = 1e-4


def build_tiny_model(path: Path) -> None:
    words = [str(i) for i in range(100)] + list("+-*/=?()") + [f"w{i}" for i in range(180)]
    vocab = {t: i for i, t in enumerate(["<eos>", "<pad>", *words])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>").save_pretrained(path)
    config = Qwen3Config(
        vocab_size=len(vocab),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        eos_token_id=EOS,
        pad_token_id=PAD,
        bos_token_id=EOS,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(config)
        with torch.no_grad():
            # std 0.1 gives peaked but not degenerate next-token distributions (entropy ~2.6 nats).
            model.model.embed_tokens.weight.normal_(0, 0.1)
            hidden = model(torch.randint(2, len(vocab), (64, 12)), output_hidden_states=True).hidden_states[-1]
            direction = hidden.reshape(-1, config.hidden_size).mean(0)
            model.model.embed_tokens.weight[EOS] = 3.0 * direction / direction.norm()
    model.generation_config = GenerationConfig(eos_token_id=EOS, pad_token_id=PAD, bos_token_id=EOS)
    model.save_pretrained(path)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tiny_qwen3")
    build_tiny_model(path)
    return str(path)


@pytest.fixture(scope="module")
def trainer(model_dir: str) -> Qwen3ForCausalLM:
    return Qwen3ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def hf_engine(model_dir: str) -> HFEngine:
    engine = make_engine("hf", model_dir, "fp32", seed=0, max_model_len=128)
    assert isinstance(engine, HFEngine)
    return engine


@pytest.fixture(scope="module")
def vllm_engine(model_dir: str):
    pytest.importorskip("vllm")
    engine = make_engine("vllm", model_dir, "fp32", seed=0, max_model_len=128, kv_cache_gb=0.25)
    yield engine
    engine.close()


@pytest.fixture(params=["hf", "vllm"])
def engine(request: pytest.FixtureRequest):
    return request.getfixturevalue(f"{request.param}_engine")


def responses(ro: Rollout) -> list[list[int]]:
    return [row[: int(m)] for row, m in zip(ro.response_ids.tolist(), ro.mask.sum(1).tolist(), strict=True)]


def trainer_logprobs(trainer: Qwen3ForCausalLM, prompt: list[int], response: list[int], temperature: float = 1.0):
    """[L, V] fp32 log-probs at the response positions, one unpadded sequence at a time (no shared code path)."""
    with torch.no_grad():
        logits = trainer(torch.tensor([prompt + response])).logits[0].float()
    return torch.log_softmax(logits / temperature, dim=-1)[len(prompt) - 1 : -1]


def max_parity_error(ro: Rollout, trainer: Qwen3ForCausalLM, temperature: float = 1.0) -> float:
    """Largest |engine - trainer| over sampled-token and top-K log-probs."""
    worst = 0.0
    for prompt, resp, logp, ids, top in zip(
        ro.prompt_ids, responses(ro), ro.behavior_logp, ro.topk_ids, ro.topk_logp, strict=True
    ):
        ref = trainer_logprobs(trainer, prompt, resp, temperature)
        length = len(resp)
        worst = max(worst, (ref.gather(1, torch.tensor(resp)[:, None])[:, 0] - logp[:length]).abs().max().item())
        worst = max(worst, (ref.gather(1, ids[:length]) - top[:length]).abs().max().item())
    return worst


def check_contract(ro: Rollout, prompts: list[list[int]], n: int, max_new: int, k: int, tokenizer) -> None:
    b = len(prompts) * n
    lengths = ro.mask.sum(1).long()
    t = int(lengths.max())
    assert ro.response_ids.shape == ro.mask.shape == ro.behavior_logp.shape == (b, t)
    assert ro.topk_ids.shape == ro.topk_logp.shape == (b, t, k)
    assert ro.response_ids.dtype == ro.topk_ids.dtype == ro.group.dtype == torch.int64
    assert ro.mask.dtype == ro.behavior_logp.dtype == ro.topk_logp.dtype == torch.float32
    assert ro.finished.dtype == torch.bool and ro.finished.shape == (b,)
    assert ro.group.tolist() == [i for i in range(len(prompts)) for _ in range(n)]
    assert ro.prompt_ids == [p for p in prompts for _ in range(n)]
    assert t <= max_new
    # mask: a run of ones, then zeros
    assert bool((ro.mask[:, 1:] <= ro.mask[:, :-1]).all())
    valid = ro.mask.bool()
    for row, length, done in zip(responses(ro), lengths.tolist(), ro.finished.tolist(), strict=True):
        if done:  # ends at its first EOS, which is inside the mask
            assert row[-1] == EOS and EOS not in row[:-1]
        else:  # truncated: ran the full budget without EOS
            assert length == max_new and EOS not in row
    assert bool(ro.finished.any()) and bool((~ro.finished).any()), "test model should give both kinds"
    # padding
    assert bool((ro.response_ids[~valid] == PAD).all())
    assert bool((ro.behavior_logp[~valid] == 0).all()) and bool((ro.topk_logp[~valid] == 0).all())
    assert bool((ro.topk_ids[~valid] == 0).all())
    # log-probs and top-K
    assert bool((ro.behavior_logp[valid] < 0).all()) and bool(torch.isfinite(ro.behavior_logp).all())
    assert bool((ro.topk_logp[valid].diff(dim=-1) <= 0).all()), "top-K sorted by probability"
    hit = ro.topk_ids == ro.response_ids.unsqueeze(-1)
    assert bool(hit[valid].any(-1).all()), "sampled token inside the top-K"
    sampled_in_topk = (ro.topk_logp * hit).sum(-1)
    assert torch.allclose(sampled_in_topk[valid], ro.behavior_logp[valid], atol=1e-6)
    assert ro.texts == tokenizer.batch_decode(responses(ro), skip_special_tokens=True)


# --- shared helpers (hand-derived cases) ---
def test_mask_through_first_eos() -> None:
    ids = torch.tensor([[5, 0, 7, 0], [5, 6, 7, 8], [0, 1, 1, 1]])
    expected = [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert mask_through_first_eos(ids, torch.tensor([EOS])).tolist() == expected


def test_force_sampled_into_topk_overwrites_kth_only_when_absent() -> None:
    ids = torch.tensor([[10, 11, 12], [10, 11, 12]])
    logp = torch.tensor([[-0.5, -2.0, -3.0], [-0.5, -2.0, -3.0]])
    new_ids, new_logp = force_sampled_into_topk(ids, logp, torch.tensor([11, 40]), torch.tensor([-2.0, -5.0]))
    assert new_ids.tolist() == [[10, 11, 12], [10, 11, 40]]
    assert new_logp.tolist() == [[-0.5, -2.0, -3.0], [-0.5, -2.0, -5.0]]


def test_pad_ragged_right_pads_in_order() -> None:
    rows = [np.array([[1, 2]]), np.array([[3, 4], [5, 6], [7, 8]])]
    out = pad_ragged(rows, -1, torch.long)
    assert out.tolist() == [[[1, 2], [-1, -1], [-1, -1]], [[3, 4], [5, 6], [7, 8]]]


def test_call_seed_is_deterministic_and_distinct() -> None:
    assert call_seed(0, 3) == call_seed(0, 3)
    assert len({call_seed(0, i) for i in range(100)} | {call_seed(1, 0)}) == 101


# --- both engines: contract, parity with the trainer, sync, seeds ---
@pytest.mark.slow  # a rollout engine
def test_contract(engine, hf_engine: HFEngine) -> None:
    ro = engine.generate(PROMPTS, n=N, max_new_tokens=MAX_NEW, topk=K, seed=1)
    check_contract(ro, PROMPTS, N, MAX_NEW, K, hf_engine.tokenizer)
    # K=1 overwrites the single entry whenever the sampled token is not the argmax
    ro1 = engine.generate(PROMPTS, n=N, max_new_tokens=MAX_NEW, topk=1, seed=1)
    assert bool((ro1.topk_ids[..., 0] == ro1.response_ids)[ro1.mask.bool()].all())


@pytest.mark.slow  # a rollout engine
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_trainer_forward(engine, trainer: Qwen3ForCausalLM, temperature: float) -> None:
    ro = engine.generate(PROMPTS, n=N, max_new_tokens=MAX_NEW, topk=K, temperature=temperature, seed=2)
    assert max_parity_error(ro, trainer, temperature) < TOL


@pytest.mark.slow  # a rollout engine
def test_topk_20(engine) -> None:
    ro = engine.generate(PROMPTS[:2], n=2, max_new_tokens=8, topk=20, seed=3)
    assert ro.topk_ids.shape[-1] == 20
    valid = ro.mask.bool()
    assert bool((ro.topk_logp[valid].diff(dim=-1) <= 0).all())
    assert all(len(set(row)) == 20 for row in ro.topk_ids[valid].tolist())
    assert bool((ro.topk_ids == ro.response_ids.unsqueeze(-1)).any(-1)[valid].all())


@pytest.mark.slow  # a rollout engine
def test_seeded_sampling_is_reproducible(engine) -> None:
    a = engine.generate(PROMPTS, n=N, max_new_tokens=MAX_NEW, seed=5)
    b = engine.generate(PROMPTS, n=N, max_new_tokens=MAX_NEW, seed=5)
    c = engine.generate(PROMPTS, n=N, max_new_tokens=MAX_NEW, seed=6)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.behavior_logp, b.behavior_logp)
    assert not torch.equal(a.response_ids, c.response_ids)
    # Independent streams: for one prompt given twice in a call, or in calls with consecutive seeds (the trainer
    # passes base + step), no sample may reappear (chance collisions need identical long token runs).
    twice = engine.generate([PROMPTS[0], PROMPTS[0]], n=4, max_new_tokens=MAX_NEW, seed=7)
    nxt = engine.generate([PROMPTS[0], PROMPTS[0]], n=4, max_new_tokens=MAX_NEW, seed=8)
    long_rows = [tuple(r) for r in responses(twice) if len(r) >= 4]
    assert len(long_rows) >= 4 and len(set(long_rows)) == len(long_rows)
    assert not set(long_rows) & {tuple(r) for r in responses(nxt)}


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.slow  # a rollout engine
def test_progress_bar_only_on_a_terminal_and_changes_no_sample(
    engine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    label = "eval 4 problems x 3"
    quiet = engine.generate(PROMPTS, n=N, max_new_tokens=4, seed=9, progress=label)
    assert label not in capsys.readouterr().err  # no terminal (tests, log files): no bar
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    shown = engine.generate(PROMPTS, n=N, max_new_tokens=4, seed=9, progress=label)
    assert torch.equal(quiet.response_ids, shown.response_ids)
    # vLLM counts finished samples (4 prompts x 3), HF the decoding steps of its one batch (1 to 4 of them).
    done = r"[1-4]/4 \[" if isinstance(engine, HFEngine) else r"12/12 \["
    drawn = terminal.getvalue()
    assert drawn.startswith(f"\r{label}:   0%|") and re.search(done, drawn), drawn


@pytest.mark.slow  # a rollout engine
def test_unseeded_calls_follow_the_engine_seed(model_dir: str) -> None:
    first = make_engine("hf", model_dir, "fp32", seed=11, max_model_len=128)
    second = make_engine("hf", model_dir, "fp32", seed=11, max_model_len=128)
    a1, a2 = (first.generate(PROMPTS, n=2, max_new_tokens=8) for _ in range(2))
    b1 = second.generate(PROMPTS, n=2, max_new_tokens=8)
    assert torch.equal(a1.response_ids, b1.response_ids)
    assert not torch.equal(a1.response_ids, a2.response_ids)


@pytest.mark.slow  # a rollout engine
def test_sampling_leaves_global_rng_alone(engine) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    engine.generate(PROMPTS[:1], n=2, max_new_tokens=4, seed=1)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.slow  # a rollout engine
def test_sync_weights(engine, trainer: Qwen3ForCausalLM) -> None:
    moved = Qwen3ForCausalLM(trainer.config).eval()
    moved.load_state_dict(trainer.state_dict())
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(0.05 * torch.randn_like(p))
    try:
        stale = engine.generate(PROMPTS, n=2, max_new_tokens=MAX_NEW, topk=K, seed=8)
        assert max_parity_error(stale, moved) > 1e-2  # the engine holds its own copy
        # without lm_head.weight, as a tied checkpoint stores it: the engine must still update its output head
        engine.sync_weights({k: v for k, v in moved.state_dict().items() if k != "lm_head.weight"})
        fresh = engine.generate(PROMPTS, n=2, max_new_tokens=MAX_NEW, topk=K, seed=8)
        assert max_parity_error(fresh, moved) < TOL
    finally:
        engine.sync_weights(trainer.state_dict())
    assert max_parity_error(engine.generate(PROMPTS, n=2, max_new_tokens=8, seed=9), trainer) < TOL


def _perturbed(model: torch.nn.Module, scale: float = 0.05) -> dict[str, torch.Tensor]:
    moved, gen = copy.deepcopy(model), torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in moved.parameters():  # a tied head moves with the embedding, as in training
            p.add_(scale * torch.randn(p.shape, generator=gen))
    return moved.state_dict()


def _sample_after_sync(engine, weights: dict[str, torch.Tensor], direct: bool) -> Rollout:
    engine._direct_ok, engine._writer = direct, None  # the next sync plans afresh (direct) or uses reload_weights
    engine.sync_weights(weights)
    assert (engine._writer is not None) == direct, engine.direct_sync_refused
    return engine.generate(PROMPTS, n=2, max_new_tokens=MAX_NEW, topk=K, seed=14)


def _direct_equals_reload(engine, trainer: torch.nn.Module) -> None:
    """vLLM CPU weight sync: the direct write and vLLM's reload_weights leave bit-identical engines."""
    moved = _perturbed(trainer)
    try:
        by_reload = _sample_after_sync(engine, moved, direct=False)
        engine.sync_weights(trainer.state_dict())
        by_direct = _sample_after_sync(engine, moved, direct=True)
    finally:
        engine.sync_weights(trainer.state_dict())
    for field in ("response_ids", "behavior_logp", "topk_ids", "topk_logp"):
        assert torch.equal(getattr(by_direct, field), getattr(by_reload, field)), field
    scored = engine.score(by_direct.prompt_ids, responses(by_direct))
    assert not torch.allclose(scored, by_direct.behavior_logp, atol=1e-2)  # the engine really moved back


@pytest.mark.slow  # a rollout engine
def test_vllm_direct_sync_equals_reload(vllm_engine, trainer: Qwen3ForCausalLM) -> None:
    # tied head, vocabulary padded by vLLM (290 -> 320 rows), fused q/k/v and gate/up
    _direct_equals_reload(vllm_engine, trainer)


@pytest.mark.slow  # a rollout engine
def test_direct_sync_plan_names_what_it_cannot_cover(vllm_engine, trainer: Qwen3ForCausalLM) -> None:
    from harness.rollout.vllm_cpu_weights import CPUWeightWriter

    model = vllm_engine._writer.model
    weights = trainer.state_dict()
    assert CPUWeightWriter(model).plan(weights) is None
    extra = weights | {"model.extra.weight": torch.zeros(3)}
    assert CPUWeightWriter(model).plan(extra) == "model.extra.weight: no target in the engine"
    missing = {k: v for k, v in weights.items() if k != "model.norm.weight"}
    assert CPUWeightWriter(model).plan(missing) == "model.norm.weight is not among the trainer's weights"
    no_v = {k: v for k, v in weights.items() if k != "model.layers.1.self_attn.v_proj.weight"}
    assert CPUWeightWriter(model).plan(no_v) == (
        "a weight of model.layers.1.self_attn.qkv_proj is missing from the trainer's weights"
    )
    wide = weights | {"model.layers.0.mlp.up_proj.weight": torch.zeros(129, 64)}
    assert CPUWeightWriter(model).plan(wide) == (
        "model.layers.0.mlp.gate_up_proj.weight: trainer parts make (257, 64), the engine holds (256, 64)"
    )


@pytest.mark.slow  # a rollout engine
def test_score_matches_sampling_logprobs(engine) -> None:
    assert isinstance(engine, ScoringEngine)
    ro = engine.generate(PROMPTS, n=2, max_new_tokens=MAX_NEW, seed=10)
    scored = engine.score(ro.prompt_ids, responses(ro))
    assert scored.shape == ro.behavior_logp.shape
    assert torch.allclose(scored, ro.behavior_logp, atol=TOL)


@pytest.mark.slow  # a rollout engine
def test_engines_agree_on_the_same_tokens(hf_engine: HFEngine, vllm_engine) -> None:
    ro = vllm_engine.generate(PROMPTS, n=2, max_new_tokens=MAX_NEW, seed=12)
    assert torch.allclose(hf_engine.score(ro.prompt_ids, responses(ro)), ro.behavior_logp, atol=TOL)


@pytest.mark.slow  # a rollout engine
@pytest.mark.parametrize(
    "kwargs",
    [{"n": 0}, {"max_new_tokens": 0}, {"topk": 0}, {"topk": 21}, {"temperature": 0.0}, {"max_new_tokens": 125}],
)
def test_bad_generate_arguments(engine, kwargs: dict) -> None:
    args = {"n": 1, "max_new_tokens": 4} | kwargs
    with pytest.raises(ValueError, match="generate"):
        engine.generate(PROMPTS, **args)


# --- precision: the engine copy's dtype and fp8 weights create the mismatch ---
@pytest.mark.slow  # a rollout engine
def test_mismatch_grows_fp32_bf16_fp8(model_dir: str, hf_engine: HFEngine, trainer: Qwen3ForCausalLM) -> None:
    ro = hf_engine.generate(PROMPTS, n=4, max_new_tokens=MAX_NEW, seed=13)
    valid = ro.mask.bool()
    ref = torch.zeros_like(ro.behavior_logp)
    for i, (prompt, resp) in enumerate(zip(ro.prompt_ids, responses(ro), strict=True)):
        ref[i, : len(resp)] = trainer_logprobs(trainer, prompt, resp).gather(1, torch.tensor(resp)[:, None])[:, 0]
    gap = {}
    for name in ("fp32", "bf16", "fp8_rollout"):
        copy = make_engine("hf", model_dir, name, seed=0, max_model_len=128)
        scored = copy.score(ro.prompt_ids, responses(ro))
        gap[name] = (scored - ref)[valid].abs().mean().item()
        copy.sync_weights(trainer.state_dict())  # a fresh copy equals one synced from fp32 trainer weights
        assert torch.equal(copy.score(ro.prompt_ids, responses(ro)), scored)
    assert gap["fp32"] < 1e-5 < gap["bf16"] < gap["fp8_rollout"]


# --- packaging ---
def test_unknown_engine_or_precision(model_dir: str) -> None:
    with pytest.raises(ValueError, match="allowed: hf, vllm"):
        make_engine("sglang", model_dir, "fp32", seed=0, max_model_len=128)
    with pytest.raises(ValueError, match="allowed: fp32, bf16, fp8_rollout, fp8_e2e, w8a8_rollout"):
        make_engine("hf", model_dir, "fp16", seed=0, max_model_len=128)


@pytest.mark.slow  # starts a Python process
def test_importing_the_harness_does_not_import_vllm() -> None:
    code = "import sys, harness.rollout, harness.precision; print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_missing_vllm_says_use_hf(model_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # what `import vllm` sees without the extra
    with pytest.raises(ImportError, match="rollout=vllm needs the vllm extra.*use rollout=hf"):
        make_engine("vllm", model_dir, "fp32", seed=0, max_model_len=128)
