#!/bin/bash
# Calibration v3 (CALIBRATION.md section 8): suite v2's setting, lr 2e-4 and 3e-4, seeds 200-202, two one-thread
# runs at a time, each as the suite runs it. Usage: findings/calib/run_v3.sh [OUT]  (default /tmp/calib_v3)
# LRS="1.5e-4" findings/calib/run_v3.sh runs section 8b's step with the same arms and seeds.
# cpu.txt gets "user_s sys_s wall_s" per run; findings/calib/summarize.py OUT prints the table.
out=${1:-/tmp/calib_v3}
cd "$(dirname "$0")/../.."
mkdir -p "$out"
one() {  # NAME OVERRIDES...
  name=$1; shift
  [ -f "$out/$name/summary.json" ] && return 0
  WANDB_MODE=offline OMP_NUM_THREADS=1 /usr/bin/time -f "%U %S %e" -o "$out/$name.cpu.txt" .venv/bin/python run.py \
    rollout=hf precision=w4a4_rollout logger=none rollout.threads=1 trainer.threads=1 trainer.checkpoint_every=0 \
    trainer.prompts_per_step=16 trainer.group_size=8 trainer.minibatches=8 trainer.max_new_tokens=24 \
    trainer.total_steps=80 trainer.eval_every=80 eval.n=2 \
    data.pool_path=findings/pools/tiny_pass_rates.json data.pool_min=0.2 data.pool_max=0.8 \
    "$@" hydra.run.dir="$out/$name" > "$out/$name.log" 2>&1
  echo "$(date +%T) $name done"
}
export -f one; export out
for arm in "pgis objective=pg_is" "dppo objective=dppo"; do
  for lr in ${LRS:-2e-4 3e-4}; do for seed in 200 201 202; do
    set -- $arm; echo "${1}_lr${lr}_s$seed ${*:2} trainer.lr=$lr seed=$seed"
  done; done
done | xargs -P 2 -L 1 bash -c 'one "$@"' _
