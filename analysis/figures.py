"""Pure DataFrame -> matplotlib Figure drawing, one figure per kind the two papers show.

The training curves are one table, METRIC_FIGURES (figure stem -> the metric columns of its panels), drawn by one
function, `draw(stem, metrics)`. The rest are functions of their own: the eval curves take their panels from the
data (one per benchmark, or per AIME kind), and final scores, the delta sweep and the findings suite's arm
intervals are no curves over steps.

Every curve is the mean over seeds of one arm (objective, and whatever else the experiment varies) with a 95%
Student-t band; an arm with one seed gets no band. The legend gives each arm's number of seeds. When precision
varies next to something else, each precision gets its own column of panels (DRPO's bf16 / fp8 grid).

Training curves can be drawn as the papers' Figs 13-17 draw them: each run Gaussian-smoothed over steps
(`sigma`, the papers' sigma = 2; `scipy.ndimage.gaussian_filter1d`, reflected at the ends), the mean and band of
the smoothed runs drawn over the faded raw mean. `python -m analysis` does so by default; `draw` draws the raw
values unless given `sigma`.

Quantities that span orders of magnitude (mismatch, KL, max ratio) get a log axis; there a band reaching below
zero is cut at half the smallest value. Policy entropy is always on a log axis (P-DPPO Fig. 7). Eval scores of an
AIME-style benchmark that logs `acc/<kind>` get one panel per kind (AIME24, AIME25), as P-DPPO reports them;
other benchmarks (arith) keep one avg@k panel each.

A figure whose columns are absent raises SkipFigure with a one-line reason; none is ever drawn empty.
Figures are built without pyplot (no global state, nothing to close) and render with the Agg canvas.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from scipy.ndimage import gaussian_filter1d

from analysis.stats import arm_columns, arm_labels, final_eval_scores, mean_ci, score_column

FACET = "precision.name"
_CELL_W, _CELL_H = 5.2, 3.1
_MAX_COLS = 3  # panels of an unfaceted figure wrap into rows of this many
PAPER_SIGMA = 2.0  # P-DPPO Figs 13-17: Gaussian smoothing, sigma = 2 steps
_RAW_ALPHA = 0.25


class SkipFigure(ValueError):
    """The data holds nothing this figure can show (the message says what is missing)."""


@dataclass(frozen=True)
class PanelLook:
    """How a panel shows `column` against the x column, labelled `ylabel`.

    `logy`: a log axis when the values span orders of magnitude; `yscale` forces a scale instead ("log" needs every
    value > 0 and falls back to linear otherwise). `second`: another column drawn dashed in the same arm colours
    (the min beside the max, A < 0 beside A > 0). `title` heads the panel; `hline` draws a reference line there.
    """

    column: str
    ylabel: str
    logy: bool = False
    title: str = ""
    yscale: str | None = None
    second: str | None = None
    hline: float | None = None

    @property
    def columns(self) -> list[str]:
        return [self.column] + ([self.second] if self.second else [])


@dataclass(frozen=True)
class Panel(PanelLook):
    """One panel bound to its frame."""

    data: pd.DataFrame = field(kw_only=True)


# --- training curves (metrics.jsonl: one row per run and step) ------------------------------------------------


@dataclass(frozen=True)
class PanelSpec(PanelLook):
    """One panel of a training-curve figure, before it meets the data (`bind` makes it a `Panel`).

    With `second`, the panel draws `column` solid and `second` dashed, or whichever of the two has values; the
    ylabel gets `sides[0]` when both do, `sides[1]` when only `column` does, `sides[2]` when only `second` does.
    An `optional` panel is drawn beside the others but cannot carry the figure alone: the figure is skipped unless
    a panel that is not optional has values; the skip reason then names their columns (as `named`, where given).
    """

    sides: tuple[str, str, str] = ("", "", "")
    optional: bool = False
    named: str = ""

    def bind(self, df: pd.DataFrame) -> Panel | None:
        """This panel over `df`'s columns that have values; None when neither has any."""
        first, second = (c if _has_values(df, c) else None for c in (self.column, self.second))
        if not (first or second):
            return None
        side = self.sides[0 if first and second else 1 if first else 2]
        return Panel(first or second, self.ylabel + side, self.logy, self.title, self.yscale,
                     second if first else None, self.hline, data=df)  # fmt: skip


@dataclass(frozen=True)
class FigureSpec:
    """A training-curve figure: its panels in order, headed `title`."""

    title: str
    panels: tuple[PanelSpec, ...]


def _signed(key: str, ylabel: str, title: str, *, optional: bool = False) -> PanelSpec:
    """`<key>_pos` solid with `<key>_neg` dashed: a diagnostic logged apart for A > 0 and A < 0."""
    sides = ("\n(A > 0 solid, A < 0 dashed)", "\n(A > 0)", "\n(A < 0)")
    return PanelSpec(f"{key}_pos", ylabel, title=title, second=f"{key}_neg", sides=sides, optional=optional,
                     named=f"{key}_pos|neg")  # fmt: skip


# Figure file stem -> its panels, each drawn by `draw` from `metrics`. The paper figure each follows is noted.
METRIC_FIGURES: dict[str, FigureSpec] = {
    # P-DPPO Fig. 3 left, Figs 5-7 top; DRPO's training reward.
    "reward_curves": FigureSpec("training reward", (PanelSpec("reward/mean", "training reward (mean over samples)"),)),
    # P-DPPO Fig. 3 right, Fig. 4; measured before each step's first update, so it is the engine-vs-trainer gap alone.
    "mismatch": FigureSpec("training-inference mismatch", (
        PanelSpec("mismatch/k3", "mismatch k3 KL(μ‖π) per token", logy=True),
        PanelSpec("mismatch/abs_prob_diff_mean", "mismatch mean |π − μ|", logy=True),
    )),
    # P-DPPO Fig. 5: tokens pushed down (A < 0) although pi already sits far below mu.
    "bad_updates": FigureSpec("bad updates",
                              (PanelSpec("mismatch/bad_update_frac", "bad updates (fraction of tokens)"),)),
    # P-DPPO Fig. 7 draws entropy on a log axis: its collapse under Relax-low shows as orders of magnitude.
    "entropy": FigureSpec("policy entropy",
                          (PanelSpec("rollout/entropy", "policy entropy (nats / token, log)", yscale="log"),)),
    "response_length": FigureSpec("response length",
                                  (PanelSpec("rollout/response_len_mean", "response length (tokens)"),)),
    # Tokens (A != 0) whose gradient the trust region dropped or clipped.
    "masked_frac": FigureSpec("trust-region masking", (
        PanelSpec("objective/masked_frac_pos", "masked / clipped fraction, A > 0"),
        PanelSpec("objective/masked_frac_neg", "masked / clipped fraction, A < 0"),
    )),
    "policy_drift": FigureSpec("policy drift within a step", (
        PanelSpec("objective/approx_kl_k3", "k3 KL(μ‖π) at the update", logy=True),
        PanelSpec("objective/ratio_max", "max ratio π/μ", logy=True),
    )),
    # SPO/DRPO/penalty weight w in c = A r w.
    "drpo_weights": FigureSpec("regulariser weights", (
        PanelSpec("objective/neg_weight_frac", "fraction with w < 0 (corrective)"),
        PanelSpec("objective/weight_gt1_frac", "fraction with w > 1 (amplified)"),
    )),
    # P-DPPO Fig. 3: max and min of mu - pi over the step's tokens before its first update. Linear, since the values
    # lie in [-1, 1] and a collapse shows as a jump toward +-1; without them the mismatch figure already has the mean.
    "mismatch_range": FigureSpec("mismatch range (Fig. 3)", (
        PanelSpec("mismatch/abs_prob_diff_mean", "mean |μ − π|", logy=True, title="mean |μ − π|", optional=True),
        PanelSpec("mismatch/mu_minus_pi_max", "μ − π: ", yscale="linear", title="max and min of μ − π",
                  second="mismatch/mu_minus_pi_min", sides=("max (solid), min (dashed)", "max", "min"), hline=0.0),
    )),
    # P-DPPO Fig. 6: mu and entropy of the tokens the trust region masked or clipped (gradient weight exactly 0).
    # A step that clipped nothing has no mu or entropy (NaN) and is left out of the mean.
    "clipped_token_curves": FigureSpec("clipped tokens (Fig. 6)", (
        PanelSpec("reward/mean", "training reward", title="reward", optional=True),
        _signed("objective/clipped_mu_mean", "rollout probability μ of clipped tokens", "μ of clipped tokens"),
        _signed("objective/clipped_entropy_mean", "entropy of clipped tokens (nats)", "entropy of clipped tokens"),
        _signed("objective/clipped_frac", "clipped fraction of tokens", "clipped fraction", optional=True),
    )),
    # P-DPPO Fig. 12: top-K mass of mu (Top-K runs only), and the low-probability tokens ratio clipping
    # over-constrains (§4).
    "rollout_probability": FigureSpec("rollout probability (Fig. 12)", (
        PanelSpec("rollout/topk_mass", "top-K probability mass of μ"),
        PanelSpec("rollout/low_prob_frac", "share of sampled tokens with μ ≤ 0.01"),
    )),
}  # fmt: skip


def draw(
    name: str,
    metrics: pd.DataFrame,
    *,
    arms: Sequence[str] | None = None,
    x: str = "step",
    smooth: int = 1,
    sigma: float = 0.0,
    title: str = "",
) -> Figure:
    """The training-curve figure `name` of METRIC_FIGURES over `metrics`: the panels with values, in order."""
    spec = METRIC_FIGURES[name]
    required = [p.named or " / ".join(p.columns) for p in spec.panels if not p.optional]
    bound = [(p.optional, panel) for p in spec.panels if (panel := p.bind(metrics))]
    if all(optional for optional, _ in bound):
        raise SkipFigure(f"no values for {' / '.join(required)}")
    panels = [panel for _, panel in bound]
    return _curves(panels, arms=arms, x=x, smooth=smooth, sigma=sigma, title=_title(title, spec.title))


# --- evaluation (eval.jsonl: one row per run and evaluation) -------------------------------------------------


def fig_eval_curves(
    evals: pd.DataFrame, *, arms: Sequence[str] | None = None, score: str | None = None, title: str = ""
) -> Figure:
    """Eval score (avg@k) vs step, one panel per benchmark, or per `acc/<kind>` of an AIME-style benchmark (AIME24
    and AIME25 apart, P-DPPO Fig. 1, 3, 8-9, 11), DRPO main figure."""
    score = _score(evals, score)
    panels = [Panel(col, f"{head} {score}", title=head if col != score else "", data=sub)
              for head, col, sub in _eval_panels(evals, score)]  # fmt: skip
    return _curves(panels, arms=arms, x="step", smooth=1, title=_title(title, f"evaluation {score}"))


def fig_final_scores(
    evals: pd.DataFrame, *, arms: Sequence[str] | None = None, score: str | None = None, title: str = ""
) -> Figure:
    """Final eval score per arm as bars (mean, 95% CI, one dot per seed): the ablations' comparison. One panel per
    benchmark, or per `acc/<kind>` of an AIME-style benchmark (AIME24, AIME25), as in `fig_eval_curves`."""
    score = _score(evals, score)
    arms = list(arm_columns(evals) if arms is None else arms)
    benches = _eval_panels(evals, score)
    n_arms = arm_labels(evals, arms).nunique()
    fig = _figure(1, len(benches), width=len(benches) * max(_CELL_W, 0.55 * n_arms + 1.5))
    for ax, (bench, col, sub) in zip(fig.axes, benches, strict=True):
        per_run = _per_run_final(sub, col, arms)
        if col != score:
            ax.set_title(bench)
        labels = sorted(per_run["label"].unique())
        colors = _colors(labels)
        for i, label in enumerate(labels):
            vals = per_run.loc[per_run["label"] == label, "final"].to_numpy(float)
            st = mean_ci(pd.DataFrame([vals])).iloc[0]
            ax.bar(i, st["mean"], color=colors[label], alpha=0.75, width=0.7)
            if st["n"] >= 2:
                ax.vlines(i, st["lo"], st["hi"], color="black", linewidth=1.5)
            ax.scatter(np.full(len(vals), i), vals, color="black", s=10, zorder=3)
        ax.set_xticks(range(len(labels)), [f"{lab}\n(n={(per_run['label'] == lab).sum()})" for lab in labels])
        ax.tick_params(axis="x", labelrotation=30 if len(labels) > 4 else 0, labelsize=7)
        ax.set_ylabel(f"{bench} final {score}")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(_title(title, f"final {score}") + "\nbar: mean over seeds, line: 95% CI (Student t), dots: seeds")
    return fig


def fig_arm_intervals(rows: Sequence[dict], *, broken_below: float, title: str = "") -> Figure:
    """One line per arm of a findings suite (analysis.findings.arm_summary rows): final held-out mean (dot), its 95%
    t interval clipped to [0, 1] (line) and every seed (a red x where the run broke: collapsed, or held-out below
    `broken_below`), with "broke k/n" at the right: the collapse rate beside the score, which a bar of means
    hides."""
    rows = [r for r in rows if r["seeds"]]
    if not rows:
        raise SkipFigure("no completed runs")
    fig = _figure(1, 1, width=7.5)
    fig.set_figheight(0.32 * len(rows) + 1.6)
    ax = fig.axes[0]
    for i, r in enumerate(rows):
        y = len(rows) - 1 - i
        lo, hi = r["final_eval_ci"]
        if np.isfinite(lo) and np.isfinite(hi):
            ax.hlines(y, max(lo, 0.0), min(hi, 1.0), color="black", linewidth=1.5)  # inside the metric's range
        ax.plot(r["final_eval_mean"], y, "o", color="tab:blue", zorder=3)
        seeds = np.asarray(list(r["final_eval_per_seed"].values()), dtype=float)
        broke = np.isin(np.asarray(list(r["final_eval_per_seed"]), dtype=int), r["broke_seeds"])
        ax.scatter(seeds[~broke], np.full((~broke).sum(), y + 0.18), s=10, color="gray", zorder=2)
        ax.scatter(seeds[broke], np.full(broke.sum(), y + 0.18), s=22, marker="x", color="tab:red", zorder=2)
        ax.annotate(f"broke {r['broke']}/{r['seeds']}", (1.01, y), xycoords=("axes fraction", "data"), fontsize=7,
                    va="center", color="tab:red" if r["broke"] else "black")  # fmt: skip
    ax.set_yticks(range(len(rows)), [r["arm"] for r in reversed(rows)], fontsize=7)
    ax.set_xlabel("final held-out accuracy")
    ax.grid(axis="x", alpha=0.3)
    fig.suptitle(
        _title(title, "final held-out accuracy per arm")
        + "\ndot: mean over seeds, line: its 95% t interval, marks: seeds"
        + f"\nred x: a run that broke (training reward collapsed, or held-out below {broken_below:g})",
        fontsize=9,
    )
    return fig


def fig_delta_sweep(
    evals: pd.DataFrame,
    *,
    param: str = "objective.delta",
    arms: Sequence[str] | None = None,
    score: str | None = None,
    title: str = "",
) -> Figure:
    """Final eval score vs a trust-region size (P-DPPO delta sweep, DRPO Fig. 9-10), one line per arm."""
    score = _score(evals, score)
    if param not in evals.columns:
        raise SkipFigure(f"no {param} column")
    hue = list(arm_columns(evals, exclude=[param]) if arms is None else [a for a in arms if a != param])
    runs = evals.drop_duplicates("run")
    # A preset's own delta (grpo 0.2, dppo 0.15) varies with the objective but is no sweep.
    if runs.groupby(arm_labels(runs, hue))[param].nunique().max() < 2:
        raise SkipFigure(f"no arm has more than one {param} value: no sweep")
    benches = _by_benchmark(evals)
    fig = _figure(1, len(benches))
    for ax, (bench, sub) in zip(fig.axes, benches, strict=True):
        per_run = _per_run_final(sub, score, [*hue, param])
        per_run["label"] = arm_labels(per_run, hue)
        per_run["x"] = pd.to_numeric(per_run[param], errors="coerce")
        colors = _colors(sorted(per_run["label"].unique()))
        for label, rows in per_run.dropna(subset=["x"]).groupby("label", sort=True):
            st = mean_ci(rows.pivot_table(index="x", columns="run", values="final"))
            seeds = sorted(set(st["n"]))
            per = f"{seeds[0]}" if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}"
            ax.plot(st.index, st["mean"], marker="o", color=colors[label], label=f"{label} (n={per} per value)")
            ok = st["n"] >= 2
            ax.vlines(st.index[ok], st["lo"][ok], st["hi"][ok], color=colors[label], alpha=0.6)
            ax.scatter(rows["x"], rows["final"], color=colors[label], s=8, alpha=0.5)
        xs = per_run["x"].dropna()
        if (xs > 0).all() and xs.max() / xs.min() >= 10:
            ax.set_xscale("log")
            ax.minorticks_off()
        ticks = sorted(xs.unique())
        ax.set_xticks(ticks, [f"{v:g}" for v in ticks])
        ax.set_xlabel(param)
        ax.set_ylabel(f"{bench} final {score}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(
        _title(title, f"final {score} vs {param}") + "\nmean over seeds, bars: 95% CI (Student t), dots: seeds"
    )
    return fig


# Figure file stem -> function drawing it from `evals`; the training curves are METRIC_FIGURES, drawn by `draw`.
EVAL_FIGURES: dict[str, Callable[..., Figure]] = {
    "eval_curves": fig_eval_curves,
    "final_scores": fig_final_scores,
    "delta_sweep": fig_delta_sweep,
}


def save_figure(fig: Figure, out_dir: Path | str, stem: str, pdf: bool = False) -> list[Path]:
    """Write `<out_dir>/<stem>.png` (and .pdf); returns the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.png"] + ([out_dir / f"{stem}.pdf"] if pdf else [])
    for path in paths:
        fig.savefig(path, dpi=130)  # constrained layout already fits every label
    return paths


# --- internals ------------------------------------------------------------------------------------------------


def _title(title: str, what: str) -> str:
    return f"{title}: {what}" if title else what


def _figure(rows: int, cols: int, width: float | None = None) -> Figure:
    fig = Figure(figsize=(width or _CELL_W * cols, _CELL_H * rows + 0.8), layout="constrained")
    FigureCanvasAgg(fig)
    fig.subplots(rows, cols, squeeze=False)
    return fig


def _colors(labels: Sequence[str]) -> dict[str, tuple[float, ...]]:
    """A fixed colour per label, in sorted order, so that one experiment's figures agree with each other."""
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(labels) <= 10 else "tab20"]
    return {lab: cmap(i % cmap.N) for i, lab in enumerate(sorted(labels))}


def _has_values(df: pd.DataFrame, column: str | None) -> bool:
    return column is not None and column in df.columns and bool(df[column].notna().any())


def _score(evals: pd.DataFrame, score: str | None) -> str:
    score = score or score_column(evals)
    if score is None or score not in evals.columns or not evals[score].notna().any():
        raise SkipFigure(f"no eval score column ({score or 'avg@k'}) in eval.jsonl")
    return score


def _kind_title(kind: str) -> str:
    return kind.upper() if re.fullmatch(r"aime\d+", kind) else kind


def _eval_panels(evals: pd.DataFrame, score: str) -> list[tuple[str, str, pd.DataFrame]]:
    """(heading, column, rows) per panel: an AIME-style benchmark (its name starts with `aime`) that logs
    `acc/<kind>` gets one panel per kind (acc/<kind> is the avg@n over that kind's problems), headed AIME24, ...;
    any other benchmark one panel of `score`."""
    out = []
    for bench, sub in _by_benchmark(evals):
        kinds = sorted(c for c in sub.columns if c.startswith("acc/") and sub[c].notna().any())
        if bench.lower().startswith("aime") and kinds:
            out += [(_kind_title(c.removeprefix("acc/")), c, sub) for c in kinds]
        elif sub[score].notna().any():
            out.append((bench, score, sub))
    if not out:
        raise SkipFigure(f"no eval values for {score}")
    return out


def _by_benchmark(evals: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    if "benchmark" not in evals.columns or evals["benchmark"].isna().all():
        return [("eval", evals)]
    return [(str(b), sub) for b, sub in evals.groupby("benchmark", sort=True)]


def _per_run_final(evals: pd.DataFrame, score: str, cols: Sequence[str]) -> pd.DataFrame:
    """One row per run: its final score, its config `cols` and the arm label over `cols`."""
    final = final_eval_scores(evals, score)[["run", "final"]]
    config = evals.drop_duplicates("run")[["run", *cols]]
    out = final.merge(config, on="run")
    out["label"] = arm_labels(out, list(cols))
    return out


def _curves(
    panels: list[Panel], *, arms: Sequence[str] | None, x: str, smooth: int, title: str, sigma: float = 0.0
) -> Figure:
    """One mean line (+ band) per arm in each panel. Unfaceted, the panels wrap into rows of up to three; when
    precision is faceted, rows = panels and columns = precisions. `smooth` > 1: a rolling mean over that many
    steps; `sigma` > 0: Gaussian smoothing of each run (the two are exclusive)."""
    if smooth < 1:
        raise ValueError(f"smooth={smooth} is not allowed; use a window of 1 (none) or more steps")
    if sigma < 0 or (sigma > 0 and smooth > 1):
        raise ValueError(f"sigma={sigma} with smooth={smooth}: use sigma >= 0, and either a rolling mean or sigma")
    everything = pd.concat([p.data for p in panels], ignore_index=True)
    if x not in everything.columns:
        raise SkipFigure(f"no {x} column for the x axis")
    arms = list(arm_columns(everything) if arms is None else arms)
    facet = FACET if FACET in arms and len(arms) > 1 and everything[FACET].nunique() > 1 else None
    hue = [a for a in arms if a != facet]
    facets = sorted(everything[facet].astype(str).unique()) if facet else [None]
    colors = _colors(sorted(arm_labels(everything, hue).unique()))

    if facet is None:
        cols = min(len(panels), _MAX_COLS)
        rows = -(-len(panels) // cols)
        fig = _figure(rows, cols)
        for ax in fig.axes[len(panels) :]:
            ax.remove()
        cells = [(panel, None, ax, i == 0) for i, (panel, ax) in enumerate(zip(panels, fig.axes, strict=False))]
    else:
        fig = _figure(len(panels), len(facets))
        grid = np.array(fig.axes).reshape(len(panels), len(facets))
        cells = [(panel, fval, grid[r, c], r == 0) for r, panel in enumerate(panels) for c, fval in enumerate(facets)]
    drawn = 0
    for panel, fval, ax, top in cells:
        sub = panel.data if fval is None else panel.data[panel.data[facet].astype(str) == fval]
        drawn += _draw_arms(ax, sub, panel, hue, x, smooth, sigma, colors)
        ax.set_ylabel(panel.ylabel)
        ax.grid(alpha=0.3)
        if x == "step":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("training step" if x == "step" else x)
        heads = [panel.title] if panel.title else []
        heads += [f"precision = {fval}"] if fval is not None and (top or panel.title) else []
        if heads:
            ax.set_title(", ".join(heads))
        if top and ax.get_lines():
            ax.legend(fontsize=7, framealpha=0.8)
        if panel.hline is not None:  # after the legend test: the line alone is no reason for a legend
            ax.axhline(panel.hline, color="black", linewidth=0.6)
    if drawn == 0:
        raise SkipFigure(f"no values for {' / '.join(p.column for p in panels)}")
    note = "mean over seeds ± 95% CI (Student t)"
    if smooth > 1:
        note += f", rolling mean over {smooth} steps"
    if sigma > 0:
        note += f"\nGaussian-smoothed, σ = {sigma:g} steps (faded: raw)"
    fig.suptitle(f"{title}\n{note}")
    return fig


def gaussian_smooth(values: pd.Series, sigma: float) -> pd.Series:
    """`values` smoothed by `scipy.ndimage.gaussian_filter1d` (sigma in samples, reflected at the ends); NaNs are
    left out of the filter and stay NaN."""
    out = pd.Series(np.nan, index=values.index, dtype=float)
    ok = values.notna()
    if ok.any():
        out[ok] = gaussian_filter1d(values[ok].to_numpy(float), sigma)
    return out


def _draw_arms(
    ax: Axes, sub: pd.DataFrame, panel: Panel, hue: list[str], x: str, smooth: int, sigma: float, colors: dict
) -> int:
    labels = arm_labels(sub, hue)
    columns = [c for c in panel.columns if c in sub.columns]
    values = pd.concat([sub[c] for c in columns]).dropna() if columns else pd.Series(dtype=float)
    positive = len(values) > 0 and bool((values > 0).all())
    if panel.yscale is not None:
        scale = panel.yscale if panel.yscale != "log" or positive else "linear"
    else:  # log only when the values span orders of magnitude (mismatch grows from ~1e-5 to ~1e-2 under fp8)
        scale = "log" if panel.logy and positive and values.max() / values.min() >= 30 else "linear"
    drawn = 0
    for label in sorted(labels.unique()):
        rows = sub[labels == label]
        labelled = False  # the arm's first line carries its legend entry
        for column, style in zip(columns, ("-", "--"), strict=False):
            # pivot_table drops runs without a value for this column, so n counts only seeds that logged it.
            wide = rows.pivot_table(index=x, columns="run", values=column, aggfunc="mean").sort_index()
            if wide.empty:
                continue
            if smooth > 1:
                wide = wide.rolling(smooth, min_periods=1).mean()
            if sigma > 0:
                raw = wide.mean(axis=1)
                ax.plot(raw.index, raw, color=colors[label], linestyle=style, alpha=_RAW_ALPHA, linewidth=0.8)
                wide = wide.apply(gaussian_smooth, sigma=sigma)
            st = mean_ci(wide)
            if scale == "log":  # a t-band can reach below zero, which a log axis cannot show: cut it
                st["lo"] = st["lo"].clip(lower=values.min() / 2)
            n_runs = wide.shape[1]
            marker = "o" if len(st) <= 12 and sigma == 0 else None
            ax.plot(
                st.index,
                st["mean"],
                color=colors[label],
                linestyle=style,
                marker=marker,
                markersize=3,
                label="_nolegend_" if labelled else f"{label} (n={n_runs})",
            )
            if n_runs >= 2:
                ax.fill_between(st.index, st["lo"], st["hi"], color=colors[label], alpha=0.2, linewidth=0)
            drawn += not labelled
            labelled = True
    if drawn and scale != "linear":
        ax.set_yscale(scale)
    return drawn
