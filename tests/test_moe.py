"""The tiny mixture of experts (issue 59, model d): its keys, its cache folder, its build."""

from __future__ import annotations

import json

import pytest
from transformers import Qwen3Config

from harness import moe
from harness.config import compose, validate
from harness.loop.model_path import model_dir, tiny_spec
from harness.models import TinyModelConfig, tiny_model_dir
from tests.conftest import SMALL_MODEL

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
    ],
)
def test_bad_moe_values_are_refused_in_one_line_before_any_build(overrides: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message) as e:
        validate(compose(*overrides))  # a pure function of the config: no model is built or read
    assert "\n" not in str(e.value)


def test_the_moe_preset_composes_and_the_tiny_builder_refuses_bad_counts() -> None:
    run = validate(compose("model=tiny_moe", "rollout=hf"))
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
