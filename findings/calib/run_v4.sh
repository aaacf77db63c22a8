#!/bin/bash
# Calibration v4 (CALIBRATION.md section 10): suite v3's setting with 4 mini-batch updates per rollout, lr 1e-4 and
# 1.5e-4, the no-mismatch reference and PG-IS, seeds 200-202, two one-thread runs at a time.
# Usage: findings/calib/run_v4.sh [OUT]  (default /tmp/calib_v4); then findings/calib/summarize.py OUT and
# findings/calib/failed.py OUT. Section 10b: SEEDS="203 204 ... 212" LRS=1e-4 findings/calib/run_v4.sh.
out=${1:-/tmp/calib_v4}
source "$(dirname "$0")/one.sh"
cd "$(dirname "$0")/../.."
mkdir -p "$out"
export -f one; export out
for lr in ${LRS:-1e-4 1.5e-4}; do
  for seed in ${SEEDS:-200 201 202}; do for arm in "ref objective=pg_is precision=fp32" "pgis objective=pg_is"; do
    set -- $arm; echo "${1}_lr${lr}_s$seed ${*:2} trainer.lr=$lr trainer.minibatches=4 seed=$seed"
  done; done
done | xargs -P 2 -L 1 bash -c 'one "$@"' _
