"""Config schemas for every Hydra group, validated before any model is loaded.

- `groups`: the config groups' schemas (model, precision, rollout, data, benchmark, logger);
- `run`: the trainer, evaluation and reward schemas, `RunConfig`, and `validate` (a pure function of the config);
- `compose`: Hydra plumbing (ConfigStore registration, the run-directory resolvers, the compose API).

The names most code needs are importable from `harness.config` itself.
"""

from harness.config.compose import CONF_DIR, STAMP_FORMAT, compose, register_schemas, run_stamp, safe_dirname
from harness.config.groups import (
    BenchmarkConfig,
    DataConfig,
    LoggerConfig,
    ModelConfig,
    PrecisionConfig,
    RolloutConfig,
    SetupError,
)
from harness.config.run import GROUPS, TOP_LEVEL, EvalConfig, RewardConfig, RunConfig, TrainerConfig, validate

__all__ = [
    "CONF_DIR",
    "GROUPS",
    "STAMP_FORMAT",
    "TOP_LEVEL",
    "BenchmarkConfig",
    "DataConfig",
    "EvalConfig",
    "LoggerConfig",
    "ModelConfig",
    "PrecisionConfig",
    "RewardConfig",
    "RolloutConfig",
    "RunConfig",
    "SetupError",
    "TrainerConfig",
    "compose",
    "register_schemas",
    "run_stamp",
    "safe_dirname",
    "validate",
]
