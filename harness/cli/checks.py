"""What `run.py` checks before Hydra starts: one line for a bad group option, an unknown key, a `_target_` on the
command line, a run directory another process is writing or an output folder that cannot be written, instead of
Hydra's own multi-line errors; plus the argv rewriting of `mode=plan` and the run stamp torchrun's ranks share."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from harness.config import CONF_DIR
from harness.errors import fail
from harness.rundir.lock import holder

GROUP_NAMES = ("model", "precision", "objective", "correction", "rollout", "data", "benchmark", "logger", "experiment")


def hydra_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The command line read as Hydra reads it (its flags, then the overrides). Hydra's own parser is private
    (`hydra._internal.utils.get_args_parser`), so its flags are declared again here; `--version` is a flag here
    (Hydra's prints and exits)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("overrides", nargs="*")
    for flag in ("--help", "--hydra-help", "--version", "--resolve", "--run", "--multirun", "--shell-completion"):
        short = {"--help": "-h", "--run": "-r", "--multirun": "-m", "--shell-completion": "-sc"}.get(flag)
        p.add_argument(flag, *([short] if short else []), action="store_true")
    p.add_argument("--cfg", "-c", choices=["job", "hydra", "all"])
    for flag, short in (("--package", "-p"), ("--config-path", "-cp"), ("--config-name", "-cn")):
        p.add_argument(flag, short)
    p.add_argument("--config-dir", "-cd")
    p.add_argument("--experimental-rerun")
    p.add_argument(
        "--info", "-i", const="all", nargs="?",
        choices=["all", "config", "defaults", "defaults-tree", "plugins", "searchpath"],
    )  # fmt: skip
    return p.parse_known_args(argv)


def _parse_overrides(argv: list[str]) -> tuple[list[Any], bool] | None:
    """The command line's overrides as Hydra parses them, and whether it asks for a sweep; None when Hydra cannot
    parse it (Hydra then reports that itself)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    args, rest = hydra_args(argv)
    try:
        overrides = OverridesParser.create().parse_overrides([*args.overrides, *(a for a in rest if a[:1] != "-")])
    except HydraException:
        return None
    return overrides, bool(args.multirun)


def _group_choices(o: Any) -> list[str]:
    """The options a group override picks: one, a comma sweep's, or those a glob(...) matches."""
    from hydra.core.override_parser.types import Glob

    value = o.value()
    if isinstance(value, Glob):
        return value.filter(group_options(o.key_or_group))
    return list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]


def check_group_options(argv: list[str]) -> None:
    """`objective=dpo` -> one line naming the valid options, before Hydra composes anything (Hydra's own message
    is a dozen lines and exits 1). The command line is read with Hydra's own parsers, so everything Hydra accepts
    passes: nested options (`+experiment=recipe/drpo_qwen3_4b`), `glob(...)`, `choice(...)`, comma sweeps,
    quoted values, deletions, flags anywhere. A line Hydra cannot parse is left for Hydra to report."""
    parsed = _parse_overrides(argv)
    if parsed is None:
        return
    for o in parsed[0]:
        if o.key_or_group not in GROUP_NAMES or o.package or o.is_delete():
            continue
        options = group_options(o.key_or_group)
        chosen = _group_choices(o)
        if not chosen:
            fail(f"{o.input_line} matches no option; valid {o.key_or_group} options: {', '.join(options)}")
        for option in chosen:
            if option not in options:
                fail(
                    f"{o.key_or_group}={option} is not an option; valid {o.key_or_group} options: {', '.join(options)}"
                )


# Values that are strings in verl ("lower_upper") but numbers to Hydra and YAML when they hold one dot:
# `0.5_2` reads as 0.52 and `2_0.5` as 20.5 (digit grouping), silently.
THRESHOLD_KEYS = ("correction.rollout_is_threshold", "correction.rollout_rs_threshold")


def check_threshold_strings(argv: list[str]) -> None:
    """`correction.rollout_rs_threshold=0.5_2` -> one line asking for quotes: unquoted, Hydra reads it as 0.52."""
    parsed = _parse_overrides(argv)
    if parsed is None:
        return
    for o in parsed[0]:
        if o.key_or_group not in THRESHOLD_KEYS or o.is_delete():
            continue
        raw = o.input_line.split("=", 1)[1]
        values = list(o.sweep_iterator()) if o.is_sweep_override() else [o.value()]
        if "_" in raw and any(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            fail(
                f"{o.key_or_group}: Hydra reads {raw} as a number (an underscore groups digits); "
                f"quote a 'lower_upper' string for Hydra, inside the shell's quotes: \"{o.key_or_group}='{raw}'\""
            )


# A sweep over many config groups is checked on its first combinations only: each costs one composition.
_MAX_KEY_CHECKS = 32


def check_override_keys(argv: list[str]) -> None:
    """`trainer.lrr=1`, or `objective.delta=0.3` under an objective without a delta -> one line naming the keys
    that exist there, as `+trainer.epochs=2` gets from validation (Hydra's own message is five lines and lists
    none). Only what Hydra itself would refuse is refused: the overrides are composed as Hydra composes them, once
    per choice of the config groups the command line (and, for a sweep, the experiment's `hydra.sweeper.params`)
    sweeps over, and only a "not in struct" failure is translated; anything else is left for Hydra to report."""
    import itertools

    from hydra.errors import ConfigCompositionException

    from harness.config import compose

    parsed = _parse_overrides(argv)
    if parsed is None:
        return
    overrides, multirun = parsed
    changes, groups = {}, {}
    for o in overrides:
        if o.is_delete() or o.package or o.key_or_group.startswith("hydra"):
            continue
        if o.key_or_group.split("/")[0] in GROUP_NAMES:
            groups[o.get_key_element()] = _group_choices(o)
        elif not o.is_add() and not o.is_force_add():  # `+key=` adds a key: validation names what is allowed
            changes[o.key_or_group] = _first_value(o)
    if not changes:
        return
    if multirun:  # an experiment's own sweep (`hydra.sweeper.params`) picks groups too; the command line wins
        first = [f"{k}={v[0]}" for k, v in groups.items() if v]
        try:
            params = compose(*first, hydra_config=True).get("hydra", {}).get("sweeper", {}).get("params") or {}
        except Exception:  # noqa: BLE001 - whatever fails here, Hydra reports itself
            return
        from hydra.core.override_parser.overrides_parser import OverridesParser

        try:
            swept = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
        except Exception:  # noqa: BLE001 - Hydra reports an experiment it cannot parse
            return
        for o in swept:
            key = o.key_or_group
            if key.split("/")[0] in GROUP_NAMES:
                if key not in groups and f"+{key}" not in groups:
                    groups[key] = _group_choices(o)
            elif key not in changes and not key.startswith("hydra"):
                changes[key] = _first_value(o)
    combos = itertools.product(*([f"{k}={c}" for c in v] for k, v in groups.items()))
    for combo in itertools.islice(combos, _MAX_KEY_CHECKS):
        try:
            compose(*combo, *changes.values())
        except ConfigCompositionException as e:
            text = f"{e} {e.__cause__}"
            key = next((k for k in changes if f"Could not override '{k}'" in text), None)
            if key is None or "not in struct" not in text:
                return
            fail(_unknown_key_message(key, compose(*combo, hydra_config=True)))
        except Exception:  # noqa: BLE001 - not a missing key: left for Hydra to report
            return


def _first_value(o: Any) -> str:
    """A value override as one `key=value` line: a sweep's first value (keys, not values, are checked)."""
    if not o.is_sweep_override():
        return o.input_line
    return f"{o.key_or_group}={next(iter(o.sweep_string_iterator()), '')}"


def _unknown_key_message(key: str, config: dict[str, Any]) -> str:
    """`objective (objective=grpo): unknown key 'delta'; allowed keys: agg, anchor, ...`: the deepest part of
    `key` that exists, the first part that does not, and what exists beside it."""
    parts, node, depth = key.split("."), config, 0
    while depth < len(parts) - 1 and isinstance(node, dict) and isinstance(node.get(parts[depth]), dict):
        node, depth = node[parts[depth]], depth + 1
    where = ".".join(parts[:depth]) or "the config"
    choice = config.get("hydra", {}).get("runtime", {}).get("choices", {}).get(parts[0]) if depth else None
    if choice:
        where += f" ({parts[0]}={choice})"
    keys = sorted(k for k in node if k != "hydra")
    return f"{where}: unknown key '{parts[depth]}'; allowed keys: {', '.join(keys)}"


def info_requested(argv: list[str]) -> bool:
    """--help, --hydra-help, --cfg/-c, --info/-i, --version, --shell-completion: Hydra prints and exits, and nothing
    may be written (no output folder either)."""
    args, _ = hydra_args(argv)
    flags = ("help", "hydra_help", "cfg", "info", "shell_completion", "version")
    return any(getattr(args, f, None) for f in flags)


def group_options(group: str) -> list[str]:
    """A config group's options: its YAML files, nested folders included (experiment=recipe/drpo_qwen3_4b)."""
    root = CONF_DIR / group
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.yaml"))


def check_command_line(argv: list[str]) -> None:
    """Before Hydra reads the command line: refuse what Hydra would act on before any of our validation runs.

    - A `_target_` (or any `hydra.callbacks` entry): Hydra instantiates callbacks, launchers and sweepers named in
      the config as it starts, so one given on the command line would run arbitrary code. They are accepted only
      from the project's config files.
    - A `hydra.run.dir` another live process is writing: Hydra would overwrite that run's .hydra/ files before
      our lock could refuse (harness.rundir.lock)."""
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if not sep:
            continue
        if "_target_" in arg or key == "hydra.callbacks" or key.startswith("hydra.callbacks."):
            fail(
                f"{key}: a _target_ or Hydra callback names code to run; it is accepted only from the project's "
                "config files (conf/), not from the command line"
            )
        if key == "hydra.run.dir" and "${" not in value and (who := holder(Path(value).expanduser())):
            fail(f"hydra.run.dir: {value} is being written by another process ({who}); wait for it to end")


def check_output_dir(argv: list[str]) -> None:
    """An output folder that cannot be created -> one line naming it, instead of Hydra's traceback.

    Checks `hydra.run.dir` / `hydra.sweep.dir` when given (a literal path, not an interpolation), else `outputs/`
    under the working directory, where both default to. Creating it early is harmless: Hydra would.
    """
    targets = {"hydra.run.dir": None, "hydra.sweep.dir": None}
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if sep and key in targets:
            targets[key] = value
    given = [(k, v) for k, v in targets.items() if v and "${" not in v]
    for key, value in given or [("output folder", "outputs")]:
        path = Path(value).expanduser()
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / f".write-test-{os.getpid()}"
            probe.touch()
            probe.unlink()
        except OSError as e:
            fail(f"{key}: cannot write to {str(path)!r} ({e.strerror or e}); choose a writable folder")


def plan_requested(argv: list[str]) -> bool:
    return any(a.lstrip("+~") == "mode=plan" for a in argv)


def plan_argv(argv: list[str], scratch: str) -> list[str]:
    """`mode=plan` builds nothing and leaves no run directories: Hydra's job folders (it always makes one) go to
    a scratch folder that run.py deletes, with no .hydra/ record and no log files, and Hydra's own log lines are
    off, so stdout is the PLAN lines and the sweep's summary."""
    return [
        *argv,
        f"hydra.run.dir={scratch}",
        f"hydra.sweep.dir={scratch}",
        "hydra.output_subdir=null",
        "hydra/job_logging=none",
        "hydra/hydra_logging=none",
    ]


def share_run_stamp() -> None:
    """Under torchrun every process composes the config; they must agree on the run directory, whose name has the
    start time in it. Rank 0's time goes to all of them (HARNESS_RUN_STAMP, read by the `run_stamp` resolver)."""
    from harness import distributed
    from harness.config import STAMP_FORMAT

    if distributed.world_size_from_env() == 1 or "HARNESS_RUN_STAMP" in os.environ:
        return
    pg = distributed.setup()
    os.environ["HARNESS_RUN_STAMP"] = pg.broadcast(time.strftime(STAMP_FORMAT))
