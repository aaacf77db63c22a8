"""From a Rollout to the tensors an objective needs, and the trainer's forward pass over them.

Layout: prompts are left-padded to a common length P and responses right-padded to T, so response token t of
every row sits at column P + t and is predicted by the hidden state at P + t - 1. Position ids skip the left
padding, so a padded row computes exactly what the unpadded sequence would (the engines see no padding), which is
what makes the fp32 trainer/engine log-probs agree. Only the T response positions go through the LM head: the
prompt's logits over the vocabulary are never built.

The trainer's forward does not run on that padded layout. It packs the rows padding-free (as verl's
remove-padding does): each row's real tokens, position ids restarting at 0, laid end to end into packs no longer
than the longest row, with no attention mask, so transformers builds the block-diagonal causal mask itself (flash
attention: varlen). Rollouts are mostly short with a long tail, so about half of the padded layout's tokens are
padding, and packing skips it (docs/performance.md has what it saved). Only the real
response positions reach the LM head. A model whose attention would mix packed rows is detected once, by a probe,
and gets the padded layout.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import Tensor

from harness import moe
from harness.logprobs import LogProbOutput, logprobs_entropy_topk
from harness.rollout.base import Rollout


@dataclass(frozen=True)
class TrainBatch:
    input_ids: Tensor  # [B, P + T]
    attention_mask: Tensor  # [B, P + T]
    position_ids: Tensor  # [B, P + T]
    prompt_len: int  # P
    response_ids: Tensor  # [B, T]
    mask: Tensor  # [B, T] float
    behavior_logp: Tensor  # [B, T]
    topk_ids: Tensor  # [B, T, K]
    topk_behavior_logp: Tensor  # [B, T, K]
    advantages: Tensor  # [B, T], the sequence advantage on every response token
    routes: Tensor | None = None  # [B, P + T, L, k]: a mixture of experts' routes in the engine (harness.moe)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, rows: Tensor) -> TrainBatch:
        """The given rows, with the padding columns no selected row uses cut away: most responses are far
        shorter than the longest one, and every padded column costs a full forward and backward."""
        keep_t = max(int(self.mask[rows].sum(1).max()), 1)
        keep_p = max(int(self.attention_mask[rows, : self.prompt_len].sum(1).max()), 1)
        cols = slice(self.prompt_len - keep_p, self.prompt_len + keep_t)
        return TrainBatch(
            input_ids=self.input_ids[rows, cols],
            attention_mask=self.attention_mask[rows, cols],
            position_ids=self.position_ids[rows, cols],
            prompt_len=keep_p,
            response_ids=self.response_ids[rows, :keep_t],
            mask=self.mask[rows, :keep_t],
            behavior_logp=self.behavior_logp[rows, :keep_t],
            topk_ids=self.topk_ids[rows, :keep_t],
            topk_behavior_logp=self.topk_behavior_logp[rows, :keep_t],
            advantages=self.advantages[rows, :keep_t],
            routes=None if self.routes is None else self.routes[rows, cols],
        )


def build_batch(ro: Rollout, advantages: Tensor, pad_id: int, topk: int) -> TrainBatch:
    """Rollout + per-sequence advantages [B] -> TrainBatch, keeping the first `topk` top-K entries."""
    b, t = ro.response_ids.shape
    p = max(len(x) for x in ro.prompt_ids)
    prompts = torch.full((b, p), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((b, p), dtype=torch.long)
    for i, ids in enumerate(ro.prompt_ids):
        prompts[i, p - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        prompt_mask[i, p - len(ids) :] = 1
    response_mask = ro.mask.to(torch.long)
    attention = torch.cat([prompt_mask, response_mask], dim=1)
    positions = (attention.cumsum(1) - 1).clamp(min=0)
    mask = ro.mask.float()
    k = min(topk, ro.topk_ids.shape[-1])
    return TrainBatch(
        input_ids=torch.cat([prompts, ro.response_ids.masked_fill(response_mask == 0, pad_id)], dim=1),
        attention_mask=attention,
        position_ids=positions,
        prompt_len=p,
        response_ids=ro.response_ids,
        mask=mask,
        behavior_logp=ro.behavior_logp.float(),
        topk_ids=ro.topk_ids[..., :k],
        topk_behavior_logp=ro.topk_logp[..., :k].float(),
        advantages=advantages.float()[:, None].expand(b, t) * mask,
        routes=ro.routes,
    )


def objective_inputs(
    b: TrainBatch,
    logp: Tensor,
    topk_logp: Tensor | None,
    old_logp: Tensor | None,
    mask: Tensor | None = None,
    is_logp: Tensor | None = None,
) -> dict[str, Tensor | None]:
    """An objective's keyword arguments (`harness.objectives.Objective`) for the policy's log-probs of `b`'s rows:
    mu, the advantages and the mask from the batch (or the loss `mask` a rollout correction left), pi_old as given,
    and `is_logp` when a rollout correction takes the importance ratio against something other than mu."""
    out = {
        "logp": logp, "behavior_logp": b.behavior_logp, "advantages": b.advantages,
        "mask": b.mask if mask is None else mask,
        "old_logp": old_logp, "topk_logp": topk_logp, "topk_behavior_logp": b.topk_behavior_logp,
    }  # fmt: skip
    if is_logp is not None:
        out["is_logp"] = is_logp
    return out


def policy_logprobs(
    model: torch.nn.Module,
    batch: TrainBatch,
    temperature: float = 1.0,
    with_topk: bool = False,
    autocast_dtype: torch.dtype | None = None,
    packed: bool = True,
    replay_routes: bool = False,
) -> LogProbOutput:
    """Forward the policy on a TrainBatch -> LogProbOutput (logp [B, T] with grad, entropy, top-K log-probs).

    packed: run the rows padding-free (module docstring); the result has the [B, T] layout either way, with zeros
    past each response's end. A batch with routes (a mixture of experts) measures the trainer's routing against
    them (`harness.moe.route_metrics`); replay_routes: its tokens use those experts (rollout.router_replay).
    """
    device = next(model.parameters()).device
    topk_ids = batch.topk_ids.to(device) if with_topk else None
    with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        if packed and packing_works(model):
            plan = pack_rows(batch)
            routes = None if batch.routes is None else moe.forward_routes(batch.routes, plan.origin)
            with moe.given_routes(model, routes, replay_routes):
                logits = _logits_at(model, plan.input_ids.to(device), plan.position_ids.to(device), None, plan.source)
            valid = plan.valid.to(device)
            out = logprobs_entropy_topk(
                logits,
                batch.response_ids.to(device)[valid],
                None if topk_ids is None else topk_ids[valid],
                temperature=temperature,
            )
            return LogProbOutput(
                logp=_unflatten(out.logp, valid),
                entropy=None if out.entropy is None else _unflatten(out.entropy, valid),
                topk_logp=None if out.topk_logp is None else _unflatten(out.topk_logp, valid),
            )
        p, t = batch.prompt_len, batch.response_ids.shape[1]
        b, length = batch.input_ids.shape
        flat = (torch.arange(b)[:, None] * length + torch.arange(p - 1, p + t - 1)[None]).flatten()
        routes = None if batch.routes is None else moe.forward_routes(batch.routes, None)
        with moe.given_routes(model, routes, replay_routes):
            logits = _logits_at(
                model,
                batch.input_ids.to(device),
                batch.position_ids.to(device),
                batch.attention_mask.to(device),
                flat,
            ).unflatten(0, (b, t))
    return logprobs_entropy_topk(logits, batch.response_ids.to(device), topk_ids, temperature=temperature)


def _logits_at(
    model: torch.nn.Module, input_ids: Tensor, position_ids: Tensor, attention_mask: Tensor | None, flat: Tensor
) -> Tensor:
    """[n, V] logits of the hidden states at `flat` (indices into the B * L positions), without the logits of
    every position: the decoder, then the head on the kept rows only.

    A model sharded by FSDP2 has to be called through its own forward (the root's hooks gather the embeddings,
    final norm and head), so it gets the positions any row needs via `logits_to_keep` and the rows are picked
    from those."""
    from torch.distributed.fsdp import FSDPModule

    flat = flat.to(input_ids.device)
    if not isinstance(model, FSDPModule):
        hidden = model.get_decoder()(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state
        return model.get_output_embeddings()(hidden.flatten(0, 1)[flat])
    length = input_ids.shape[1]
    keep = torch.unique(flat % length)  # sorted
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
        logits_to_keep=keep,
    ).logits  # [B, len(keep), V]
    return logits.flatten(0, 1)[(flat // length) * len(keep) + torch.searchsorted(keep, flat % length)]


@dataclass(frozen=True)
class PackPlan:
    input_ids: Tensor  # [R, L]: rows laid end to end, each pack at most as long as the longest row
    position_ids: Tensor  # [R, L]: restarting at 0 for every row (and for the padding after a pack's last row)
    source: Tensor  # [n]: flat index into R * L of the hidden state that predicts each valid response token
    valid: Tensor  # [B, T] bool: response positions up to each row's last unmasked token, row-major like `source`
    origin: Tensor  # [R, L]: each slot's token as a flat index into the batch's B * (P + T) columns; -1 = padding


def pack_rows(batch: TrainBatch, pad_id: int = 0) -> PackPlan:
    """Plan a padding-free forward of `batch`: a row is its prompt and its response minus the last token (whose
    hidden state predicts nothing), and packs are at most the longest row's length (`pack_lengths`), so the packed
    forward never costs more than the padded one."""
    b, t = batch.mask.shape
    cols = torch.arange(t)
    resp_len = torch.where(batch.mask > 0, cols + 1, 0).amax(1) if t else torch.zeros(b, dtype=torch.long)
    prompt_len = batch.attention_mask[:, : batch.prompt_len].sum(1)
    seq_len = prompt_len + (resp_len - 1).clamp(min=0)
    lengths = seq_len.tolist()
    cap = max(lengths)
    packs = pack_lengths(lengths)
    ids = torch.full((len(packs), cap), pad_id, dtype=torch.long)
    pos = torch.zeros((len(packs), cap), dtype=torch.long)
    start = torch.zeros(b, dtype=torch.long)  # flat index of each row's first token
    origin = torch.full((len(packs), cap), -1, dtype=torch.long)
    width = batch.input_ids.shape[1]
    for r, pack in enumerate(packs):
        offset = 0
        for i in pack:
            p, n = int(prompt_len[i]), lengths[i]
            ids[r, offset : offset + p] = batch.input_ids[i, batch.prompt_len - p : batch.prompt_len]
            ids[r, offset + p : offset + n] = batch.response_ids[i, : n - p]
            origin[r, offset : offset + n] = i * width + batch.prompt_len - p + torch.arange(n)
            pos[r, offset : offset + n] = torch.arange(n)
            start[i] = r * cap + offset
            offset += n
        pos[r, offset:] = torch.arange(cap - offset)  # the tail is one more "row", attending only to itself
    valid = cols[None, :] < resp_len[:, None]
    # Response token j of row i is predicted by the hidden state at the row's position prompt_len + j - 1.
    source = (start + prompt_len - 1)[:, None] + cols[None, :]
    return PackPlan(input_ids=ids, position_ids=pos, source=source[valid], valid=valid, origin=origin)


def pack_lengths(lengths: list[int]) -> list[list[int]]:
    """Group item indices into packs whose lengths sum to at most the longest item's: longest first, each pack
    topped up with the shortest items left (two pointers, linear after the sort)."""
    cap = max(lengths, default=0)
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    packs: list[list[int]] = []
    lo, hi = 0, len(order) - 1
    while lo <= hi:
        pack, used = [order[lo]], lengths[order[lo]]
        lo += 1
        while lo <= hi and used + lengths[order[hi]] <= cap:
            pack.append(order[hi])
            used += lengths[order[hi]]
            hi -= 1
        packs.append(pack)
    return packs


_PACKING: weakref.WeakKeyDictionary[torch.nn.Module, bool] = weakref.WeakKeyDictionary()


def packing_works(model: torch.nn.Module) -> bool:
    """Whether `model` keeps packed rows apart (no attention mask, position ids restarting at 0): probed once per
    model by changing the first of two packed rows and checking that the second row's hidden states stay put."""
    if model not in _PACKING:
        device = next(model.parameters()).device
        vocab = model.get_output_embeddings().weight.shape[0]
        second = torch.arange(5, device=device) % vocab
        pos = torch.cat([torch.arange(4), torch.arange(5)])[None].to(device)
        outs = []
        with torch.no_grad():
            for first in (torch.zeros(4, dtype=torch.long), torch.full((4,), 1, dtype=torch.long)):
                ids = torch.cat([first.to(device), second])[None]
                outs.append(_logits_at(model, ids, pos, None, torch.arange(4, 9)).float())
        scale = float(outs[0].abs().max().clamp(min=1e-6))
        _PACKING[model] = float((outs[0] - outs[1]).abs().max()) <= 1e-3 * scale
    return _PACKING[model]


def _unflatten(values: Tensor, valid: Tensor) -> Tensor:
    """[n, ...] values at the True positions of valid [B, T] -> [B, T, ...], zeros elsewhere (differentiable)."""
    shape = (*valid.shape, *values.shape[1:])
    where = valid.reshape(*valid.shape, *([1] * (values.dim() - 1))).expand(shape)
    return values.new_zeros(shape).masked_scatter(where, values)
