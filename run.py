"""Entry point: `python run.py [group=option ...] [key=value ...]`, or `-m` for a sweep (Hydra multirun)."""

import sys

import hydra
from omegaconf import DictConfig

from harness.cli import check_group_options, run_job
from harness.config import register_schemas

register_schemas()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    return run_job(cfg)


if __name__ == "__main__":  # the guard matters: vLLM may spawn processes that re-import this file
    check_group_options(sys.argv[1:])
    main()
