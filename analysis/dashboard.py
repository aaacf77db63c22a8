"""`python -m analysis.dashboard --entity E --project P [--experiment X]`: the comparison workspace in W&B.

Builds a saved view with `wandb-workspaces`: one section per metric family (reward and evaluation, entropy and
length, training-inference mismatch, trust region), each panel a line plot against the logged `step` with one
line per objective (runs grouped by the top-level config field `objective`; mean over seeds with a standard-error
band). Only training runs are shown (job type "train": eval-only runs are left out) and, with --experiment, only
that experiment's (W&B group = experiment name). harness/loop/wandb_run.py sets these fields.

The workspace is saved only when W&B runs online (`--mode online` or WANDB_MODE=online); otherwise the command
prints what it built and saves nothing, so it is safe to run on an offline machine.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from dataclasses import dataclass
from typing import Any

from harness.rundir.wandb import WandbSettings, resolve_wandb_mode

# harness/loop/wandb_run.py: config.objective (top level), job_type = train | eval, group = experiment.
GROUP_BY = "objective"  # a config key
JOB_TYPE_KEY = "JobType"
EXPERIMENT_KEY = "Group"
X_AXIS = "step"  # RunLog's own step metric: training lines and eval lines share it (W&B's _step does not)


@dataclass(frozen=True)
class PanelSpec:
    """One line plot: the metric keys (or a regex over keys, for per-benchmark eval keys) and its y label."""

    title: str
    ylabel: str
    keys: tuple[str, ...] = ()
    regex: str | None = None
    log_y: bool = False


# Eval metrics reach W&B as eval/<benchmark>/<key> (RunLog.log_eval), so they are matched by pattern.
SECTIONS: dict[str, tuple[PanelSpec, ...]] = {
    "Reward and evaluation": (
        PanelSpec("training reward", "reward (mean over samples)", ("reward/mean",)),
        PanelSpec("eval accuracy avg@k", "avg@k (mean accuracy over k samples)", regex=r"^eval/.+/avg@\d+$"),
        PanelSpec("eval pass@k", "pass@k", regex=r"^eval/.+/pass@\d+$"),
        PanelSpec("groups with no signal", "fraction of groups", ("reward/zero_std_group_frac",)),
    ),
    "Entropy and length": (
        PanelSpec("policy entropy", "entropy (nats / token)", ("rollout/entropy",)),
        PanelSpec("response length", "tokens per completion", ("rollout/response_len_mean",)),
        PanelSpec("truncated completions", "fraction of completions", ("rollout/truncated_frac",)),
    ),
    "Training-inference mismatch": (
        PanelSpec("mismatch k3 KL(mu||pi)", "k3 per token", ("mismatch/k3",), log_y=True),
        PanelSpec("mismatch k1 KL(mu||pi)", "k1 per token", ("mismatch/k1",)),
        PanelSpec("mean |pi - mu|", "probability gap", ("mismatch/abs_prob_diff_mean",), log_y=True),
        PanelSpec("max |pi - mu|", "probability gap", ("mismatch/abs_prob_diff_max",)),
        PanelSpec("bad updates (A<0, mu-pi>0.5)", "fraction of tokens", ("mismatch/bad_update_frac",)),
    ),
    "Trust region": (
        PanelSpec("masked / clipped, A > 0", "fraction of tokens with A != 0", ("objective/masked_frac_pos",)),
        PanelSpec("masked / clipped, A < 0", "fraction of tokens with A != 0", ("objective/masked_frac_neg",)),
        PanelSpec("k3 KL at the update", "k3 per token", ("objective/approx_kl_k3",), log_y=True),
        PanelSpec("max ratio pi/mu", "ratio", ("objective/ratio_max",), log_y=True),
        PanelSpec("TIS-capped tokens", "fraction of tokens", ("objective/is_capped_frac",)),
        PanelSpec("corrective weights (w < 0)", "fraction of tokens with A != 0", ("objective/neg_weight_frac",)),
        PanelSpec("amplified weights (w > 1)", "fraction of tokens with A != 0", ("objective/weight_gt1_frac",)),
    ),
}


def build_workspace(entity: str, project: str, experiment: str | None = None, name: str | None = None) -> Any:
    """The workspace object (`wandb_workspaces.workspaces.Workspace`); building it needs no network."""
    with warnings.catch_warnings():  # the library's own pydantic-v1 deprecation notices: nothing to act on here
        warnings.simplefilter("ignore", DeprecationWarning)
        import wandb_workspaces.reports.v2 as wr
        import wandb_workspaces.workspaces as ws
        from wandb_workspaces import expr

    sections = []
    for title, specs in SECTIONS.items():
        panels = [
            wr.LinePlot(
                title=spec.title,
                x=X_AXIS,
                y=list(spec.keys),
                metric_regex=spec.regex,
                title_x="training step",
                title_y=spec.ylabel,
                log_y=spec.log_y or None,
                groupby=wr.Config(GROUP_BY),
                groupby_aggfunc="mean",
                groupby_rangefunc="stderr",
            )
            for spec in specs
        ]
        sections.append(ws.Section(name=title, panels=panels, is_open=True))
    filters = [expr.Metric(JOB_TYPE_KEY) == "train"]
    if experiment:
        filters.append(expr.Metric(EXPERIMENT_KEY) == experiment)
    return ws.Workspace(
        entity=entity,
        project=project,
        name=name or f"trust regions: {experiment or 'all experiments'}",
        sections=sections,
        settings=ws.WorkspaceSettings(x_axis=X_AXIS),
        runset_settings=ws.RunsetSettings(filters=expr.And(*filters), groupby=[expr.Config(GROUP_BY)]),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.dashboard", description=__doc__.splitlines()[0])
    parser.add_argument("--entity", required=True, help="W&B entity (user or team)")
    parser.add_argument("--project", required=True, help="W&B project the runs were logged to")
    parser.add_argument("--experiment", help="only this experiment's runs (the W&B group)")
    parser.add_argument("--name", help="workspace name (default: 'trust regions: <experiment>')")
    parser.add_argument("--mode", choices=["online", "offline", "disabled"], help="default: WANDB_MODE, else offline")
    args = parser.parse_args(argv)

    workspace = build_workspace(args.entity, args.project, args.experiment, args.name)
    n_panels = sum(len(s.panels) for s in workspace.sections)
    what = f"workspace {workspace.name!r}: {len(workspace.sections)} sections, {n_panels} panels"
    mode = resolve_wandb_mode(WandbSettings(mode=args.mode))
    if mode != "online":
        print(f"built {what}; not saved (W&B mode {mode}; use --mode online or WANDB_MODE=online to save)")
        return 0
    try:
        saved = workspace.save()
    except Exception as exc:  # no login, no network, no such project: one line, not a traceback
        print(f"error: could not save {what} to {args.entity}/{args.project}: {exc}", file=sys.stderr)
        return 1
    print(f"saved {what}: {saved.url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
