"""Screen quantisation variants of the rollout copy: teacher-forced |pi - mu| on 256 fp32-sampled responses."""

import copy
import random
import sys

import torch

from harness.config import compose, validate
from harness.loop.state import model_dir
from harness.quant import QuantSpec, quantize_model, quantize_state_dict
from harness.rollout.hf import HFEngine
from harness.tasks import load_problems, render_prompts
from harness.tasks.arith import balanced_sample

torch.set_num_threads(1)
cfg = validate(compose("rollout=hf", "logger=none"))
eng = HFEngine(str(model_dir(cfg)), torch.float32, seed=0)
train, _ = load_problems(cfg.data, cfg.benchmark)
prompts = render_prompts(eng.tokenizer, balanced_sample(train, 32, random.Random(1)), "chat")
ro = eng.generate(prompts, n=8, max_new_tokens=24, seed=1)
P = [p for p in prompts for _ in range(8)]
R = [ro.response_ids[i][ro.mask[i].bool()].tolist() for i in range(len(P))]
base = eng.score(P, R)
valid = torch.zeros_like(base, dtype=torch.bool)
for i, r in enumerate(R):
    valid[i, : len(r)] = True
print("tokens", int(valid.sum()))
fp32_model = eng.model
# each argument: weights,activations,head e.g. int4,int4,0 (activations None = weights only)
grid = [tuple(None if x == "None" else x for x in v.split(",")) for v in sys.argv[1:]]
for w, a, h in grid:
    spec = QuantSpec(w, a, h == "1")
    m = copy.deepcopy(fp32_model)
    m.load_state_dict(quantize_state_dict(m.state_dict(), spec), strict=False)
    quantize_model(m, spec)
    eng.model = m
    d = (eng.score(P, R).exp() - base.exp()).abs()[valid]
    print(
        f"w={w:5s} a={a!s:5s} head={h} mean={d.mean():.5f} max={d.max():.4f} frac>0.1={(d > 0.1).float().mean():.4f}",
        flush=True,
    )
