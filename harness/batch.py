"""From a Rollout to the tensors an objective needs, and the trainer's forward pass over them.

Layout: prompts are left-padded to a common length P and responses right-padded to T, so response token t of
every row sits at column P + t and is predicted by the hidden state at P + t - 1. Position ids skip the left
padding, so a padded row computes exactly what the unpadded sequence would (the engines see no padding), which is
what makes the fp32 trainer/engine log-probs agree. Only the T response positions go through the LM head: the
prompt's logits over the vocabulary are never built.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from harness.logprobs import logprobs_entropy_topk
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
    )


def policy_logprobs(
    model: torch.nn.Module,
    batch: TrainBatch,
    temperature: float = 1.0,
    with_topk: bool = False,
    autocast_dtype: torch.dtype | None = None,
):
    """Forward the policy on a TrainBatch -> LogProbOutput (logp [B, T] with grad, entropy, top-K log-probs)."""
    device = next(model.parameters()).device
    with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        hidden = model.get_decoder()(
            input_ids=batch.input_ids.to(device),
            attention_mask=batch.attention_mask.to(device),
            position_ids=batch.position_ids.to(device),
            use_cache=False,
        ).last_hidden_state
        p, t = batch.prompt_len, batch.response_ids.shape[1]
        logits = model.get_output_embeddings()(hidden[:, p - 1 : p + t - 1])
    return logprobs_entropy_topk(
        logits,
        batch.response_ids.to(device),
        batch.topk_ids.to(device) if with_topk else None,
        temperature=temperature,
    )
