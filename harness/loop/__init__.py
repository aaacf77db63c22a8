"""The training loop and its services: `train` (orchestration), `step` (one RL step's phases), `state` (what a run
carries, built once), `checkpoint`, `evaluate`, `eval_only` (mode=eval), `distributed` (the process group),
`tokens` (tokens.parquet) and `runlog` (metrics.jsonl, summary.json, W&B).

The libraries the loop calls sit beside this package: objectives, rollout, tasks, rewards, batch/logprobs,
precision, models, config."""
