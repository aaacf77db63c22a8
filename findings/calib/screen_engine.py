"""|pi - mu| of real rollouts (engine as a run builds it) per mismatch source, 3 seeds x 32 prompts x 8 samples."""

import sys
import time

import torch

from tests.test_mismatch_source import abs_prob_diff, load_tiny

torch.set_num_threads(1)
tiny = load_tiny()
for arg in sys.argv[1:]:
    precision, noise = arg.split(",")
    for seed in (0, 1, 2):
        t0 = time.time()
        d = abs_prob_diff(tiny, precision, float(noise), seed=seed)
        print(
            f"{precision:13s} noise={noise:4s} seed={seed} tokens={d.numel()} mean={d.mean():.5f} "
            f"p99={d.quantile(0.99):.4f} max={d.max():.4f} frac>0.1={(d > 0.1).float().mean():.4f} "
            f"s={time.time() - t0:.1f}",
            flush=True,
        )
