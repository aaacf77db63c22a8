"""What `run.py` does around Hydra: one-line errors for bad options, run-directory bookkeeping, the summary."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
GROUP_NAMES = ("model", "precision", "objective", "rollout", "data", "benchmark", "logger")


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def check_group_options(argv: list[str]) -> None:
    """`objective=dpo` -> one line naming the valid options, before Hydra composes anything."""
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if not sep or key not in GROUP_NAMES:
            continue
        options = sorted(p.stem for p in (CONF_DIR / key).glob("*.yaml"))
        for option in value.split(","):  # a multirun sweep lists several
            if option not in options:
                fail(f"{key}={option} is not an option; valid {key} options: {', '.join(options)}")


def run_job(cfg: DictConfig) -> float | None:
    """Validate (before any model is built), train or evaluate, print the summary. Returns the final score."""
    from hydra.core.hydra_config import HydraConfig

    from harness.config import validate
    from harness.runlog import atomic_write_json

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    raw: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    try:
        run_cfg = validate(raw)
    except ValueError as exc:
        # The run directory exists already (Hydra made it): mark it failed so analysis never reads it as a run.
        atomic_write_json(run_dir / "summary.json", {"status": "failed", "error": str(exc)})
        fail(str(exc))
    from harness.config import SetupError

    try:
        if run_cfg.mode == "eval":
            from harness.eval_only import print_eval_summary, run_eval

            summary = run_eval(run_cfg, run_dir, raw)
            print_eval_summary(summary)
            return summary.get("final_score")
        from harness.train import train

        summary = train(run_cfg, run_dir, raw)
    except SetupError as exc:  # summary.json already says failed, with the traceback
        fail(str(exc))
    print_summary(summary)
    return summary.get("final_score")


def print_summary(s: dict[str, Any]) -> None:
    key = s.get("score_key", "score")

    def pct(x: Any) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"

    gain = "-" if s.get("gain") is None else f"{100 * s['gain']:+.1f} points"
    lines = [
        "",
        f"run finished: {s.get('status')}  ({s.get('wall_time_s', 0):.0f} s)",
        f"  objective      {s.get('objective')}",
        f"  {s.get('benchmark')} {key}   start {pct(s.get('initial_score'))}  ->  end {pct(s.get('final_score'))}"
        f"   (gain {gain}; best {pct(s.get('best_score'))})",
        f"  run directory  {s.get('run_dir')}",
        "  figures        make figures   (reads every run under outputs/)",
        "",
    ]
    print("\n".join(lines))
