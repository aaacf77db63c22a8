"""The tiny mixture of experts and the router mismatch (issue 59, model d; docs/mismatch_moe.md): the model, the
engine's router in lower precision, and router replay as its cure. Each test fails when the model it names is switched
off."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config, Qwen3MoeConfig, Qwen3MoeForCausalLM

from harness import moe
from harness.batch import build_batch, pack_rows, policy_logprobs
from harness.config import compose, validate
from harness.loop.model_path import model_dir, tiny_spec
from harness.models import TinyModelConfig, load_policy, tiny_model_dir
from harness.rollout import make_engine
from harness.rollout.base import Rollout
from harness.tasks import render_prompts
from harness.tasks.arith import make_splits
from tests.conftest import FAST_TRAINER, ROOT, SMALL_MODEL

# --- configuration ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model=tiny_moe", "model.num_experts=1"], "model.num_experts: 1 is not allowed; use 0 .dense. or 2, 3, 4"),
        (["model=tiny_moe", "model.num_experts=8"], "model.num_experts: 8 is not allowed"),
        (["model=tiny_moe", "model.experts_per_token=4"], "model.experts_per_token: 4 is not allowed with num_exp"),
        (["model=tiny_moe", "model.experts_per_token=0"], "model.experts_per_token: 0 is not allowed"),
        (["model.experts_per_token=2"], "model.experts_per_token: 2 needs num_experts 2, 3, 4"),
        (["model=tiny_moe", "model.num_experts=0"], "model.experts_per_token: 2 needs num_experts"),
        (["model=tiny_moe", "model.path=Qwen/Qwen3-4B"], "model.num_experts: 4 builds the tiny mixture of experts"),
        (["rollout=hf", "rollout.router_precision=bf16"], "rollout.router_precision: bf16 needs a mixture-of-experts"),
        (["rollout=hf", "rollout.router_replay=true"], "rollout.router_replay: True needs a mixture-of-experts"),
        (["model=tiny_moe", "rollout.router_replay=true"], "rollout.router_replay: True is emulated by rollout=hf"),
        (["model=tiny_moe", "rollout.router_precision=fp8"], "rollout.router_precision: fp8 is emulated by rollout=hf"),
        (["model=tiny_moe", "rollout=hf", "rollout.router_precision=fp16"], "rollout.router_precision: expected"),
        (
            ["model=tiny_moe", "rollout=hf", "rollout.router_replay=true", "model.gradient_checkpointing=true"],
            "rollout.router_replay: model.gradient_checkpointing",
        ),
    ],
)
def test_bad_moe_values_are_refused_in_one_line_before_any_build(overrides: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message) as e:
        validate(compose(*overrides))  # a pure function of the config: no model is built or read
    assert "\n" not in str(e.value)


def test_the_moe_preset_composes_and_the_tiny_builder_refuses_bad_counts() -> None:
    run = validate(
        compose("model=tiny_moe", "rollout=hf", "rollout.router_precision=bf16", "rollout.router_replay=true")
    )
    assert (run.model.num_experts, run.model.experts_per_token) == (4, 2)
    with pytest.raises(ValueError, match="tiny model: num_experts: 5 is not allowed"):
        moe.mixture(Qwen3Config(), TinyModelConfig(num_experts=5, experts_per_token=2))


def test_a_dense_tiny_model_keeps_its_cache_folder() -> None:
    # The names the dense models had before the MoE fields existed: their caches (and pass-rate files naming them)
    # stay valid. A mixture of experts gets a folder of its own.
    dense = tiny_model_dir(*tiny_spec(validate(compose()))).name
    small = tiny_model_dir(*tiny_spec(validate(compose(*SMALL_MODEL)))).name
    assert (dense, small) == ("tiny-9b6b1cbb1d54a4ab", "tiny-38ed773e9e04880d")
    assert tiny_model_dir(*tiny_spec(validate(compose("model=tiny_moe")))).name not in (dense, small)


@pytest.fixture(scope="session")
def small_moe(small_model: list[str]) -> list[str]:
    """Overrides selecting the small tiny model as a 4-expert top-2 mixture (built once, cached like it)."""
    overrides = [*small_model, "model=tiny_moe"]
    model_dir(validate(compose(*overrides)))
    return overrides


@pytest.mark.slow
def test_the_tiny_moe_is_built_by_the_tiny_recipe(small_model: list[str], small_moe: list[str]) -> None:
    dense, mixture = (model_dir(validate(compose(*overrides))) for overrides in (small_model, small_moe))
    config = json.loads((mixture / "config.json").read_text())
    assert (config["model_type"], config["num_local_experts"], config["num_experts_per_tok"]) == ("qwen3_moe", 4, 2)
    assert config["moe_intermediate_size"] == 128 // 2  # a token's two experts: the dense MLP's width
    assert (mixture / "tokenizer.json").read_bytes() == (dense / "tokenizer.json").read_bytes()
    build = json.loads((mixture / "tiny_build.json").read_text())
    assert (
        build["model"]["num_experts"] == 4
        and "num_experts" not in json.loads((dense / "tiny_build.json").read_text())["model"]
    )


# --- the routers' arithmetic, on a hand-made mixture of experts -------------------------------------------------------


def tiny_moe_model(seed: int = 0) -> Qwen3MoeForCausalLM:
    torch.manual_seed(seed)
    return Qwen3MoeForCausalLM(
        Qwen3MoeConfig(
            vocab_size=32,
            hidden_size=16,
            intermediate_size=32,
            moe_intermediate_size=16,
            num_experts=4,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=8,
            tie_word_embeddings=True,
            initializer_range=0.5,
        )  # fmt: skip
    )


def hand_batch(rows: int = 6, prompt: int = 4, response: int = 5, seed: int = 0):
    """A TrainBatch of random tokens with ragged prompts and responses (a Rollout is only its container)."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(4, 32, (int(torch.randint(1, prompt + 1, (1,), generator=g)),), generator=g).tolist()
               for _ in range(rows)]  # fmt: skip
    lengths = torch.randint(1, response + 1, (rows,), generator=g)
    mask = (torch.arange(response)[None] < lengths[:, None]).float()
    ro = Rollout(
        prompt_ids=prompts, response_ids=torch.randint(4, 32, (rows, response), generator=g) * mask.long(), mask=mask,
        behavior_logp=torch.zeros(rows, response), topk_ids=torch.zeros(rows, response, 1, dtype=torch.long),
        topk_logp=torch.zeros(rows, response, 1), finished=torch.ones(rows, dtype=torch.bool),
        group=torch.arange(rows), texts=[""] * rows,
    )  # fmt: skip
    return build_batch(ro, torch.ones(rows), 0, 1)


def trainer_routes(model: torch.nn.Module, batch, replay: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp, the experts the model's routers used, [B, P + T, L, k]) of a padded forward, whose tokens are the
    batch's own layout, so its recording lines up with the batch's routes."""
    routers = moe.routers(model)
    assert routers is not None
    with torch.no_grad(), routers.recording() as recorded:
        lp = policy_logprobs(model, batch, packed=False, replay_routes=replay)
    return lp.logp, moe.recorded_routes(recorded, len(batch))


def packed_logp(model: torch.nn.Module, batch, replay: bool) -> torch.Tensor:
    """The trainer's own forward: rows packed padding-free (harness.batch)."""
    with torch.no_grad():
        return policy_logprobs(model, batch, replay_routes=replay).logp


def test_replaying_the_models_own_routes_changes_nothing_and_other_routes_are_used_exactly() -> None:
    model = tiny_moe_model().eval()
    batch = hand_batch()
    logp, own = trainer_routes(model, batch, replay=False)
    real = batch.attention_mask.bool()
    # Replaying its own routes: gates from its softmax renormalised over the same experts, bit for bit.
    same, _ = trainer_routes(model, dataclasses.replace(batch, routes=moe.rollout_routes(own, real)), replay=True)
    assert torch.equal(same, logp)
    # Other routes (each token's second expert moved to another), replayed packed and padded: used exactly as given,
    # at every real token, and the two layouts agree (the packed forward finds each token's routes).
    other = own.clone()
    other[..., 1] = (other[..., 1] + 1) % 4
    other[..., 1] = torch.where(other[..., 1] == other[..., 0], (other[..., 1] + 1) % 4, other[..., 1])
    given = dataclasses.replace(batch, routes=moe.rollout_routes(other, real))
    padded, used = trainer_routes(model, given, replay=True)
    assert torch.equal(used[real], other[real])
    m = batch.mask > 0
    assert torch.allclose(packed_logp(model, given, replay=True)[m], padded[m], atol=1e-5)
    assert (padded - logp).abs().max() > 1e-3  # the other experts change the log-probs
    assert moe.route_metrics(model)["mismatch/route_diff_frac"] > 0.5  # the router's own choice: mostly not these


def test_replay_keeps_the_routers_gradient_and_pack_origins_point_at_their_tokens() -> None:
    model = tiny_moe_model()
    batch = hand_batch()
    _, own = trainer_routes(model.eval(), batch, replay=False)
    given = dataclasses.replace(batch, routes=moe.rollout_routes(own, batch.attention_mask.bool()))
    policy_logprobs(model, given, replay_routes=True).logp.sum().backward()
    router = moe.routers(model).modules[0]  # type: ignore[union-attr]
    assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0  # R3: the gates still train it
    plan = pack_rows(batch)
    flat = batch.input_ids.flatten()
    slots = plan.origin >= 0
    assert torch.equal(plan.input_ids[slots], flat[plan.origin[slots]])


def test_the_training_steps_forwards_replay_when_the_run_asks() -> None:
    """The update's forward, pi_old's recompute and rollout.behavior=trainer all route by the batch's routes under
    rollout.router_replay, and by their own router without it."""
    from types import SimpleNamespace

    from harness.loop import step

    model = tiny_moe_model().eval()
    batch = hand_batch()
    _, own = trainer_routes(model, batch, replay=False)
    other = own.clone()
    other[..., 1] = (other[..., 1] + 1) % 4
    other[..., 1] = torch.where(other[..., 1] == other[..., 0], (other[..., 1] + 1) % 4, other[..., 1])
    given = dataclasses.replace(batch, routes=moe.rollout_routes(other, batch.attention_mask.bool()))
    m = batch.mask > 0
    for replay in (False, True):
        want = packed_logp(model, given, replay)[m]
        cfg = SimpleNamespace(
            rollout=SimpleNamespace(router_replay=replay, temperature=1.0),
            correction=SimpleNamespace(bypass_mode=False),
            trainer=SimpleNamespace(nan_logits_at_steps=()),
        )
        run = SimpleNamespace(
            cfg=cfg, policy=model, prec=SimpleNamespace(train_autocast=None),
            objective=SimpleNamespace(topk=1, needs_old=True),
        )  # fmt: skip
        with torch.no_grad():
            assert torch.equal(step.forward(run, 1, given, with_grad=False).logp[m], want)  # type: ignore[arg-type]
        assert torch.equal(step.recompute_old_logp(run, given)[m], want)  # type: ignore[arg-type, index]
        assert torch.equal(step.trainer_behavior(run, given).behavior_logp[m], want)  # type: ignore[arg-type]
    assert not torch.equal(packed_logp(model, given, True)[m], packed_logp(model, given, False)[m])


# --- the engine's low-precision router, and replay, on the real engine and trainer forward -------------------------


def rollout_and_policy(overrides: list[str], precision: str, prompts: int = 64, n: int = 4):
    """A rollout of the HF engine with its router in `precision`, as a TrainBatch, and the trainer's fp32 policy."""
    cfg = validate(compose(*overrides))
    path = str(model_dir(cfg))
    policy, tokenizer = load_policy(path)
    train, _ = make_splits(tiny_spec(cfg)[1])
    engine = make_engine("hf", path, "fp32", 0, cfg.model.max_model_len, max_topk=1, router_precision=precision)
    ro = engine.generate(render_prompts(tokenizer, train[:prompts], "chat"), n=n, max_new_tokens=24, seed=1)
    return build_batch(ro, torch.ones(len(ro.texts)), tokenizer.pad_token_id, 1), policy


@pytest.mark.slow
def test_a_low_precision_router_makes_some_routes_differ_and_an_fp32_one_none(small_moe: list[str]) -> None:
    shares = {}
    for precision in ("fp32", "bf16"):
        batch, policy = rollout_and_policy(small_moe, precision)
        _, used = trainer_routes(policy, batch, replay=False)
        shares[precision] = moe.route_metrics(policy)["mismatch/route_diff_frac"]
        has = batch.routes[..., 0, 0] >= 0
        differ = (used.sort(-1).values != batch.routes.sort(-1).values).any(-1).any(-1) & has
        assert shares[precision] == 0 or differ.any()  # the metric counts routes that do differ
        if precision == "fp32":
            assert not differ.any()  # same weights, same precision: the trainer routes every token as the engine did
    assert shares["fp32"] == 0.0
    assert shares["bf16"] > 0.0, shares  # measured: 0.0025 of the decisions (0.0049 of the tokens in a layer)


@pytest.mark.slow
def test_router_replay_makes_the_trainers_routes_the_rollouts_and_lowers_the_mismatch(small_moe: list[str]) -> None:
    batch, policy = rollout_and_policy(small_moe, "bf16")
    m = batch.mask > 0
    gap = {}
    for replay in (False, True):
        logp = packed_logp(policy, batch, replay)
        gap[replay] = float((logp.exp() - batch.behavior_logp.exp()).abs()[m].mean())
    _, used = trainer_routes(policy, batch, replay=True)
    has = batch.routes[..., 0, 0] >= 0
    assert torch.equal(used[has], batch.routes[has].long())  # every recorded token, every layer: the rollout's experts
    _, own = trainer_routes(policy, batch, replay=False)
    assert not torch.equal(own[has].sort(-1).values, batch.routes[has].long().sort(-1).values)  # not by chance
    # The mismatch replay removes (mean |pi - mu| over sampled tokens): measured 2.43e-6 -> 2.16e-6.
    assert gap[True] < gap[False], gap
    print(f"mean |pi - mu|, bf16 router: {gap[False]:.3e} without replay, {gap[True]:.3e} with")


@pytest.mark.slow
def test_the_moe_model_trains_through_run_py_with_a_bf16_router_and_replay(tmp_path: Path, small_moe) -> None:
    out = tmp_path / "run"
    args = [
        *small_moe, *FAST_TRAINER, "rollout=hf", "rollout.router_precision=bf16", "rollout.router_replay=true",
        "trainer.total_steps=2", "trainer.eval_every=2", "trainer.checkpoint_every=0", f"hydra.run.dir={out}",
    ]  # fmt: skip
    res = subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=tmp_path, capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert 0 <= r["mismatch/route_diff_frac"] <= r["mismatch/route_diff_token_frac"] <= 1
        assert r["mismatch/abs_prob_diff_mean"] < 1e-2
    config = json.loads((out / "summary.json").read_text())
    assert config["status"] == "completed"
