#!/bin/bash
# Calibration v5 (CALIBRATION.md section 11): suite v4's setting (4 updates per rollout, lr 1e-4) with the fp32
# rollout copy and Gaussian logit noise sigma 1.0 as the only mismatch; PG-IS and DPPO-TV, seeds 200-207, two
# one-thread runs at a time. Usage: findings/calib/run_v5.sh [OUT]  (default /tmp/calib_v5); then
# findings/calib/summarize.py OUT and findings/calib/failed.py OUT.
out=${1:-/tmp/calib_v5}
source "$(dirname "$0")/one.sh"
cd "$(dirname "$0")/../.."
mkdir -p "$out"
export -f one; export out
for seed in ${SEEDS:-200 201 202 203 204 205 206 207}; do for arm in "pgis objective=pg_is" "dppo objective=dppo"; do
  set -- $arm; echo "${1}_lr1e-4_s$seed ${*:2} precision=fp32 rollout.logit_noise=1.0 trainer.lr=1e-4 trainer.minibatches=4 seed=$seed"
done; done | xargs -P 2 -L 1 bash -c 'one "$@"' _
