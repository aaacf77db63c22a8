"""The training loop and its services: `train` (orchestration), `step` (one RL step's phases), `state` (what a run
carries, built once), `checkpoint`, `evaluate`, `eval_only` (mode=eval), `distributed` (the process group),
`tokens` (tokens.parquet), `runlog` (metrics.jsonl, summary.json, W&B), `lock` (one writer per run directory)
and `resume_guard` (a resume continues the run's own config).

The libraries the loop calls sit beside this package: objectives, rollout, tasks, rewards, batch/logprobs,
precision, models, config."""
