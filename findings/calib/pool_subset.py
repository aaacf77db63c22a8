"""A small sanity pool for calibration v9 (CALIBRATION.md section 16): `N` problems of the default sanity pool (the
train problems the warm start solves 2-6 times of 8, `findings/pools/tiny_pass_rates.json`), drawn with a fixed seed
in equal shares per kind (the trainer's `balanced_sample` feeds the kinds in equal shares anyway). The file keeps the
pass-rate layout of `harness.tasks.pool`, so `data.pool_path` reads it unchanged; problems it leaves out have no
rate and are dropped by the same filter. Usage: PYTHONPATH=. python findings/calib/pool_subset.py [N] [OUT]"""

import json
import random
import sys
from pathlib import Path

from harness.config import DataConfig
from harness.tasks import load_training_set
from harness.tasks.pool import filter_pool, load_pass_rates

SOURCE = Path("findings/pools/tiny_pass_rates.json")
LOW, HIGH, SEED = 0.2, 0.8, 0


def subset(n: int) -> dict:
    source = json.loads(SOURCE.read_text())
    rates = load_pass_rates(SOURCE)

    by_kind: dict[str, list[str]] = {}
    # The sanity pool exactly as a run with the source file loads it: the default arith split, filtered.
    for p in filter_pool(load_training_set(DataConfig(name="arith")), rates, LOW, HIGH):
        by_kind.setdefault(p.kind, []).append(p.id)
    rng, kinds = random.Random(SEED), sorted(by_kind)
    shares = [n // len(kinds) + (j < n % len(kinds)) for j in range(len(kinds))]
    picked = [i for k, share in zip(kinds, shares, strict=True) for i in rng.sample(sorted(by_kind[k]), share)]
    return {
        **{k: source[k] for k in ("model", "samples", "max_new_tokens", "temperature")},
        "subset_of": f"{SOURCE}: {n} problems rated in [{LOW}, {HIGH}], equal shares per kind, seed {SEED}",
        "pass_rate": {i: rates[i] for i in sorted(picked)},
    }


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    out = Path(sys.argv[2] if len(sys.argv) > 2 else f"findings/pools/tiny_sanity{n}.json")
    out.write_text(json.dumps(subset(n), indent=1) + "\n")
    print(f"{out}: {n} problems")
