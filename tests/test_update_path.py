"""The update path's arithmetic, without a model: how a split mini-batch's parts are normalised, and which
non-finite input skips an update rather than failing it (harness.loop.step)."""

from __future__ import annotations

import pytest
import torch

from harness.loop.step import minibatch_loss, objective_or_skip
from harness.objectives import AGG_MODES, aggregate, aggregate_denominator, get_objective

# A mini-batch of four rows (the third fully masked), split in two as the loop splits one: into the rows with
# signal, and across ranks. Tokens 2 + 4 + 3 = 9, rows with a token 3, row sums 2, 8, 9, row means 1, 2, 3.
LOSS = torch.tensor([[1.0, 1.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0], [9.0, 9.0, 9.0, 9.0], [3.0, 3.0, 3.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
PARTS = [torch.tensor([0, 2]), torch.tensor([1, 3])]
# mode: (the whole mini-batch's denominator, the loss of rows {0, 2}, the loss of rows {1, 3}), horizon 8
SPLIT = {
    "token-mean": (9, 2 / 9, 17 / 9),
    "token-sum": (1, 2.0, 17.0),
    "seq-mean-token-mean": (3, 1 / 3, 5 / 3),
    "seq-mean-token-sum": (3, 2 / 3, 17 / 3),
    "seq-mean-token-sum-norm": (3, 2 / 24, 17 / 24),
}


@pytest.mark.parametrize("mode", AGG_MODES)
def test_each_part_of_a_split_minibatch_is_normalised_by_the_whole_in_every_aggregation(mode):
    """The loop rescales a part's loss by aggregate's own denominator, whatever the mode (a mode without a row
    here fails): each part is its share of the whole's loss, by hand, and the parts sum to aggregate() of it."""
    full, *expected = SPLIT[mode]
    assert aggregate_denominator(MASK, mode).item() == full
    losses = [minibatch_loss(LOSS[rows], MASK[rows], mode, 8, float(full)).item() for rows in PARTS]
    assert losses == pytest.approx(expected, rel=1e-6)
    assert sum(losses) == pytest.approx(aggregate(LOSS, MASK, mode, horizon=8).item(), rel=1e-6)


@pytest.mark.parametrize(
    "poisoned,skipped",
    [
        ((), False),
        (("logp",), True),
        (("behavior_logp",), True),
        (("old_logp",), True),
        (("topk_logp",), True),
        (("logp", "advantages"), True),
        (("advantages",), None),
        (("topk_behavior_logp",), None),
    ],
)
def test_the_objectives_input_check_decides_a_skipped_update(poisoned, skipped):
    """The training path's only finite-input check is the objective's: a NaN in the model's or the engine's
    log-probs skips the update (None); one in the advantages or the top-K mu alone is the objective's error.
    The padding's NaN counts for nothing."""
    from types import SimpleNamespace

    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    t = {
        "logp": torch.full((2, 3), -1.0),
        "behavior_logp": torch.full((2, 3), -1.1),
        "old_logp": torch.full((2, 3), -1.05),
        "advantages": torch.tensor([[1.0] * 3, [-1.0] * 3]),
        "topk_logp": torch.full((2, 3, 2), -1.0),
        "topk_behavior_logp": torch.full((2, 3, 2), -1.1),
    }
    for name in t:
        t[name][0, 2] = float("nan")  # padding
    for name in poisoned:
        t[name][1, 1] = float("nan")
    lp = SimpleNamespace(logp=t["logp"], entropy=torch.ones(2, 3), topk_logp=t["topk_logp"])
    b = SimpleNamespace(
        mask=mask,
        behavior_logp=t["behavior_logp"],
        advantages=t["advantages"],
        topk_behavior_logp=t["topk_behavior_logp"],
    )
    objective = get_objective("dppo_topk_tv")
    if skipped is None:
        with pytest.raises(ValueError, match=rf"\({poisoned[0]}: \d+ tokens\)"):
            objective_or_skip(objective, lp, b, t["old_logp"])
        return
    out = objective_or_skip(objective, lp, b, t["old_logp"])
    assert (out is None) == skipped
