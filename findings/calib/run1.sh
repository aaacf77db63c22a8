#!/bin/bash
# usage: run1.sh NAME [overrides...]  -- one calibration run, one thread, into /tmp/calib_runs/NAME
# cpu.txt gets "user_s sys_s wall_s" (CPU seconds do not depend on how busy the shared machine is).
name=$1; shift
cd "$(dirname "$0")/../.."
WANDB_MODE=offline OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH=/work/wt-calib /usr/bin/time -f "%U %S %e" \
  -o /tmp/calib_runs/$name.cpu.txt /work/main/.venv/bin/python run.py \
  rollout=hf logger=none trainer.threads=1 rollout.threads=1 trainer.checkpoint_every=0 \
  trainer.prompts_per_step=16 trainer.group_size=8 trainer.minibatches=8 \
  trainer.total_steps=80 trainer.eval_every=40 eval.n=2 \
  hydra.run.dir=/tmp/calib_runs/$name "$@" > /tmp/calib_runs/$name.log 2>&1
