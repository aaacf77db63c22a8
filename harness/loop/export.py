"""Trained policies as Hugging Face model folders, for anyone to load: `from_pretrained`, vLLM, lighteval, and
this harness's own `mode=eval model.path=<folder>`.

    <run_dir>/policy/final/   the policy after the run's last step
    <run_dir>/policy/best/    the trained policy (step >= 1) with the best evaluation score so far

Each folder is what `save_pretrained` writes: config.json, generation_config.json, model.safetensors (sharded with
an index past 50 GB), the tokenizer files; plus policy.json, which says where the weights come from (step, score,
objective). A LoRA run's folder holds the merged model (W + alpha/r BA under the base model's names), loadable
without peft. Under FSDP2 the weights are gathered to rank 0 in CPU memory (an export is a full model by nature;
the resume checkpoints are not gathered). Written into a temp folder and renamed into place, like checkpoints.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from tqdm import tqdm
from transformers import AutoModelForCausalLM

from harness.errors import first_line
from harness.loop.model_path import model_dir
from harness.lora import engine_state_dict, is_lora
from harness.rundir.files import fsync_path

if TYPE_CHECKING:
    from harness.loop.state import Run

POLICY = "policy"
INFO = "policy.json"
_TMP_PREFIX = ".tmp-"


def save_policy_folder(
    folder: Path, weights: dict[str, torch.Tensor], policy: nn.Module, tokenizer: Any, info: dict[str, Any]
) -> Path:
    """Write `weights` (full, under the HF model's own names) as a model folder at `folder`, atomically: a reader
    sees the previous folder or the new one, never a mix (between the two renames, for an instant, neither: POSIX
    cannot swap two non-empty folders in one step). `policy` gives the config and generation config.

    The weights are saved through a skeleton of the model on the meta device (no memory), so `save_pretrained` does
    what it does for any model (tied weights stored once, transformers' in-memory names mapped back to the
    checkpoint format, shards and index) whatever wraps the live policy (FSDP2, LoRA layers, fp8 linears).
    A failed write removes the temp folder and raises OSError naming the folder."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    for stale in folder.parent.glob(f"{_TMP_PREFIX}{folder.name}-*"):  # a crash mid-export
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f"{_TMP_PREFIX}{folder.name}-"))
    try:
        config = copy.deepcopy(policy.config)
        dtype = next(iter(weights.values())).dtype
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config, dtype=dtype)
        skeleton.generation_config = copy.deepcopy(policy.generation_config)
        skeleton.save_pretrained(tmp, state_dict=_tie(weights, skeleton))
        tokenizer.save_pretrained(tmp)
        (tmp / INFO).write_text(json.dumps(info, indent=2) + "\n")
        for f in tmp.iterdir():
            fsync_path(f)
    except Exception as e:  # OSError (disk full), safetensors' or transformers' own errors: all mean "not saved"
        shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(f"policy folder {folder} could not be written: {first_line(e)}") from e
    old = folder.parent / f"{_TMP_PREFIX}{folder.name}-replaced"
    if folder.exists():
        shutil.rmtree(old, ignore_errors=True)
        folder.rename(old)
    os.replace(tmp, folder)
    fsync_path(folder.parent)
    shutil.rmtree(old, ignore_errors=True)
    return folder


def _tie(weights: dict[str, torch.Tensor], skeleton: nn.Module) -> dict[str, torch.Tensor]:
    """Tied parameters (a head tied to the embeddings) as one tensor under each name: a state dict gathered from
    FSDP2 holds separate copies, which save_pretrained would store twice; it stores a shared tensor once."""
    first: dict[int, str] = {}
    out = dict(weights)
    for name, p in skeleton.named_parameters(remove_duplicate=False):
        kept = first.setdefault(id(p), name)
        if kept != name and kept in out and name in out:
            out[name] = out[kept]
    return out


def read_info(folder: Path) -> dict[str, Any] | None:
    """A policy folder's policy.json, or None if there is no readable one."""
    try:
        return json.loads((folder / INFO).read_text())
    except (OSError, ValueError):
        return None


# --- a run's policy folders ---


def export_policy(run: Run, name: str, step: int, score: float | None) -> Path:
    """policy/<name>: the current weights as a Hugging Face model folder (harness.loop.export), LoRA merged in. A
    collective under FSDP2 (the full weights are gathered to rank 0, which writes); OSError if the write failed."""
    folder = run.run_dir / POLICY / name
    state = run.ranks.full_state_dict(run.policy)
    try:
        if run.ranks.main:
            info = dict(
                step=step,
                score_key=run.score_key,
                score=score,
                objective=run.cfg.objective.name,
                benchmark=run.cfg.benchmark.name,
                base_model=str(model_dir(run.cfg)),
                lora_merged=is_lora(run.policy),
            )
            save_policy_folder(folder, engine_state_dict(run.policy, state), run.policy, run.tokenizer, info)
    finally:
        run.ranks.barrier()
    return folder


def export_or_warn(run: Run, name: str, step: int, score: float | None) -> Path | None:
    """`export_policy`; a failed write (disk full) is one warning line, training goes on and the summary lists it
    under `policy_failed` (resuming a finished run writes policy/final again)."""
    try:
        return export_policy(run, name, step, score)
    except OSError as exc:
        run.failed_exports.append(f"{name}@{step}")
        tqdm.write(f"warning: {exc}; the run goes on without it", sys.stderr)
        return None
