#!/usr/bin/env bash
# Our trust-region objectives as verl policy losses, against verl's own DPPO, on one node (8 GPUs), in the shape of
# the DRPO 4B recipe: 64 prompts x 8 samples, 4 updates per rollout, lr 1e-6, 8192-token responses, Dr.GRPO
# advantages, no KL, seq-mean-token-sum-norm (docs/objectives.md §4.2).
#
#   LOSS_MODE=tr_dppo bash examples/verl/run_qwen3-1.7b_trust_region.sh   # ours: DPPO-Binary-TV, delta 0.15
#   LOSS_MODE=tr_drpo bash examples/verl/run_qwen3-1.7b_trust_region.sh   # ours: DRPO, delta 0.15
#   LOSS_MODE=dppo_tv bash examples/verl/run_qwen3-1.7b_trust_region.sh   # verl's own DPPO-Binary-TV, same values
#
# Extra Hydra overrides go after the script's name. PRINT_OVERRIDES=1 prints the overrides and exits (the test
# composes verl's config from them and runs its validate_config).
set -euo pipefail

LOSS_MODE=${LOSS_MODE:-tr_dppo}
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen3-1.7B-Base}
TRAIN_FILES=${TRAIN_FILES:-$HOME/data/dapo-math/train.parquet}
VAL_FILES=${VAL_FILES:-$HOME/data/aime/test.parquet}
NGPUS=${NGPUS:-8}
RESPONSE_LENGTH=${RESPONSE_LENGTH:-8192}

case "$LOSS_MODE" in
  # DPPO's delta on both sides; clip_ratio_c is its importance-weight cap, lifted (verl's default 3 truncates).
  tr_dppo | dppo_tv) bounds=(actor_rollout_ref.actor.clip_ratio_low=0.15 actor_rollout_ref.actor.clip_ratio_high=0.15
                             actor_rollout_ref.actor.clip_ratio_c=10000) ;;
  # DRPO has one radius, clip_ratio; clip_ratio_low/high stay at verl's defaults (a changed one is refused).
  tr_drpo) bounds=(actor_rollout_ref.actor.clip_ratio=0.15) ;;
  *) echo "LOSS_MODE: tr_dppo, tr_drpo or dppo_tv, got '$LOSS_MODE'" >&2; exit 2 ;;
esac

overrides=(
  algorithm.adv_estimator=grpo
  algorithm.norm_adv_by_std_in_grpo=false
  algorithm.use_kl_in_reward=false
  # mu is the rollout engine's log-probs: bypass mode, for ours and for verl's dppo_tv alike
  algorithm.rollout_correction.bypass_mode=true
  data.train_files="$TRAIN_FILES"
  data.val_files="$VAL_FILES"
  data.train_batch_size=64
  data.max_prompt_length=1024
  data.max_response_length="$RESPONSE_LENGTH"
  data.filter_overlong_prompts=true
  actor_rollout_ref.model.path="$MODEL_PATH"
  actor_rollout_ref.actor.policy_loss.loss_mode="$LOSS_MODE"
  "${bounds[@]}"
  actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm
  actor_rollout_ref.actor.loss_scale_factor="$RESPONSE_LENGTH"
  actor_rollout_ref.actor.entropy_coeff=0
  actor_rollout_ref.actor.use_kl_loss=false
  actor_rollout_ref.actor.optim.lr=1e-6
  actor_rollout_ref.actor.ppo_mini_batch_size=16
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2
  actor_rollout_ref.rollout.name=vllm
  actor_rollout_ref.rollout.n=8
  actor_rollout_ref.rollout.temperature=1.0
  actor_rollout_ref.rollout.calculate_log_probs=true
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4
  actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6
  trainer.logger='[console,file]'
  trainer.project_name=trust_region
  trainer.experiment_name="qwen3-1.7b-$LOSS_MODE"
  trainer.n_gpus_per_node="$NGPUS"
  trainer.nnodes=1
  trainer.test_freq=10
  trainer.save_freq=50
  trainer.total_epochs=1
)

if [[ "${PRINT_OVERRIDES:-0}" == 1 ]]; then
  printf '%s\n' "${overrides[@]}" "$@"
  exit 0
fi
set -x
python3 -m verl.trainer.main_ppo "${overrides[@]}" "$@"
