#!/bin/bash
# Calibration v9 (CALIBRATION.md section 16): suite v4's setting on the 64-problem sanity pool for 160 steps
# (held-out every 80); PG-IS and DPPO-TV with the W4A4 rollout copy and the fp32 no-mismatch reference, seeds
# 500-505, two one-thread runs at a time. Usage: findings/calib/run_v9.sh [OUT]  (default /tmp/calib_v9); then
# PYTHONPATH=. python findings/calib/go_v9.py OUT
out=${1:-/tmp/calib_v9}
source "$(dirname "$0")/one.sh"
cd "$(dirname "$0")/../.."
mkdir -p "$out"
export -f one; export out
for seed in ${SEEDS:-500 501 502 503 504 505}; do
  for arm in "pgis objective=pg_is" "dppo objective=dppo" "ref objective=pg_is precision=fp32"; do
    set -- $arm
    echo "${1}_lr1e-4_s$seed ${*:2} trainer.lr=1e-4 trainer.minibatches=4 trainer.total_steps=160 trainer.eval_every=80 data.pool_path=findings/pools/tiny_sanity64.json seed=$seed"
  done
done | xargs -P 2 -L 1 bash -c 'one "$@"' _
