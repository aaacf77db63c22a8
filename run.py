"""Entry point: `python run.py [group=option ...] [key=value ...]`, or `-m` for a sweep (Hydra multirun).

A sweep runs every job even when some fail; its exit code is then the number of failed jobs (capped at 125), and
one stderr line names their run directories (harness.cli.SweepReport).
"""

import sys

import hydra
from omegaconf import DictConfig

from harness.cli import JobFailed, check_group_options, check_output_dir, run_job, share_run_stamp, sweep_exit_code
from harness.config import register_schemas
from harness.loop.distributed import close as close_process_group

register_schemas()

# Wired here rather than in a launcher config so that every launcher gets it, plugins' own configs included, and a
# sweep declared in a config file (hydra.mode: MULTIRUN) as well as one started with -m.
SWEEP_REPORT = "++hydra.callbacks.sweep_report._target_=harness.cli.SweepReport"


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | JobFailed | None:
    return run_job(cfg)


if __name__ == "__main__":  # the guard matters: vLLM may spawn processes that re-import this file
    check_group_options(sys.argv[1:])
    check_output_dir(sys.argv[1:])
    share_run_stamp()  # torchrun: every process must write the same run directory
    sys.argv.append(SWEEP_REPORT)
    main()
    close_process_group()  # torchrun: after the last job, not after each (a sweep's jobs share the group)
    sys.exit(sweep_exit_code())
