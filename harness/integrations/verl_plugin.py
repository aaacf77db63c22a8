"""This package's `verl.plugins` entry point: `import verl` imports it in every process (driver and Ray workers).

It imports harness.integrations.verl, which registers our losses. verl's plugin loader logs a plugin's failure at
debug level only and carries on, so a job asking for `tr_dppo` would otherwise stop much later, in a Ray worker, with
"Unsupported loss mode". When the import fails this module logs the error in one line and wraps verl's
validate_config (main_ppo calls it before Ray starts) so that a job whose loss_mode is a `tr_` name stops there,
naming the real error.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)
PREFIX = "tr_"  # harness.integrations.verl.PREFIX, not imported from there: that import is what may have failed
LOSS = "actor_rollout_ref.actor.policy_loss.loss_mode"

FAILURE: str | None = None  # the import error, in one line, or None when our losses are registered


def _one_line(error: BaseException) -> str:
    return " ".join(f"{type(error).__name__}: {error}".split())


def _guard(failure: str) -> None:
    """Make verl's validate_config refuse a `tr_` loss_mode with `failure` in one line."""
    from verl.utils import config as verl_config

    validate = verl_config.validate_config

    def validate_config(config: Any, *args: Any, **kwargs: Any) -> None:
        loss_mode = str(config.actor_rollout_ref.actor.policy_loss.get("loss_mode"))
        if loss_mode.startswith(PREFIX):
            raise ImportError(
                f"{LOSS}={loss_mode}: trust-region-harness could not register its verl losses ({failure}); "
                "`python -c 'import harness.integrations.verl'` shows the traceback"
            )
        validate(config, *args, **kwargs)

    verl_config.validate_config = validate_config


try:
    from harness.integrations import verl as _adapter  # noqa: F401  (registers the losses)
except Exception as e:  # any error: verl's loader would swallow it
    FAILURE = _one_line(e)
    log.error("trust-region-harness: our verl losses (tr_*) are not registered: %s", FAILURE)
    try:
        _guard(FAILURE)
    except Exception as guard_error:  # verl without the config module: the line above is all we can do
        log.error("trust-region-harness: cannot guard verl's validate_config: %s", _one_line(guard_error))
