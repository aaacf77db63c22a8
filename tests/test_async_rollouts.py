"""Issue 50: asynchronous rollouts (trainer.max_staleness = k).

The worker (harness.loop.rollouts.AsyncRollouts) with the real HF engine and a trainer that really changes its
weights each step: every batch the trainer takes was sampled by the policy exactly min(k, t - 1) updates old, and
its mu is that policy's log-prob of the sampled tokens (the producing engine's), not the trainer's current one; a
planted stale batch, its mu from another version, fails the same check. Then real run.py runs: the staleness
metrics, and with vLLM.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from harness.config import compose, validate
from harness.loop.model_path import model_dir
from harness.loop.rollouts import AsyncRollouts
from harness.models import load_policy
from harness.rollout import engine_from_config
from harness.rollout.base import Rollout, RolloutEngine
from harness.rollout.process import ProcessEngine
from tests.conftest import FAST_TRAINER, ROOT

pytestmark = pytest.mark.slow


def logp_under(model: torch.nn.Module, state: dict[str, torch.Tensor], ro: Rollout) -> torch.Tensor:
    """[B, T] log-probs of the sampled tokens under `state`'s weights, temperature 1, 0 at padding."""
    model.load_state_dict(state)
    out = torch.zeros_like(ro.behavior_logp)
    with torch.no_grad():
        for i, prompt in enumerate(ro.prompt_ids):
            n = int(ro.mask[i].sum())
            ids = torch.tensor([prompt + ro.response_ids[i, :n].tolist()])
            logits = model(ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + n].float()
            out[i, :n] = logits.log_softmax(-1).gather(-1, ids[0, len(prompt) :, None])[:, 0]
    return out


def mu_gap(model: torch.nn.Module, state: dict[str, torch.Tensor], ro: Rollout) -> float:
    """max |mu - log pi_state| over the sampled tokens: ~0 when `state` is the policy that produced the batch."""
    m = ro.mask > 0
    return float((logp_under(model, state, ro) - ro.behavior_logp)[m].abs().max())


def hf_engine(small_model: list[str], where: str) -> RolloutEngine:
    """The fp32 HF engine of the small model, in this process or in its own (the asynchronous loop's)."""
    cfg = validate(compose(*small_model, "rollout=hf"))
    build = (cfg.rollout, str(model_dir(cfg)), "fp32", 0, 128, "cpu")
    return ProcessEngine(build, threads=1) if where == "process" else engine_from_config(*build)


@pytest.mark.parametrize(("k", "where"), [(1, "thread"), (2, "thread"), (2, "process")])
def test_every_trained_batch_lags_by_k_and_its_mu_is_the_producing_engines(small_model, k, where):
    path = str(model_dir(validate(compose(*small_model))))
    trainer, tokenizer = load_policy(path)
    scratch, _ = load_policy(path)
    engine = hf_engine(small_model, where)
    prompts = [tokenizer.encode(q) for q in ("3 + 4 =", "12 - 5 =")]
    versions = {0: {n: t.clone() for n, t in trainer.state_dict().items()}}
    steps = 6

    rollouts = AsyncRollouts(
        lambda step: engine.generate(prompts, n=2, max_new_tokens=8, seed=step), engine.sync_weights, k,
        range(1, steps + 1), (0, versions[0]),
    )  # fmt: skip
    g = torch.Generator().manual_seed(0)
    try:
        for t in range(1, steps + 1):
            made = rollouts.take(t)
            assert made.step == t and t - 1 - made.version == min(k, t - 1)  # exactly k behind, once it can be
            # mu is the producing policy's log-prob (fp32 HF engine: to rounding) ...
            assert mu_gap(scratch, versions[made.version], made.rollout) < 1e-4
            if made.version != t - 1:  # ... and not the trainer's current one, which differs by the updates since
                assert mu_gap(scratch, versions[t - 1], made.rollout) > 1e-2
                # A planted stale batch: its mu from the version after the one recorded fails the same check.
                planted = logp_under(scratch, versions[made.version + 1], made.rollout)
                bad = Rollout(**{**made.rollout.__dict__, "behavior_logp": planted})
                assert mu_gap(scratch, versions[made.version], bad) > 1e-2
            with torch.no_grad():  # the "update": every weight moves, as after an optimizer step
                for p in trainer.parameters():
                    p.add_(0.05 * torch.randn(p.shape, generator=g))
            versions[t] = {n: x.clone() for n, x in trainer.state_dict().items()}
            rollouts.publish(t, versions[t])
    finally:
        rollouts.close()
        engine.close()


def test_the_engine_process_samples_what_the_engine_in_process_does(small_model):
    """Same seeds, same weights after a sync: the same tokens and the same mu, whichever process holds the engine;
    a build that fails in the child is the same one-line error as in-process."""
    path = str(model_dir(validate(compose(*small_model))))
    model, tokenizer = load_policy(path)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.1)  # weights the engines did not load from disk
    prompts = [tokenizer.encode(q) for q in ("3 + 4 =", "12 - 5 =")]
    made = {}
    for where in ("thread", "process"):
        engine = hf_engine(small_model, where)
        try:
            engine.sync_weights(model.state_dict())
            made[where] = [engine.generate(prompts, n=2, max_new_tokens=8) for _ in range(2)]  # seeds from calls
        finally:
            engine.close()
    for a, b in zip(made["thread"], made["process"], strict=True):
        assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.mask, b.mask)
        assert torch.equal(a.behavior_logp, b.behavior_logp)
    assert not torch.equal(made["thread"][0].response_ids, made["thread"][1].response_ids)  # two calls, two seeds

    cfg = validate(compose(*small_model, "rollout=hf"))
    with pytest.raises(ValueError) as missing:
        ProcessEngine((cfg.rollout, "/nonexistent/model", "fp32", 0, 128, "cpu"), threads=1)
    assert "\n" not in str(missing.value) and "/nonexistent/model" in str(missing.value)


CHILD_PID = """
import sys
from harness.config import compose, validate
from harness.loop.model_path import model_dir
from harness.rollout.process import ProcessEngine
if __name__ == "__main__":
    cfg = validate(compose(*sys.argv[1:], "rollout=hf"))
    engine = ProcessEngine((cfg.rollout, str(model_dir(cfg)), "fp32", 0, 128, "cpu"), threads=1)
    print(engine._proc.pid, flush=True)
    sys.stdin.read()
"""


def test_the_engine_process_leaves_with_a_killed_trainer(small_model):
    """SIGKILL (preemption) of the process that holds a ProcessEngine: its engine process must not outlive it."""
    parent = subprocess.Popen([sys.executable, "-c", CHILD_PID, *small_model], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)  # fmt: skip
    try:
        child = int(parent.stdout.readline())
        os.kill(child, 0)  # alive while its parent is
        parent.kill()
        parent.wait(timeout=30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and pid_alive(child):
            time.sleep(0.2)
        assert not pid_alive(child), f"engine process {child} outlived its killed parent"
    finally:
        parent.kill()


def pid_alive(pid: int) -> bool:
    """A process that exists and is not a zombie (an orphan is reaped by init, a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def run(args: list[str], cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)  # fmt: skip


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_an_asynchronous_run_logs_its_staleness(tmp_path, small_model, engine):
    out = tmp_path / "run"
    args = [
        *small_model, *FAST_TRAINER, f"rollout={engine}", "objective=dppo", "trainer.total_steps=4",
        "trainer.eval_every=2", "trainer.checkpoint_every=0", "trainer.max_staleness=2", f"hydra.run.dir={out}",
    ]  # fmt: skip
    res = run(args, tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["rollout/policy_version"], r["rollout/staleness"]) for r in rows] == [
        (1, 0.0, 0.0), (2, 0.0, 1.0), (3, 0.0, 2.0), (4, 1.0, 2.0),
    ]  # fmt: skip
    evals = [json.loads(line)["step"] for line in (out / "eval.jsonl").read_text().splitlines()]
    assert evals == [0, 2, 4]
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"


def test_under_torchrun_rank_0s_engine_feeds_both_ranks_as_one_process(tmp_path, small_model):
    """Two gloo processes with k = 1 log what one process logs: rank 0's worker made the batches, the trainer's
    weight copy (a collective) reached it after every step, and its sharded checkpoint carries the promised batch."""
    args = [
        *small_model, *FAST_TRAINER, "rollout=hf", "objective=dppo", "trainer.minibatches=1", "trainer.total_steps=4",
        "trainer.checkpoint_every=2", "trainer.max_staleness=1", "seed=1",
    ]  # fmt: skip
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(ROOT / "run.py")]
    for launcher, name in (([str(ROOT / "run.py")], "one"), (torchrun, "two")):
        res = subprocess.run([sys.executable, *launcher, *args, f"hydra.run.dir={tmp_path / name}"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=600)  # fmt: skip
        assert res.returncode == 0, res.stderr[-3000:]

    def rows(name: str) -> list[tuple]:
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        keys = ("step", "rollout/policy_version", "reward/mean", "optim/updates")
        return [tuple(json.loads(line).get(k) for k in keys) for line in lines]

    assert rows("one") == rows("two")
    assert [r[1] for r in rows("two")] == [0.0, 0.0, 1.0, 2.0]
    state = torch.load(tmp_path / "two" / "checkpoints" / "step_2" / "state.pt", weights_only=True)
    assert [(b["step"], b["version"]) for b in state["extra"]["rollouts"]] == [(3, 1)]
