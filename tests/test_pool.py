"""data.pool_path: the sanity-style pool (harness.tasks.pool) filters the arith train split by measured pass rate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.config import compose, validate
from harness.tasks import load_problems, load_training_set
from harness.tasks.pool import filter_pool, load_pass_rates


def write_rates(tmp_path, rates: dict[str, float]):
    path = tmp_path / "rates.json"
    path.write_text(json.dumps({"model": "m", "samples": 4, "pass_rate": rates}))
    return path


def test_pool_keeps_problems_in_range(tmp_path) -> None:
    full = load_training_set(validate(compose("logger=none")).data)
    rates = {p.id: [0.0, 0.25, 0.5, 1.0][i % 4] for i, p in enumerate(full)}
    path = write_rates(tmp_path, rates)
    cfg = validate(compose("logger=none", f"data.pool_path={path}", "data.pool_min=0.2", "data.pool_max=0.8"))
    train, held_out = load_problems(cfg.data, cfg.benchmark)
    assert {p.id for p in train} == {pid for pid, r in rates.items() if 0.2 <= r <= 0.8}
    assert len(train) == len(full) // 2
    assert len(held_out) == 600  # the benchmark is never filtered


def test_pool_errors(tmp_path) -> None:
    with pytest.raises(ValueError, match="not a readable pass-rate file"):
        load_pass_rates(tmp_path / "missing.json")
    full = load_training_set(validate(compose("logger=none")).data)[:10]
    with pytest.raises(ValueError, match="no training problem"):
        filter_pool(full, {p.id: 0.0 for p in full}, 0.2, 0.8)
    with pytest.raises(ValueError, match="pool_min <= pool_max"):
        filter_pool(full, {}, 0.9, 0.1)


def test_the_findings_pool_belongs_to_the_suites_model_and_split() -> None:
    """findings/pools/tiny_pass_rates.json was measured on one tiny model and one arith split; the suite trains on
    it (findings/suite.yaml). A change to the tiny model's config or to the split would leave a pool measured on
    another model, or one whose ids no longer match, so the file's model name and ids are checked here."""
    import yaml

    from analysis.suite import DEFAULT_SUITE
    from harness.loop.model_path import tiny_spec
    from harness.models import tiny_model_dir

    base = yaml.safe_load(DEFAULT_SUITE.read_text())["base"]
    cfg = validate(compose(*base))
    rates_file = json.loads(Path(cfg.data.pool_path).read_text())
    assert rates_file["model"] == tiny_model_dir(*tiny_spec(cfg)).name
    assert rates_file["samples"] == 8 and rates_file["max_new_tokens"] == cfg.trainer.max_new_tokens
    full = load_training_set(validate(compose("logger=none")).data)
    assert set(rates_file["pass_rate"]) == {p.id for p in full}  # every training problem, nothing else
    train, held_out = load_problems(cfg.data, cfg.benchmark)
    assert (cfg.data.pool_min, cfg.data.pool_max) == (0.2, 0.8)
    assert len(train) == 1081  # solved 2-6 times of 8 (CALIBRATION.md section 7)
    assert not {p.id for p in train} & {p.id for p in held_out}
