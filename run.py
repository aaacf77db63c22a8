"""Entry point: `python run.py [group=option ...] [key=value ...]`, or `-m` for a sweep (Hydra multirun).

A sweep runs every job even when some fail; its exit code is then the number of failed jobs (capped at 125), and
one stderr line names their run directories (harness.cli.sweep.SweepReport). A run or sweep stopped by SIGTERM,
SIGUSR1/2 or Ctrl-C checkpoints at a step boundary and exits 75 (harness/preemption.py): rerun it with
trainer.resume=auto.
"""

import shutil
import sys
import tempfile

import hydra
from omegaconf import DictConfig, OmegaConf

from harness.cli.checks import (
    check_command_line,
    check_group_options,
    check_output_dir,
    check_override_keys,
    check_threshold_strings,
    info_requested,
    plan_argv,
    plan_requested,
    share_run_stamp,
)
from harness.cli.sweep import sweep_exit_code
from harness.config import register_schemas
from harness.distributed import close as close_process_group
from harness.help import help_text
from harness.loop.job import JobFailed, run_job

register_schemas()
OmegaConf.register_new_resolver("harness_help", help_text)  # --help's lists (conf/config.yaml hydra.help)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | JobFailed | None:
    return run_job(cfg)


if __name__ == "__main__":  # the guard matters: vLLM may spawn processes that re-import this file
    check_group_options(sys.argv[1:])
    check_threshold_strings(sys.argv[1:])
    check_command_line(sys.argv[1:])
    check_override_keys(sys.argv[1:])
    scratch = tempfile.mkdtemp(prefix="harness-plan-") if plan_requested(sys.argv[1:]) else None
    if scratch:  # mode=plan: one `PLAN <json>` line per job, no model, no run directory
        sys.argv[1:] = plan_argv(sys.argv[1:], scratch)
    elif not info_requested(sys.argv[1:]):
        check_output_dir(sys.argv[1:])
    share_run_stamp()  # torchrun: every process must write the same run directory
    try:
        main()
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    close_process_group()  # torchrun: after the last job, not after each (a sweep's jobs share the group)
    sys.exit(sweep_exit_code())
