"""One mini-batch update, run by tests/test_distributed.py as one process or under `torchrun --nproc_per_node=2`.

It goes through the pieces `harness.loop.step` uses for a mini-batch: FSDP2 sharding (`ProcessGroup.shard`), each
rank's rows `rows[rank::world]`, the policy forward (`policy_logprobs`), the objective, `minibatch_loss` with the
global mini-batch's denominator, backward of `loss * world`, and the gradient clip. Rank 0 writes the global loss,
the gradient norm and every full gradient to `out` (torch.save).

    python tests/dist_worker.py OUT OBJECTIVE:AGG [OBJECTIVE:AGG ...]
"""

from __future__ import annotations

import sys

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from harness import distributed
from harness.batch import build_batch, policy_logprobs
from harness.loop.step import _full, minibatch_loss
from harness.objectives import aggregate_denominator, get_objective
from harness.rollout.base import Rollout

ROWS, PROMPT, T, VOCAB = 8, 5, 7, 96


def global_batch():
    """A fixed rollout: ragged prompts and responses, mixed-sign advantages, two rows without signal."""
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(4, VOCAB, (PROMPT - i % 3,), generator=g).tolist() for i in range(ROWS)]
    lengths = torch.tensor([7, 3, 5, 1, 6, 7, 2, 4])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    ro = Rollout(
        prompt_ids=prompts,
        response_ids=torch.randint(4, VOCAB, (ROWS, T), generator=g) * mask.long(),
        mask=mask,
        behavior_logp=-torch.rand(ROWS, T, generator=g) * 3 * mask,
        topk_ids=torch.zeros(ROWS, T, 1, dtype=torch.long),
        topk_logp=torch.zeros(ROWS, T, 1),
        finished=torch.ones(ROWS, dtype=torch.bool),
        group=torch.arange(ROWS) // 4,
        texts=[""] * ROWS,
    )
    adv = torch.tensor([0.5, -1.0, 0.0, 2.0, -0.5, 0.0, 1.0, -2.0])
    return build_batch(ro, adv, pad_id=0, topk=1)


def update(d: distributed.ProcessGroup, objective_name: str, agg: str) -> dict:
    torch.manual_seed(0)  # the same initial weights in every process
    config = Qwen3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, tie_word_embeddings=True,
    )  # fmt: skip
    policy = d.shard(Qwen3ForCausalLM(config))
    objective = get_objective(objective_name)
    batch = global_batch()
    rows = torch.arange(ROWS)  # the mini-batch: every row of the batch
    full_denominator = float(aggregate_denominator(batch.mask[rows], agg))
    rows = rows[d.rank :: d.world]
    active = (batch.advantages[rows] != 0).any(1)
    mb = batch.select(rows[active])
    lp = policy_logprobs(policy, mb, 1.0)
    out = objective(
        logp=lp.logp, behavior_logp=mb.behavior_logp, advantages=mb.advantages, mask=mb.mask,
        old_logp=mb.behavior_logp.clone(),
    )  # fmt: skip
    loss = minibatch_loss(out.loss_mat, mb.mask, agg, T, full_denominator)
    (loss * d.world).backward()
    grads = {name: _full(p.grad).detach().clone() for name, p in policy.named_parameters()}
    grad_norm = _full(torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0))
    global_loss = d.all_sum(float(loss.detach()))
    return {"loss": global_loss, "grad_norm": float(grad_norm), "grads": grads, "world": d.world}


def main(out: str, *cases: str) -> None:
    """cases: OBJECTIVE:AGG ..."""
    d = distributed.setup()
    torch.set_num_threads(1)
    results = {case: update(d, *case.split(":")) for case in cases}
    if d.main:
        torch.save(results, out)
    d.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
