"""What a GRPOConfig asks of our objective, judged before TRL builds a model: each of TRL's loss settings acts or
is refused in one line naming the key, the objective and what to set (docs/integrations.md has the table).

- epsilon, epsilon_high, delta: the objective's bounds, as harness.integrations.bounds maps them (the verl adapter
  reads verl's clip keys the same way): epsilon the lower radius (or the one radius of SPO, DRPO, CPPO),
  epsilon_high the upper (None: epsilon), delta the importance-weight cap (TRL clamps the ratio of every token at
  delta; None leaves the objective's own cap). A key the objective does not read (PG-IS has no radius, DRPO no
  upper one, mask_neg's upper side is open), changed from TRL's default, is refused.
- loss_type: the aggregation mode, 'dr_grpo' seq-mean-token-sum-norm (horizon max_completion_length), 'grpo'
  seq-mean-token-mean, 'bnpo' token-mean, each over the micro-batch and divided by the gradient-accumulation steps
  as TRL does. A fully masked completion (mask_truncated_completions) leaves the seq-mean denominators here, where
  TRL averages it in as 0. 'dapo' (TRL's default: the tokens of a whole accumulation window) and TRL's own losses
  ('cispo', 'sapo', 'luspo', 'vespo') are refused.
- vllm_importance_sampling_correction with use_vllm: refused, since the objective's weight already is pi/mu with
  mu the vLLM log-probs, and TRL's pi_old/mu on top would count mu twice.
An objective given by name takes these values; one given as an Objective must agree with them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from harness.integrations.bounds import bound_sides, current
from harness.objectives import Objective, get_objective

AGG_OF_LOSS_TYPE = {"dr_grpo": "seq-mean-token-sum-norm", "grpo": "seq-mean-token-mean", "bnpo": "token-mean"}
CLIP_KEYS = ("epsilon", "epsilon_high", "delta")
_SET = "set loss_type to 'dr_grpo' (seq-mean-token-sum-norm), 'grpo' (seq-mean-token-mean) or 'bnpo' (token-mean)"


def trl_defaults(args: Any) -> dict[str, Any]:
    """GRPOConfig's own defaults, the reference for "changed" (read from the installed TRL's dataclass)."""
    return {f.name: f.default for f in dataclasses.fields(type(args)) if f.name in (*CLIP_KEYS, "loss_type")}


def key_of(side: str, args: Any) -> str:
    """The GRPOConfig key that sets a bound of this side."""
    if side == "high" and args.epsilon_high is not None:
        return "epsilon_high"
    return "delta" if side == "cap" else "epsilon"


def _value(side: str, args: Any) -> float | None:
    return getattr(args, key_of(side, args))


def sources(objective: Objective, args: Any) -> dict[str, str]:
    """{objective field: the GRPOConfig key that sets it}; a cap with delta None is the objective's own."""
    sides = bound_sides(objective, cap_everywhere=True)
    return {f: key_of(s, args) for f, s in sides.items() if _value(s, args) is not None}


def _loss_type(args: Any, name: str) -> str | None:
    loss_type = args.loss_type
    if loss_type in AGG_OF_LOSS_TYPE:
        return None
    if loss_type == "dapo":
        why = "TRL's dapo divides by the tokens of a whole accumulation window, which no aggregation mode of"
        return f"GRPOConfig.loss_type='dapo': {why} objective {name} does; {_SET}"
    return f"GRPOConfig.loss_type={loss_type!r}: TRL's own loss, in place of objective {name}'s; {_SET}"


def _unread(objective: Objective, args: Any) -> str | None:
    read = set(sources(objective, args).values())
    for key, default in trl_defaults(args).items():
        value = getattr(args, key)
        if key in CLIP_KEYS and key not in read and value != default:
            fields = ", ".join(f"{f} from {k}" for f, k in sources(objective, args).items()) or "no bound TRL sets"
            return (
                f"GRPOConfig.{key}={value!r}: objective {objective.name} does not read it ({fields}); leave it at "
                f"TRL's default {default!r}"
            )
    return None


def _disagreement(objective: Objective, values: dict[str, Any], args: Any) -> str | None:
    """The first value GRPOConfig sets that the Objective passed in holds otherwise."""
    keys = {**sources(objective, args), "agg": "loss_type"}
    for field, value in values.items():
        held = objective.cfg.agg if field == "agg" else current(objective, field)
        if held == value:
            continue
        key = keys[field]
        if field == "agg":
            to = next((t for t, mode in AGG_OF_LOSS_TYPE.items() if mode == held), None)
            fix = f"set loss_type={to!r}" if to else f"no loss_type aggregates as {held!r}"
        else:
            fix = f"set {key}={held!r}"
        return (
            f"GRPOConfig.{key}={getattr(args, key)!r} sets {field}={value!r} but the objective passed has "
            f"{field}={held!r}; {fix}, or pass objective={objective.name!r} by name to take GRPOConfig's values"
        )
    return None


def refusal(objective: Objective, args: Any) -> str | None:
    """The line refusing what `args` asks of `objective` that TrustRegionGRPOTrainer cannot honour, or None."""
    name = objective.name
    if getattr(args, "use_vllm", False) and getattr(args, "vllm_importance_sampling_correction", False):
        return (
            "GRPOConfig.vllm_importance_sampling_correction=True with use_vllm: objective "
            f"{name} already weights each token by pi/mu (mu: vLLM's log-probs), so TRL's pi_old/mu weight would "
            "count mu twice; set vllm_importance_sampling_correction=False"
        )
    return _loss_type(args, name) or _unread(objective, args)


def resolve(objective: str | Objective, args: Any) -> Objective:
    """The objective TRL's `args` train: a name takes GRPOConfig's bounds and aggregation, an Objective must agree
    with them. ValueError, in one line, for anything refused."""
    given = get_objective(objective) if isinstance(objective, str) else objective
    line = refusal(given, args)
    if line:
        raise ValueError(line)
    sides = bound_sides(given, cap_everywhere=True)
    values: dict[str, Any] = {f: _value(s, args) for f, s in sides.items() if _value(s, args) is not None}
    values["agg"] = AGG_OF_LOSS_TYPE[args.loss_type]
    if not isinstance(objective, str):
        line = _disagreement(given, values, args)
        if line:
            raise ValueError(line)
        return given
    try:
        return get_objective(objective, **values)
    except ValueError as e:
        used = ", ".join(f"GRPOConfig.{k}={getattr(args, k)!r}" for k in dict.fromkeys(sources(given, args).values()))
        raise ValueError(f"{used}: objective {objective} cannot take them: {e}") from None
