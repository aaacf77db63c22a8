#!/bin/bash
# Calibration v3 (CALIBRATION.md section 8): suite v2's setting, lr 2e-4 and 3e-4, seeds 200-202, two one-thread
# runs at a time, each as the suite runs it. Usage: findings/calib/run_v3.sh [OUT]  (default /tmp/calib_v3)
# LRS="1.5e-4" findings/calib/run_v3.sh runs section 8b's step with the same arms and seeds.
# cpu.txt gets "user_s sys_s wall_s" per run; findings/calib/summarize.py OUT prints the table.
out=${1:-/tmp/calib_v3}
source "$(dirname "$0")/one.sh"
cd "$(dirname "$0")/../.."
mkdir -p "$out"
export -f one; export out
for arm in "pgis objective=pg_is" "dppo objective=dppo"; do
  for lr in ${LRS:-2e-4 3e-4}; do for seed in 200 201 202; do
    set -- $arm; echo "${1}_lr${lr}_s$seed ${*:2} trainer.lr=$lr seed=$seed"
  done; done
done | xargs -P 2 -L 1 bash -c 'one "$@"' _
