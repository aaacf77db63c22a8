#!/bin/bash
# Calibration v12 (CALIBRATION.md section 19): suite v4's setting on a 3.6x larger tiny model (width 512,
# 9.4M parameters: model.hidden_size=512 num_heads=8 num_kv_heads=2 intermediate_size=1024) and its sanity pool; PG-IS and
# DPPO-TV with the W4A4 rollout copy, and suite v4's no-mismatch reference (PG-IS, the fp32 copy), seeds 720-725,
# two one-thread runs at a time. Usage: findings/calib/run_v12.sh [OUT] (default /tmp/calib_v12); then, from
# findings/calib, PYTHONPATH=../.. python go_v9.py OUT (section 16's rule, unchanged)
out=${1:-/tmp/calib_v12}
source "$(dirname "$0")/one.sh"
cd "$(dirname "$0")/../.."
mkdir -p "$out"
export -f one; export out
for seed in ${SEEDS:-720 721 722 723 724 725}; do
  for arm in "pgis objective=pg_is" "dppo objective=dppo" "ref objective=pg_is precision=fp32"; do
    set -- $arm
    echo "${1}_lr1e-4_s$seed model.hidden_size=512 model.num_heads=8 model.num_kv_heads=2 model.intermediate_size=1024 data.pool_path=findings/pools/tiny_w512_pass_rates.json ${*:2} trainer.lr=1e-4 trainer.minibatches=4 seed=$seed"
  done
done | xargs -P 2 -L 1 bash -c 'one "$@"' _
