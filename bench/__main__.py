"""``python -m bench``: the CPU benchmark set in order, each in its own process, then the summary table.

Order: logprobs (B1), topk (B2), objectives (B5), then rollout (B3), rl_step (B4) and async_step (B6) when those
modules exist.
Each runs as ``python -m bench.<name> --threads N`` in a subprocess, so one script's allocator state (glibc
thresholds, freed-but-kept memory, autograd caches) never leaks into the next one's timings, and a failing
script is reported without stopping the rest. ``--skip topk objectives`` leaves scripts out; ``--only`` runs
just the named ones. Exit status: 0 unless a script failed (missed targets are in the table, not errors).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time

SCRIPTS = ("logprobs", "topk", "objectives", "rollout", "rl_step", "async_step")
# Every script takes --threads; OMP_NUM_THREADS also covers threads started before torch.set_num_threads.


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip", nargs="*", default=[], choices=SCRIPTS, help="scripts to leave out")
    parser.add_argument("--only", nargs="*", default=None, choices=SCRIPTS, help="run just these")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads, passed to every script")
    args = parser.parse_args()

    chosen = [s for s in SCRIPTS if (args.only is None or s in args.only) and s not in args.skip]
    failed = []
    t0 = time.perf_counter()
    for name in chosen:
        if importlib.util.find_spec(f"bench.{name}") is None:
            print(f"== bench.{name}: not present, skipped", flush=True)
            continue
        print(f"== bench.{name}", flush=True)
        start = time.perf_counter()
        cmd = [sys.executable, "-m", f"bench.{name}", "--threads", str(args.threads)]
        rc = subprocess.call(cmd, env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
        print(f"== bench.{name}: {time.perf_counter() - start:.0f} s, exit {rc}", flush=True)
        if rc != 0:
            failed.append(name)
    print(f"== summary ({time.perf_counter() - t0:.0f} s in all)", flush=True)
    subprocess.call([sys.executable, "-m", "bench.summary"])
    if failed:
        print(f"failed: {', '.join(failed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
