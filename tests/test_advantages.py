import pytest
import torch

from harness.advantages import compute_advantages


def test_spec_vector_and_zero_std_groups():
    rewards = torch.tensor([1.0, 0, 0, 1, 1, 1, 1, 1])
    group = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    adv, metrics = compute_advantages(rewards, group, "drgrpo")
    assert adv.tolist() == [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]
    assert metrics["reward/zero_std_group_frac"] == 0.5
    adv, _ = compute_advantages(rewards, group, "grpo")
    # unbiased std of [1,0,0,1] = sqrt(1/3) = 0.57735 -> 0.5/0.57735 = 0.866025
    assert adv[:4].tolist() == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=1e-5)
    assert (adv[4:] == 0).all()
    adv, _ = compute_advantages(rewards, group, "rloo")
    # 1 - mean(0, 0, 1) = 2/3
    assert adv[:4].tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])


def test_groups_in_any_order_and_errors():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    adv, _ = compute_advantages(rewards, torch.tensor([7, 3, 7, 3]), "drgrpo")
    assert adv.tolist() == [0.5, -0.5, -0.5, 0.5]
    with pytest.raises(ValueError, match="not one of"):
        compute_advantages(rewards, torch.tensor([0, 0, 1, 1]), "gae")
    with pytest.raises(ValueError, match="at least 2 samples"):
        compute_advantages(rewards, torch.tensor([0, 1, 2, 3]), "rloo")
