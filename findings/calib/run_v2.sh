#!/bin/bash
# Calibration v2 (CALIBRATION.md section 7): the sanity pool, lr 5e-5 and 1e-4, seeds 100-101, two one-thread
# runs at a time, each as the suite runs it. Usage: findings/calib/run_v2.sh [OUT]  (default /tmp/calib_v2)
# cpu.txt gets "user_s sys_s wall_s" per run; findings/calib/summarize.py OUT prints the table.
out=${1:-/tmp/calib_v2}
source "$(dirname "$0")/one.sh"
cd "$(dirname "$0")/../.."
mkdir -p "$out"
export -f one; export out
for arm in "ref objective=pg_is precision=fp32" "pgis objective=pg_is" "dppo objective=dppo"; do
  for lr in 5e-5 1e-4; do for seed in 100 101; do
    set -- $arm; echo "${1}_lr${lr}_s$seed ${*:2} trainer.lr=$lr seed=$seed"
  done; done
done | xargs -P 2 -L 1 bash -c 'one "$@"' _
