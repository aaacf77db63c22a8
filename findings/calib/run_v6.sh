#!/bin/bash
# Calibration v6 (CALIBRATION.md section 12): suite v4's setting on the `chain` task (a+b+c+d, every running sum
# shown: 21-token responses), its own warm start (model.sft_steps=120) and sanity pool; PG-IS and DPPO-TV with the
# W4A4 rollout copy and the fp32 no-mismatch reference, seeds 200-203, two one-thread runs at a time.
# Usage: findings/calib/run_v6.sh [OUT]  (default /tmp/calib_v6); then PYTHONPATH=. python findings/calib/go_v6.py OUT
# Section 13 (calibration v7) is the same runs at other learning rates: LRS="5e-5 2.5e-5" run_v6.sh /tmp/calib_v7
out=${1:-/tmp/calib_v6}
source "$(dirname "$0")/one.sh"
cd "$(dirname "$0")/../.."
mkdir -p "$out"
export -f one; export out
chain="data.kinds=[chain] model.sft_steps=120 trainer.max_new_tokens=32 data.pool_path=findings/pools/tiny_chain_pass_rates.json"
for lr in ${LRS:-1e-4}; do for seed in ${SEEDS:-200 201 202 203}; do
  for arm in "pgis objective=pg_is" "dppo objective=dppo" "ref objective=pg_is precision=fp32"; do
    set -- $arm; echo "${1}_lr${lr}_s$seed ${*:2} $chain trainer.lr=$lr trainer.minibatches=4 seed=$seed"
  done
done; done | xargs -P 2 -L 1 bash -c 'one "$@"' _
