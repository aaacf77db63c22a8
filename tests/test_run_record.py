"""Which keys two run records may differ in (harness.rundir.record): the fields marked `"free": True` in the config
schemas, and nothing else."""

from __future__ import annotations

import pytest

from harness.config.compose import compose
from harness.config.run import validate
from harness.rundir.record import FREE, _flat, differences


@pytest.fixture(scope="module")
def record() -> dict:
    return compose()


def test_every_free_key_is_a_key_of_the_config(record):
    flat = _flat(record)
    for key in FREE:
        assert key in record or key in flat, key


@pytest.mark.parametrize("key", ["trainer.threads", "rollout.threads", "trainer.eval_every", "name", "logger.name"])
def test_a_run_that_differs_only_in_a_free_key_is_the_same_run(record, key):
    changed = compose(f"{key}={'none' if key == 'logger.name' else 'other' if key == 'name' else 3}")
    validate(changed)
    assert differences(record, changed) == {}


@pytest.mark.parametrize(("key", "value"), [("trainer.lr", 0.5), ("seed", 9), ("rollout.temperature", 0.5)])
def test_a_key_that_changes_the_result_is_a_difference(record, key, value):
    changed = compose(f"{key}={value}")
    assert list(differences(record, changed)) == [key]
