"""Trust-region geometry: the gradient each objective gives a token, analytically and on logged tokens.

(a) Analytic. Every objective's per-token gradient is c * grad(log pi) (objectives.md §1). `gradient_coefficient`
    gets c by autograd through the registered objective itself (`harness.objectives.get_objective`), so the
    pictures show the code that trains, not a re-derivation of the papers' formulas. The heatmaps colour
    c / (A r), r = pi/mu: how the trust region modulates the plain importance-weighted gradient — 1 untouched,
    0 dropped (mask or clip), in between damped, above 1 amplified, below 0 corrective (the update pushes pi back
    toward mu). On log axes a ratio clip is a band of constant pi/mu, so a rare token (mu = 0.001) loses its
    gradient after moving 0.0003 in probability, while DPPO's |pi - mu| <= delta lets it move by delta; DRPO's
    weight crosses zero exactly at |pi - mu| = delta and turns corrective beyond.
(b) Logged tokens. `tokens.parquet` in a run directory holds a bounded sample of response tokens per evaluation:
    step, mu (rollout prob), pi (trainer prob before the update), adv, entropy, kept (not masked/clipped), weight
    (c / A from autograd, harness/tokens.py), token_id, pos. From it: the importance ratio against |pi - mu| by
    token probability (P-DPPO Fig. 2: the ratio is volatile exactly where the probability gap is tiny), the
    probability and entropy of the tokens the trust region masked (P-DPPO Fig. 6, pitfall P10), and the
    histogram of w = c / (A r), the logged counterpart of the heatmaps.

Figures follow figures.py: pure DataFrame/name -> Figure functions, SkipFigure with a reason when there is
nothing to draw, Agg canvas, no pyplot state.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from matplotlib.axes import Axes
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure

from analysis.figures import _CELL_W, Panel, SkipFigure, _colors, _curves, _figure, _title
from analysis.load import ALIASES
from analysis.stats import arm_columns, arm_labels, is_config_column
from harness.objectives import OBJECTIVE_NAMES, ObjectiveConfig, get_objective

logger = logging.getLogger(__name__)

# The arms both papers compare head to head; the overview figure shows these, every objective gets its own file.
HEADLINE = ("pg_is", "grpo", "cispo", "dppo", "dppo_kl", "spo", "drpo")
PROB_RANGE = (1e-3, 0.999)  # 1.0 itself is left out: Binary-KL's log(1 - p) has no value there
# Colour scale of the modulation c / (A r): white = no gradient, blue = along A, red = against A (corrective).
_NORM = (-1.0, 0.0, 2.0)
_CMAP = "RdBu"
TOKENS_FILE = "tokens.parquet"
TOKEN_COLUMNS = ("step", "mu", "pi", "adv", "entropy", "kept", "weight")
_REQUIRED_TOKEN_COLUMNS = ("mu", "pi")
# Token-probability buckets for the ratio scatter: rare, uncommon, common, near-certain.
_MU_BINS = (0.0, 0.01, 0.1, 0.5, 1.0)
_MU_BIN_LABELS = ("μ < 0.01", "0.01 ≤ μ < 0.1", "0.1 ≤ μ < 0.5", "μ ≥ 0.5")


# --- (a) analytic ---------------------------------------------------------------------------------------------


def gradient_coefficient(
    name: str, mu: np.ndarray | float, pi: np.ndarray | float, adv: np.ndarray | float = 1.0, **overrides: object
) -> np.ndarray:
    """c with grad = c * grad(log pi) for objective `name` at behaviour prob `mu`, policy prob `pi`, advantage `adv`.

    Inputs broadcast against each other. The objective is called in float64 on one-token responses, one per
    point ([N, 1]: a sequence-level objective, GSPO's ratio or CPPO's budget, sees each token alone), and c is
    read off autograd: loss = -(surrogate), so c = -d loss / d log pi. With no mismatch assumed, the trainer's
    recompute equals the rollout's (old_logp = log mu) and the Top-K set is the sampled token alone (K = 1,
    where Top-K TV/KL equal Binary TV/KL).
    """
    mu_a, pi_a, adv_a = np.broadcast_arrays(
        np.asarray(mu, dtype=np.float64), np.asarray(pi, dtype=np.float64), np.asarray(adv, dtype=np.float64)
    )
    obj = get_objective(name, **overrides)
    behavior = torch.from_numpy(np.log(mu_a).reshape(-1, 1).copy())
    logp = torch.from_numpy(np.log(pi_a).reshape(-1, 1).copy()).requires_grad_(True)
    advantages = torch.from_numpy(adv_a.reshape(-1, 1).copy())
    topk = obj.cfg.needs_topk
    out = obj(
        logp=logp,
        behavior_logp=behavior,
        advantages=advantages,
        mask=torch.ones_like(behavior),
        old_logp=behavior if obj.needs_old else None,
        topk_logp=logp.detach().unsqueeze(-1) if topk else None,
        topk_behavior_logp=behavior.unsqueeze(-1) if topk else None,
    )
    # Each one-token response's loss depends on its own log pi only: the gradient of the sum is the per-token one.
    (grad,) = torch.autograd.grad(out.loss_mat.sum(), logp)
    return (-grad).reshape(mu_a.shape).numpy()


def modulation(name: str, mu: np.ndarray, pi: np.ndarray, adv: float, **overrides: object) -> np.ndarray:
    """c / (A r): the trust region's factor on the plain importance-weighted gradient A r (w for SPO/DRPO)."""
    if adv == 0:
        raise ValueError("modulation: adv must be non-zero (A = 0 gives no gradient to modulate)")
    return gradient_coefficient(name, mu, pi, adv, **overrides) / (adv * np.asarray(pi) / np.asarray(mu))


def prob_grid(n: int = 161) -> np.ndarray:
    """n log-spaced probabilities over PROB_RANGE: rare tokens get as much room as common ones."""
    return np.geomspace(*PROB_RANGE, n)


def _log_ticks(ax: Axes) -> None:
    """Decade ticks on axes that carry log10 coordinates (log-scaled Axes cost seconds per figure in layout)."""
    lo, hi = np.log10(PROB_RANGE)
    ticks = [*np.arange(np.ceil(lo), np.floor(hi) + 1), hi]
    labels = [f"{10**t:g}" for t in ticks[:-1]] + [f"{PROB_RANGE[1]:g}"]
    ax.set_xticks(ticks, labels)
    ax.set_yticks(ticks, labels)


def _heatmap(ax: Axes, name: str, adv: float, grid: np.ndarray, xlabel: bool, ylabel: bool) -> object:
    mu, pi = np.meshgrid(grid, grid)  # x = mu, y = pi
    field = modulation(name, mu, pi, adv)
    vmin, vcenter, vmax = _NORM
    lg = np.log10(grid)
    step = lg[1] - lg[0]
    extent = (lg[0] - step / 2, lg[-1] + step / 2, lg[0] - step / 2, lg[-1] + step / 2)
    image = ax.imshow(
        field, origin="lower", extent=extent, aspect="auto", cmap=_CMAP, norm=TwoSlopeNorm(vcenter, vmin, vmax)
    )
    # The edge of the region with no or a reversed gradient: a mask/clip boundary, or where DRPO's w crosses 0.
    off = (field <= 0).astype(float)
    if 0 < off.mean() < 1:
        ax.contour(lg, lg, off, levels=[0.5], colors="black", linewidths=0.8)
    ax.plot(lg[[0, -1]], lg[[0, -1]], color="grey", linestyle="--", linewidth=0.8)
    _log_ticks(ax)
    if xlabel:
        ax.set_xlabel("μ (rollout probability of the token)")
    if ylabel:
        ax.set_ylabel("π (policy probability)")
    ax.set_title(f"{name}, A {'> 0' if adv > 0 else '< 0'}", fontsize=9)
    return image


def describe(name: str) -> str:
    """`grpo (eps_low=0.2, eps_high=0.28)`: the preset and the hyper-parameters that set its geometry."""
    cfg = get_objective(name).cfg
    base = ObjectiveConfig()
    shared = {f.name for f in dataclasses.fields(ObjectiveConfig)}
    parts = [
        f"{f.name}={getattr(cfg, f.name):g}"
        if isinstance(getattr(cfg, f.name), float)
        else f"{f.name}={getattr(cfg, f.name)}"
        for f in dataclasses.fields(cfg)
        if (f.name not in shared and getattr(cfg, f.name) is not None)
        or (f.name in ("anchor", "is_cap") and getattr(cfg, f.name) != getattr(base, f.name))
    ]
    return f"{name} ({', '.join(parts)})" if parts else name


def fig_gradient_weight(names: Sequence[str] = HEADLINE, n: int = 161, title: str = "") -> Figure:
    """Heatmaps of c / (A r) over (mu, pi): one column per objective, rows A > 0 and A < 0 (a single objective:
    one row, A > 0 left)."""
    unknown = [x for x in names if x not in OBJECTIVE_NAMES]
    if unknown:
        raise ValueError(f"unknown objectives {unknown}; valid objectives: {', '.join(OBJECTIVE_NAMES)}")
    grid = prob_grid(n)
    single = len(names) == 1
    fig = _figure(1, 2, width=9.5) if single else _figure(2, len(names), width=2.9 * len(names) + 1.2)
    axes = np.array(fig.axes).reshape(2, len(names)) if not single else np.array(fig.axes).reshape(2, 1)
    image = None
    for j, name in enumerate(names):
        for i, adv in enumerate((1.0, -1.0)):
            xlabel, ylabel = (True, i == 0) if single else (i == 1, j == 0)
            image = _heatmap(axes[i, j], name, adv, grid, xlabel=xlabel, ylabel=ylabel)
    cbar = fig.colorbar(image, ax=fig.axes, extend="both", shrink=0.9)
    cbar.set_label("c / (A·π/μ): 1 plain IS, 0 dropped, < 0 corrective")
    what = f"gradient weight of {describe(names[0])}" if single else "per-token gradient weight (default settings)"
    note = "black: edge of the no-gradient / corrective region; dashed: π = μ"
    if single and get_objective(names[0]).needs_old:
        note += "; drawn with π_old = μ (no mismatch)"
    if single and get_objective(names[0]).cfg.needs_topk:
        note += "; top-K set = the sampled token (K = 1)"
    fig.suptitle(_title(title, what) + "\n" + note)
    return fig


def fig_gradient_slices(
    names: Sequence[str] = HEADLINE, mus: Sequence[float] = (0.01, 0.5), n: int = 400, title: str = ""
) -> Figure:
    """c against pi at a few fixed mu, A = +1: how far each objective lets a rare vs a common token move up."""
    fig = _figure(1, len(mus))
    colors = _colors(list(names))
    pi = prob_grid(n)
    for ax, mu in zip(fig.axes, mus, strict=True):
        for name in names:
            # The untruncated PG-IS line is the reference the others bend away from: drawn wide and underneath.
            style = {"color": "lightgrey", "linewidth": 4, "zorder": 1} if name == "pg_is" else {"color": colors[name]}
            ax.plot(pi, gradient_coefficient(name, mu, pi, 1.0), label=name, **{"linewidth": 1.2, **style})
        ax.axvline(mu, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_xlabel("π (current policy probability)")
        ax.set_ylabel("gradient coefficient c (A = +1)")
        ax.set_title(f"μ = {mu:g} (dashed)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(_title(title, "gradient coefficient c vs π at fixed μ") + "\nsymlog y axis; c = 0: no gradient")
    return fig


def write_analytic_figures(out_dir: Path | str, names: Sequence[str] | None = None) -> list[Path]:
    """figures/geometry/: the headline overview, the slices, and one heatmap pair per objective."""
    from analysis.figures import save_figure

    out_dir = Path(out_dir)
    names = list(OBJECTIVE_NAMES if names is None else names)
    headline = [x for x in HEADLINE if x in names] or names[: len(HEADLINE)]
    paths = save_figure(fig_gradient_weight(headline), out_dir, "gradient_weight_overview")
    paths += save_figure(fig_gradient_slices(headline), out_dir, "gradient_slices")
    for name in names:
        paths += save_figure(fig_gradient_weight([name], n=121), out_dir, f"gradient_weight_{name}")
    return paths


# --- (b) logged tokens ----------------------------------------------------------------------------------------


def read_tokens(run_dir: Path | str) -> pd.DataFrame | None:
    """A run's tokens.parquet, or None when the run has none; ValueError when it is unreadable or lacks mu/pi."""
    path = Path(run_dir) / TOKENS_FILE
    if not path.is_file():
        return None
    try:
        df = pd.read_parquet(path)
    except Exception as exc:  # a parquet torn by a crash must not stop the other runs' figures
        raise ValueError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None
    missing = [c for c in _REQUIRED_TOKEN_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: no {', '.join(missing)} column")
    return df


def load_tokens(runs: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Tokens of every run in `runs` (one row per run: `run` = its directory, plus config columns to carry).

    Returns (tokens with the run's config columns, runs without a usable tokens.parquet). W&B runs have no
    run directory here and count as without.
    """
    frames, without = [], []
    for _, row in runs.iterrows():
        run = str(row["run"])
        try:
            df = None if run.startswith("wandb:") else read_tokens(run)
        except ValueError as exc:
            logger.warning("%s; its tokens are left out", exc)
            df = None
        if df is None or df.empty:
            without.append(run)
            continue
        frames.append(df.assign(run=run))
    if not frames:
        return pd.DataFrame(columns=["run", *TOKEN_COLUMNS]), without
    tokens = pd.concat(frames, ignore_index=True)
    for col in TOKEN_COLUMNS:  # optional columns a writer left out read as absent values
        if col not in tokens.columns:
            tokens[col] = np.nan
    tokens["kept"] = tokens["kept"].map(lambda v: bool(v) if pd.notna(v) else True)
    config = runs.drop(columns=[c for c in runs.columns if c in tokens.columns and c != "run"])
    return tokens.merge(config, on="run", how="left"), without


def _arm_groups(tokens: pd.DataFrame, arms: Sequence[str] | None) -> list[tuple[str, pd.DataFrame]]:
    arms = list(arm_columns(tokens) if arms is None else arms)
    labels = arm_labels(tokens, arms)
    return [(str(lab), tokens[labels == lab]) for lab in sorted(labels.unique())]


def fig_ratio_vs_tv(
    tokens: pd.DataFrame, *, arms: Sequence[str] | None = None, max_points: int = 4000, title: str = ""
) -> Figure:
    """Importance ratio pi/mu against |pi - mu|, coloured by mu: one panel per arm (P-DPPO Fig. 2)."""
    df = tokens.dropna(subset=["mu", "pi"])
    df = df[(df["mu"] > 0) & (df["pi"] > 0)]
    if df.empty:
        raise SkipFigure("no tokens with mu and pi")
    groups = _arm_groups(df, arms)
    fig = _panel_grid(len(groups))
    rng = np.random.default_rng(0)  # a fixed subsample: the same runs give the same picture
    floor = 1e-6  # |pi - mu| = 0 has no place on a log axis; it is drawn at this floor
    for ax, (label, sub) in zip(fig.axes[: len(groups)], groups, strict=True):
        if len(sub) > max_points:
            sub = sub.iloc[np.sort(rng.choice(len(sub), max_points, replace=False))]
        gap = (sub["pi"] - sub["mu"]).abs().clip(lower=floor)
        ratio = sub["pi"] / sub["mu"]
        bucket = pd.cut(sub["mu"], _MU_BINS, labels=_MU_BIN_LABELS, right=False, include_lowest=True)
        colors = _colors(list(_MU_BIN_LABELS))
        for lab in _MU_BIN_LABELS:
            sel = (bucket == lab).to_numpy()
            if sel.any():
                ax.scatter(gap[sel], ratio[sel], s=4, alpha=0.5, color=colors[lab], label=f"{lab} ({sel.sum()})")
        for y, what in ((1.28, "clip 1 + 0.28"), (0.8, "clip 1 − 0.2")):
            ax.axhline(y, color="black", linestyle=":", linewidth=0.8, label=what)
        ax.axvline(0.15, color="black", linestyle="--", linewidth=0.8, label="DPPO-TV δ = 0.15")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("|π − μ| (probability gap)")
        ax.set_ylabel("importance ratio π / μ")
        ax.set_title(f"{label} (n={sub['run'].nunique()} runs)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, markerscale=3)
    note = f"at most {max_points} tokens per panel, colour = μ bucket (tokens); gaps below {floor:g} drawn at {floor:g}"
    fig.suptitle(_title(title, "importance ratio vs probability gap") + "\n" + note)
    return fig


def fig_masked_tokens(tokens: pd.DataFrame, *, arms: Sequence[str] | None = None, title: str = "") -> Figure:
    """Distribution of mu and of entropy for masked vs kept tokens, one column per arm (P-DPPO Fig. 6)."""
    df = tokens.dropna(subset=["mu"])
    groups = [(lab, sub) for lab, sub in _arm_groups(df, arms) if (~sub["kept"]).any()]
    if not groups:
        raise SkipFigure("no masked or clipped tokens in tokens.parquet")
    has_entropy = df["entropy"].notna().any()
    rows = 2 if has_entropy else 1
    fig = _figure(rows, len(groups), width=max(_CELL_W * len(groups), 7.0))
    grid = np.array(fig.axes).reshape(rows, len(groups))
    mu_bins = np.geomspace(max(df.loc[df["mu"] > 0, "mu"].min(), 1e-6), 1.0, 40)
    ent = df["entropy"].dropna()
    ent_bins = np.linspace(0.0, float(ent.max()) if len(ent) and ent.max() > 0 else 1.0, 40)
    for j, (label, sub) in enumerate(groups):
        specs = [("mu", mu_bins, "μ of the token (rollout probability)", True)]
        if has_entropy:
            specs.append(("entropy", ent_bins, "policy entropy at the token (nats)", False))
        for i, (col, bins, xlabel, logx) in enumerate(specs):
            ax: Axes = grid[i, j]
            for kept, color, what in ((True, "tab:blue", "kept"), (False, "tab:red", "masked / clipped")):
                vals = sub.loc[sub["kept"] == kept, col].dropna()
                vals = vals[vals > 0] if logx else vals
                if len(vals):
                    # Fractions, not densities: with log-spaced bins a density would inflate the narrow low bins.
                    weights = np.full(len(vals), 1.0 / len(vals))
                    ax.hist(
                        vals, bins=bins, weights=weights, histtype="step", color=color, label=f"{what} ({len(vals)})"
                    )
                    ax.axvline(vals.mean(), color=color, linestyle="--", linewidth=0.8)
            if logx:
                ax.set_xscale("log")
            ax.set_xlabel(xlabel)
            ax.set_ylabel("fraction of the group's tokens")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
            if i == 0:
                ax.set_title(f"{label} (n={sub['run'].nunique()} runs)", fontsize=9)
    fig.suptitle(
        _title(title, "masked vs kept tokens")
        + "\nshare of each group per bin (token counts in the legend); dashed: means"
    )
    return fig


def masked_token_stats(tokens: pd.DataFrame) -> pd.DataFrame:
    """One row per run and step: mean mu and mean entropy of its masked tokens, and the masked fraction."""
    df = tokens.dropna(subset=["step"])
    config = [c for c in df.columns if is_config_column(c) or c in ("name", *ALIASES)]
    masked = df[~df["kept"]]
    g = masked.groupby(["run", "step"])
    stats = pd.DataFrame({"tokens/masked_mu_mean": g["mu"].mean(), "tokens/masked_entropy_mean": g["entropy"].mean()})
    frac = df.groupby(["run", "step"])["kept"].apply(lambda k: float((~k).mean())).rename("tokens/masked_frac")
    out = frac.to_frame().join(stats, how="left").reset_index()
    out = out.merge(df.drop_duplicates("run")[["run", *config]], on="run", how="left")
    out["step"] = out["step"].astype(int)
    return out


def fig_masked_token_curves(tokens: pd.DataFrame, *, arms: Sequence[str] | None = None, title: str = "") -> Figure:
    """Mean mu and entropy of masked tokens vs step, mean ± 95% CI over seeds, one line per arm (P-DPPO Fig. 6)."""
    stats = masked_token_stats(tokens)
    specs = [
        ("tokens/masked_mu_mean", "μ of masked tokens (mean)", True),
        ("tokens/masked_entropy_mean", "entropy of masked tokens (nats)", False),
    ]
    panels = [Panel(col, lab, logy, data=stats) for col, lab, logy in specs if stats[col].notna().any()]
    if not panels:
        raise SkipFigure("no masked or clipped tokens in tokens.parquet")
    return _curves(panels, arms=arms, x="step", smooth=1, title=_title(title, "masked tokens over training"))


def token_modulation(tokens: pd.DataFrame) -> pd.Series:
    """w = c / (A r) per logged token, the quantity of the analytic heatmaps.

    The trainer writes `weight` = c / A, read off autograd for every objective (harness/tokens.py): pi/mu for
    PG-IS, the same or 0 under a mask, A r w / A for SPO/DRPO. Dividing by r = pi/mu leaves the trust region's
    own factor: 1 untouched, 0 dropped, min(r, C)/r under TIS, DRPO's w (negative = corrective).
    """
    return tokens["weight"] * tokens["mu"] / tokens["pi"]


def fig_token_weights(tokens: pd.DataFrame, *, arms: Sequence[str] | None = None, title: str = "") -> Figure:
    """Histogram of w = c / (A r) of the sampled tokens per arm: dropped (w = 0), corrective (w < 0) and amplified
    (w > 1) mass. An arm whose tokens all have w = 1 (PG-IS, or nothing clipped) has nothing to show."""
    df = tokens.dropna(subset=["weight", "mu", "pi"])
    df = df[df["pi"] > 0].assign(w=lambda d: token_modulation(d))
    groups = [(lab, sub) for lab, sub in _arm_groups(df, arms) if ((sub["w"] - 1).abs() > 1e-4).any()]
    if not groups:
        raise SkipFigure("no token whose gradient weight differs from plain PG-IS in tokens.parquet")
    fig = _panel_grid(len(groups))
    lo, hi = np.nanpercentile(pd.concat([sub["w"] for _, sub in groups]), [0.5, 99.5])
    bins = np.linspace(min(lo, -0.1), max(hi, 1.1), 50)
    for ax, (label, sub) in zip(fig.axes[: len(groups)], groups, strict=True):
        w = sub["w"]
        neg, zero, amp = float((w < 0).mean()), float((w == 0).mean()), float((w > 1 + 1e-4).mean())
        legend = f"{len(w)} tokens: {zero:.1%} w=0, {neg:.1%} w<0, {amp:.1%} w>1"
        ax.hist(w.clip(bins[0], bins[-1]), bins=bins, color="tab:purple", alpha=0.7, label=legend)
        for x in (0.0, 1.0):
            ax.axvline(x, color="black", linestyle="--", linewidth=0.8)
        ax.set_xlabel("w = c / (A·π/μ) (clipped to the plotted range)")
        ax.set_ylabel("tokens (count)")
        ax.set_title(f"{label} (n={sub['run'].nunique()} runs)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    note = "dashed: w = 0 (dropped) and w = 1 (plain importance-weighted gradient)"
    fig.suptitle(_title(title, "trust-region weight of sampled tokens") + "\n" + note)
    return fig


def _panel_grid(n: int, max_cols: int = 4) -> Figure:
    """One panel per arm, wrapped into rows of `max_cols` (a 15-arm sweep in one row is unreadably wide)."""
    cols = min(n, max_cols)
    rows = -(-n // cols)
    fig = _figure(rows, cols, width=max(_CELL_W * cols, 7.0))
    for ax in fig.axes[n:]:
        ax.set_visible(False)
    return fig


# Figure file stem -> function of the tokens frame; the driver writes them per experiment.
TOKEN_FIGURES: dict[str, Callable[..., Figure]] = {
    "tokens_ratio_vs_gap": fig_ratio_vs_tv,
    "tokens_masked": fig_masked_tokens,
    "tokens_masked_curves": fig_masked_token_curves,
    "tokens_weights": fig_token_weights,
}
