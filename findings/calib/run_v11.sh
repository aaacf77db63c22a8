#!/bin/bash
# Calibration v11 (CALIBRATION.md section 18): suite v4's setting on the tiny model with 7,000 unused tokens
# appended to its vocabulary (model.unused_tokens=7000, an untouched tail) and that model's sanity pool; PG-IS and
# DPPO-TV with the W4A4 rollout copy, and suite v4's no-mismatch reference (PG-IS, the fp32 copy), seeds 710-715,
# two one-thread runs at a time. Usage: findings/calib/run_v11.sh [OUT] (default /tmp/calib_v11); then, from
# findings/calib, PYTHONPATH=../.. python go_v9.py OUT (section 16's rule, unchanged)
out=${1:-/tmp/calib_v11}
source "$(dirname "$0")/one.sh"
cd "$(dirname "$0")/../.."
mkdir -p "$out"
export -f one; export out
for seed in ${SEEDS:-710 711 712 713 714 715}; do
  for arm in "pgis objective=pg_is" "dppo objective=dppo" "ref objective=pg_is precision=fp32"; do
    set -- $arm
    echo "${1}_lr1e-4_s$seed model.unused_tokens=7000 data.pool_path=findings/pools/tiny_tail7000_pass_rates.json ${*:2} trainer.lr=1e-4 trainer.minibatches=4 seed=$seed"
  done
done | xargs -P 2 -L 1 bash -c 'one "$@"' _
