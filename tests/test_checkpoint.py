"""Checkpoints: exact round trips (weights, AdamW state, RNG streams), fallback past bad files, pruning."""

from __future__ import annotations

import copy
import logging
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from harness.loop.checkpoint import load_latest, save_checkpoint

torch.set_num_threads(1)


class TinyLM(nn.Module):
    """Embedding -> linear -> head with the head tied to the embedding, like the project's tiny Qwen3."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.mix = nn.Linear(8, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mix(self.embed(ids))))


def make(seed: int = 0) -> tuple[TinyLM, torch.optim.AdamW]:
    torch.manual_seed(seed)
    model = TinyLM()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train(model: TinyLM, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):  # random batches, so the RNG streams advance as in training
        ids = torch.randint(0, 16, (4, 5))
        loss = nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()


def params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_tree(a: object, b: object) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for k in a:
            assert_same_tree(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same_tree(x, y)
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    else:
        assert a == b


def test_round_trip_restores_weights_optimizer_and_rng(tmp_path: Path) -> None:
    model, opt = make()
    train(model, opt, 2)
    extra = {"data_pos": 7, "scheduler": {"last_epoch": 2, "base_lrs": [0.01]}, "gen": torch.arange(3)}
    path = save_checkpoint(tmp_path, 2, model, opt, extra)
    saved_params, saved_opt = params(model), copy.deepcopy(opt.state_dict())
    draws_after_save = (torch.rand(3), random.random(), np.random.rand())

    train(model, opt, 3)  # the run goes on, then dies; a new process would rebuild model and optimizer
    assert not torch.equal(model.mix.weight, saved_params["mix.weight"])
    state = load_latest(tmp_path, model, opt)

    assert state is not None and state["step"] == 2 and state["path"] == path
    assert_same_tree(state["extra"], extra)
    assert_same_tree(params(model), saved_params)
    assert_same_tree(opt.state_dict(), saved_opt)
    assert model.head.weight is model.embed.weight  # loading copies in place, so the tie survives
    assert_same_tree((torch.rand(3), random.random(), np.random.rand()), draws_after_save)


def test_resumed_training_matches_uninterrupted_training(tmp_path: Path) -> None:
    model, opt = make()
    train(model, opt, 2)
    save_checkpoint(tmp_path, 2, model, opt, {})
    train(model, opt, 3)
    straight = params(model)

    fresh_model, fresh_opt = make(seed=123)  # different init: everything must come from the checkpoint
    assert load_latest(tmp_path, fresh_model, fresh_opt)["step"] == 2
    train(fresh_model, fresh_opt, 3)
    assert_same_tree(params(fresh_model), straight)


def test_no_checkpoint_returns_none(tmp_path: Path) -> None:
    model, opt = make()
    assert load_latest(tmp_path, model, opt) is None


@pytest.mark.parametrize("victim", ["model.safetensors", "optimizer.pt", "state.pt"])
def test_truncated_file_falls_back_to_the_previous_checkpoint(
    tmp_path: Path, victim: str, caplog: pytest.LogCaptureFixture
) -> None:
    model, opt = make()
    train(model, opt, 1)
    save_checkpoint(tmp_path, 1, model, opt, {"data_pos": 1})
    at_step_1 = params(model)
    train(model, opt, 1)
    save_checkpoint(tmp_path, 2, model, opt, {"data_pos": 2})
    bad = tmp_path / "checkpoints" / "step_2" / victim
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])

    with caplog.at_level(logging.WARNING, logger="harness.loop.checkpoint"):
        state = load_latest(tmp_path, model, opt)
    assert state is not None and state["step"] == 1 and state["extra"] == {"data_pos": 1}
    assert_same_tree(params(model), at_step_1)
    assert len(caplog.records) == 1 and "step_2 is unreadable" in caplog.records[0].getMessage()


def test_all_checkpoints_unreadable_returns_none(tmp_path: Path) -> None:
    model, opt = make()
    save_checkpoint(tmp_path, 1, model, opt, {})
    (tmp_path / "checkpoints" / "step_1" / "model.safetensors").write_bytes(b"\x00" * 4)
    assert load_latest(tmp_path, model, opt) is None


def test_keep_prunes_older_checkpoints(tmp_path: Path) -> None:
    model, opt = make()
    for step in range(1, 5):
        train(model, opt, 1)
        save_checkpoint(tmp_path, step, model, opt, {}, keep=2)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_3", "step_4"]
    assert (root / "latest").read_text().strip() == "step_4"


def test_crash_before_rename_is_ignored_and_cleaned_up(tmp_path: Path) -> None:
    model, opt = make()
    save_checkpoint(tmp_path, 4, model, opt, {"data_pos": 4})
    # What a kill during save leaves: a temp folder for step 5 with partial files, `latest` untouched.
    crashed = tmp_path / "checkpoints" / ".tmp-step_5-abc123"
    crashed.mkdir()
    (crashed / "model.safetensors").write_bytes(b"partial")

    assert load_latest(tmp_path, model, opt)["step"] == 4
    save_checkpoint(tmp_path, 5, model, opt, {})
    assert not crashed.exists()


def test_saving_an_earlier_step_drops_the_abandoned_future(tmp_path: Path) -> None:
    # Resumed from step 2 after step 3 turned out unreadable: the next save at step 3 replaces it, and
    # nothing beyond the step just saved survives to be picked up by a later resume.
    model, opt = make()
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, step, model, opt, {"data_pos": step}, keep=4)
    save_checkpoint(tmp_path, 3, model, opt, {"data_pos": 30}, keep=4)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_1", "step_2", "step_3"]
    assert load_latest(tmp_path, model, opt)["extra"] == {"data_pos": 30}


def test_latest_pointer_wins_over_folder_order(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model, opt = make()
    save_checkpoint(tmp_path, 1, model, opt, {}, keep=3)
    save_checkpoint(tmp_path, 2, model, opt, {}, keep=3)
    root = tmp_path / "checkpoints"
    (root / "latest").write_text("step_1\n")
    assert load_latest(tmp_path, model, opt)["step"] == 1
    (root / "latest").write_text("step_9\n")
    with caplog.at_level(logging.WARNING, logger="harness.loop.checkpoint"):
        assert load_latest(tmp_path, model, opt)["step"] == 2
    assert "names step_9, which does not exist" in caplog.text


def test_checkpoint_of_another_model_is_an_error(tmp_path: Path) -> None:
    model, opt = make()
    save_checkpoint(tmp_path, 1, model, opt, {})
    other = nn.Linear(3, 3)
    with pytest.raises(ValueError, match="step_1 does not fit this model/optimizer"):
        load_latest(tmp_path, other, torch.optim.AdamW(other.parameters()))


def test_bad_extra_and_keep_are_refused_before_writing(tmp_path: Path) -> None:
    model, opt = make()
    with pytest.raises(ValueError, match=r"extra\['pos'\]: a ndarray cannot go in a checkpoint"):
        save_checkpoint(tmp_path, 1, model, opt, {"pos": np.zeros(2)})
    with pytest.raises(ValueError, match="keep=0 is not allowed"):
        save_checkpoint(tmp_path, 1, model, opt, {}, keep=0)
    assert not (tmp_path / "checkpoints").exists()
