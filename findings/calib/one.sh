# Sourced by run_v2.sh and run_v3.sh: one calibration run as the suite runs it (suite v2's base setting, one
# thread), skipped when its summary.json exists. Expects $out; NAME OVERRIDES... (the overrides come last and win).
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
