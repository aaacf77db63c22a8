#!/bin/bash
# Calibration v10 (CALIBRATION.md section 17): suite v4's setting with the trainer in bf16 autocast
# (precision=w4a4_rollout_bf16, the DPPO sanity test's BF16 training beside the same W4A4 rollout copy); PG-IS and
# DPPO-TV, and the no-mismatch reference as PG-IS with mu recomputed by the same bf16 trainer
# (rollout.behavior=trainer), seeds 600-605, two one-thread runs at a time. Usage: findings/calib/run_v10.sh [OUT]
# (default /tmp/calib_v10); then, from findings/calib, PYTHONPATH=../.. python go_v9.py OUT (section 16's rule, unchanged)
out=${1:-/tmp/calib_v10}
source "$(dirname "$0")/one.sh"
cd "$(dirname "$0")/../.."
mkdir -p "$out"
export -f one; export out
for seed in ${SEEDS:-600 601 602 603 604 605}; do
  for arm in "pgis objective=pg_is" "dppo objective=dppo" "ref objective=pg_is rollout.behavior=trainer"; do
    set -- $arm
    echo "${1}_lr1e-4_s$seed ${*:2} precision=w4a4_rollout_bf16 trainer.lr=1e-4 trainer.minibatches=4 seed=$seed"
  done
done | xargs -P 2 -L 1 bash -c 'one "$@"' _
