"""Eval-only runs: `python run.py mode=eval model.path=<...> benchmark=aime24 eval.n=32`.

`model.path` may be:
- null: the tiny model built from the model config (what `model=tiny` trains);
- a run directory (it holds `.hydra/config.yaml` and `checkpoints/`): the model that run trained, i.e. the base
  model of its config with the weights of its latest checkpoint; or a `checkpoints/step_<k>` folder of a run,
  for that step. The run's own `model.max_model_len` and `data.template` apply: the prompt format is part of
  the trained policy;
- any Hugging Face checkpoint folder or hub id, such as a run's exported `policy/final` or `policy/best`
  (harness.loop.export).

The run directory written has the training run's files: eval.jsonl (one record, at `step` = the checkpoint's
training step, or the step in an exported policy folder's policy.json, 0 for a base model), samples.jsonl and
summary.json. The sampling seed is `seed * 1_000_003 + step`, as in training, so evaluating checkpoint k (or
policy/final after k steps) with the training run's seed and eval settings reproduces that run's evaluation at
step k.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from safetensors import safe_open

from harness.config import ModelConfig, RunConfig, SetupError, validate
from harness.errors import first_line
from harness.loop import sharded
from harness.loop.checkpoint import CHECKPOINTS, checkpoint_step, load_order
from harness.loop.evaluate import eval_settings, evaluate
from harness.loop.export import read_info
from harness.loop.model_path import model_dir
from harness.loop.runlog import RunLog, finishing
from harness.loop.state import score_key
from harness.loop.wandb_run import wandb_settings
from harness.lora import merged_from_checkpoint
from harness.models import load_tokenizer_of
from harness.reward_model import RewardModel, evaluate_rm
from harness.rollout import engine_from_config
from harness.tasks import load_benchmark, render_prompts


@dataclass(frozen=True)
class ModelSource:
    """What an eval-only run evaluates."""

    base: str
    """Model folder or hub id the engine and tokenizer load."""
    weights: Path | None
    """A checkpoint's model.safetensors (or a sharded checkpoint's folder) to load on top of `base`, or None."""
    step: int
    """Training step of the weights (0 for a base model)."""
    model: ModelConfig
    """The model config that applies (the training run's, for a run directory)."""
    template: str
    tiny: bool
    """The tiny local model (its short context is why eval.truncate_prompts defaults on for it)."""


def resolve_model(cfg: RunConfig) -> ModelSource:
    """Where the weights come from, for `cfg.model.path` (module docstring)."""
    source = cfg.model.path
    if source is None:
        return ModelSource(str(model_dir(cfg)), None, 0, cfg.model, cfg.data.template, tiny=True)
    path = Path(source).expanduser()
    ckpt = None
    if checkpoint_step(path) is not None and path.parent.name == CHECKPOINTS and path.is_dir():
        ckpt, path = path, path.parent.parent
    if (path / ".hydra" / "config.yaml").is_file():
        return _from_run(path, ckpt)
    if not path.exists() and source.startswith(("/", ".", "~")):
        raise FileNotFoundError(
            f"model.path: {source!r} does not exist (expected a run directory, a model folder or a hub id)"
        )
    if path.is_dir() and not (path / "config.json").is_file():
        raise ValueError(
            f"model.path: {source!r} is neither a run directory (no .hydra/config.yaml) nor a model folder "
            "(no config.json)"
        )
    step = int((read_info(path) or {}).get("step", 0)) if path.is_dir() else 0  # a run's exported policy folder
    return ModelSource(str(path) if path.exists() else source, None, step, cfg.model, cfg.data.template, tiny=False)


def _from_run(run: Path, ckpt: Path | None) -> ModelSource:
    raw = OmegaConf.to_container(OmegaConf.load(run / ".hydra" / "config.yaml"), resolve=True)
    try:
        trained = validate(raw)  # type: ignore[arg-type]
    except ValueError as e:
        raise ValueError(f"model.path: the config of run {run} does not validate: {e}") from None
    if ckpt is None:
        ckpt = _latest_checkpoint(run)
    weights = ckpt if sharded.is_sharded(ckpt) else ckpt / "model.safetensors"  # a multi-process run's: its shards
    if not weights.exists():
        raise FileNotFoundError(f"model.path: checkpoint {ckpt} has no model.safetensors (nor sharded .metadata)")
    step = checkpoint_step(ckpt)
    assert step is not None  # a step_<k> folder: the one model.path names, or load_order's pick
    return ModelSource(
        str(model_dir(trained)),
        weights,
        step,
        trained.model,
        trained.data.template,
        tiny=trained.model.path is None,
    )


def _latest_checkpoint(run: Path) -> Path:
    """The checkpoint a resume would load: the one `latest` names, else the newest complete step_<k>."""
    order = load_order(run / CHECKPOINTS)
    if not order:
        raise FileNotFoundError(f"model.path: run directory {run} has no checkpoint under checkpoints/")
    return order[0]


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's model.safetensors as a full state dict: `save_checkpoint` stores tied tensors once and
    lists the dropped names in the file's metadata (dropped name -> kept name). A folder: a sharded checkpoint's
    model tensors, put together in this process."""
    if path.is_dir():
        return sharded.read_model(path)
    with safe_open(str(path), framework="pt", device="cpu") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        aliases = dict(f.metadata() or {})
    for alias, kept in aliases.items():
        if kept in tensors:
            tensors.setdefault(alias, tensors[kept])
    return tensors


def evaluate_model(cfg: RunConfig, run_dir: Path, raw_config: dict[str, Any]) -> dict[str, Any]:
    """Evaluate the model `cfg.model.path` names on `cfg.benchmark`, writing eval.jsonl, samples.jsonl and
    summary.json into `run_dir`. Returns the summary."""
    t_start = time.time()
    torch.set_num_threads(cfg.trainer.threads or os.cpu_count() or 1)
    # First, before W&B starts (its banner would precede the line) and before any weights: a benchmark out of reach,
    # a model path that is not a model, a hub id out of reach are one line naming it, as in training; run.py's
    # handler records it in summary.json.
    try:
        problems = load_benchmark(cfg.benchmark, cfg.data)
        src = resolve_model(cfg)
        tokenizer = load_tokenizer_of(src.base)
    except (ValueError, OSError, ImportError) as exc:
        raise SetupError(first_line(exc)) from exc
    log = RunLog(run_dir, wandb_settings(cfg), config=raw_config, resume=False)  # job type "eval", name eval-<bench>
    summary: dict[str, Any] = {"run_dir": str(run_dir), "mode": "eval", "benchmark": cfg.benchmark.name}
    summary.update(model=src.base, checkpoint=None if src.weights is None else str(src.weights), step=src.step)
    engine = None
    with finishing(log, summary, t_start):
        try:
            # --- model: base weights for the engine, then the checkpoint's on top ---
            # An unusable checkpoint, an engine that cannot load the model: one line (SetupError), as in training.
            try:
                prompts = render_prompts(tokenizer, problems, src.template)
                engine = engine_from_config(
                    cfg.rollout, src.base, cfg.precision.name, cfg.seed, src.model.max_model_len, cfg.device
                )
                if src.weights is not None:
                    weights = read_weights(src.weights)
                    if src.model.lora_rank:  # a LoRA run's checkpoint holds its adapters: merge them into the base
                        weights = merged_from_checkpoint(src.base, weights, src.model)
                    engine.sync_weights(weights)
            except (ValueError, OSError, ImportError) as exc:
                raise SetupError(first_line(exc)) from exc

            # --- evaluate and log ---
            common = eval_settings(cfg, src.step, tiny_model=src.tiny)
            if cfg.reward.kind == "reward_model":  # RLHF: the reward model's mean score
                scorer = RewardModel.from_config(cfg.reward, tokenizer, cfg.device)
                record, samples = evaluate_rm(engine, prompts, problems, scorer, common)
            else:
                record, samples = evaluate(engine, prompts, problems, common, grading=cfg.reward.grade_kwargs())
            log.log_eval(src.step, {"benchmark": cfg.benchmark.name, "template": src.template, **record})
            log.log_samples(src.step, samples)
            key = score_key(cfg)
            summary.update(
                status="completed",
                score_key=key,
                final_score=record[key],
                scores={k: v for k, v in record.items() if isinstance(v, float) and ("@" in k or k == key)},
                template=src.template,
                n_problems=len(problems),
            )
        finally:
            if engine is not None:
                engine.close()
    return summary


def print_eval_summary(s: dict[str, Any]) -> None:
    scores = "  ".join(
        f"{k} {v:.3f}" if k == "rm_score" else f"{k} {100 * v:.1f}%" for k, v in s.get("scores", {}).items()
    )
    lines = [
        "",
        f"evaluation finished: {s.get('status')}  ({s.get('wall_time_s', 0):.0f} s)",
        f"  model          {s.get('model')}" + (f"  + {s['checkpoint']}" if s.get("checkpoint") else ""),
        f"  {s.get('benchmark')} ({s.get('n_problems')} problems)   {scores}",
        f"  run directory  {s.get('run_dir')}",
        "",
    ]
    print("\n".join(lines))
