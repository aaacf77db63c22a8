"""Per-token samples (`tokens.parquet`): the data behind the papers' per-token plots.

At every evaluation step the trainer keeps a bounded random sample of the response tokens of that step's first
mini-batch, before its update: mu (rollout engine), pi (trainer), the advantage, the entropy, and the
objective's gradient weight on that token. The weight is read off autograd, not re-derived per objective: with
loss = L(logp), the token's gradient is c * grad(log pi) with c = -dL/dlogp, and `weight = c / A`. For PG-IS that
is pi/mu, for a mask method the same or 0 (so `kept = weight != 0`), for SPO/DRPO the regularised weight, which
can be negative. One code path therefore covers every objective, including ones added later.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from harness.batch import TrainBatch
from harness.logprobs import LogProbOutput
from harness.rundir.files import atomic_write_bytes, writing

COLUMNS = ("step", "row", "pos", "token_id", "mu", "pi", "pi_old", "adv", "entropy", "kept", "weight")


def token_rows(
    step: int,
    loss_mat: torch.Tensor,
    lp: LogProbOutput,
    mb: TrainBatch,
    old_logp: torch.Tensor | None,
    limit: int,
    generator: torch.Generator,
) -> pd.DataFrame:
    """Up to `limit` response tokens (uniform without replacement over tokens with A != 0) as a DataFrame.

    `loss_mat` must still be attached to `lp.logp` (call before `backward`): the gradient weight is taken from it.
    """
    logp, mask, advantages, entropy = lp.logp, mb.mask, mb.advantages, lp.entropy
    (grad,) = torch.autograd.grad(loss_mat.sum(), logp, retain_graph=True)
    coeff = -grad.detach()
    where = ((mask > 0) & (advantages != 0)).nonzero()
    if len(where) > limit:
        where = where[torch.randperm(len(where), generator=generator)[:limit]]
    r, t = where[:, 0], where[:, 1]
    adv = advantages[r, t]
    weight = coeff[r, t] / adv
    frame = {
        "step": torch.full_like(r, step),
        "row": r,
        "pos": t,
        "token_id": mb.response_ids[r, t],
        "mu": mb.behavior_logp[r, t].exp(),
        "pi": logp.detach()[r, t].exp(),
        "pi_old": old_logp[r, t].exp() if old_logp is not None else torch.full_like(adv, float("nan")),
        "adv": adv,
        "entropy": entropy[r, t] if entropy is not None else torch.full_like(adv, float("nan")),
        "kept": weight != 0,
        "weight": weight,
    }
    return pd.DataFrame({k: v.detach().cpu().numpy() for k, v in frame.items()}, columns=list(COLUMNS))


class TokenSamples:
    """Accumulates samples and rewrites `tokens.parquet` whole (atomically) after each evaluation step.

    The file stays small (limit x evaluations rows), so a rewrite is cheaper than managing parquet row groups,
    and a resumed run keeps exactly the rows of the steps it had finished.
    """

    def __init__(self, run_dir: Path, resume_after: int | None = None) -> None:
        self.path = Path(run_dir) / "tokens.parquet"
        self.frames: list[pd.DataFrame] = []
        if resume_after is not None and self.path.exists():
            old = pd.read_parquet(self.path)
            self.frames.append(old[old["step"] <= resume_after])

    def add(self, frame: pd.DataFrame) -> None:
        self.frames.append(frame)
        table = pd.concat(self.frames, ignore_index=True)
        with writing(self.path):
            atomic_write_bytes(self.path, table.to_parquet(index=False))
