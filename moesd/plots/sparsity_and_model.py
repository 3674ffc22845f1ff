"""Figures of the chapter *Sparsity and the fitted model* (the paper's Figs. 4 and 7).

:func:`sparsity_panels` draws Fig. 4 as small multiples (one panel per K and gamma) with the
``x/sqrt(2)`` level of each panel labelled, the repeats under their means; :func:`speedup_model_diagram`
draws Fig. 7, the structure of Algorithm 1 and the fitting method, as boxes and arrows whose boxes are
sized by their text.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from moesd.plots import PALETTE, plain_log_axis


def _run_above(batch_size, value, level) -> tuple[float, float]:
    """First and last batch size of the run of points around the peak with ``value >= level``."""
    lo = hi = int(np.argmax(value))
    while lo > 0 and value[lo - 1] >= level:
        lo -= 1
    while hi < len(value) - 1 and value[hi + 1] >= level:
        hi += 1
    return float(batch_size[lo]), float(batch_size[hi])


def sparsity_panels(frame: pd.DataFrame, predicted=None, title: str = "", repeats: pd.DataFrame | None = None,
                    measured: str = r"measured, $\sigma$-adjusted") -> plt.Figure:
    """Fig. 4 as small multiples: one panel per draft length (rows) and K (columns), B on a log axis.

    Each panel shows the measured speedups (points) of one (K, gamma) curve, the model's prediction
    (line, if given), the level ``x / sqrt(2)`` (dashed, ``x`` the curve's largest value, labelled at
    the panel's right edge) and the run of batch sizes around the peak whose speedup is at or above that
    level (shaded; the range :func:`moesd.paper.curves.half_power_width` measures).
    One colour per K, the same in every row.

    Parameters
    ----------
    frame : pandas.DataFrame
        Columns ``B`` (sequences), ``gamma``, ``K`` and ``speedup`` (dimensionless, e.g. sigma-adjusted):
        one row per point (the mean over repeats, when there are several).
    predicted : array_like, optional
        The model's speedup for each row of ``frame``.
    title : str
        Figure title.
    repeats : pandas.DataFrame, optional
        The single repeats behind the points (columns ``B``, ``gamma``, ``K``, ``speedup``), drawn as
        small light points under them.
    measured : str
        Legend label of the points.
    """
    frame = frame.copy()
    if predicted is not None:
        frame["predicted"] = np.asarray(predicted, dtype=float)
    gammas, ks = sorted(frame["gamma"].unique()), sorted(frame["K"].unique())
    figure, axes = plt.subplots(len(gammas), len(ks), figsize=(2.25 * len(ks) + 0.6, 2.3 * len(gammas) + 1.1),
                                sharex=True, sharey="row", squeeze=False)
    figure.subplots_adjust(wspace=0.32, hspace=0.42)
    for row, gamma in enumerate(gammas):
        for column, k in enumerate(ks):
            ax, colour = axes[row][column], PALETTE[column % len(PALETTE)]
            part = frame[(frame["gamma"] == gamma) & (frame["K"] == k)].sort_values("B")
            if part.empty:
                ax.set_axis_off()
                continue
            level = part["speedup"].max() / math.sqrt(2)
            low, high = _run_above(part["B"].to_numpy(float), part["speedup"].to_numpy(float), level)
            ax.axvspan(low, high, color=colour, alpha=0.12, lw=0)
            ax.axhline(level, color="0.35", ls="--", lw=0.9)
            ax.text(1.01, level, r"$x/\sqrt{2}$", transform=ax.get_yaxis_transform(), ha="left", va="center",
                    fontsize=7, color="0.35")
            if repeats is not None:
                single = repeats[(repeats["gamma"] == gamma) & (repeats["K"] == k)]
                ax.plot(single["B"], single["speedup"], ".", color=colour, ms=4, alpha=0.5, mew=0)
            ax.plot(part["B"], part["speedup"], "o", color=colour, ms=3.2)
            if predicted is not None:
                ax.plot(part["B"], part["predicted"], "-", color="0.15", lw=1.1)
            ax.set_xscale("log")
            plain_log_axis(ax)
            ax.set_title(f"$K = {k}$, $\\gamma = {gamma}$", fontsize=9)
            if row == len(gammas) - 1:
                ax.set_xlabel("batch size $B$")
        axes[row][0].set_ylabel("speedup")
    handles = [Line2D([], [], ls="", marker="o", color="0.4", label=measured),
               Line2D([], [], ls="--", color="0.35", label=r"$x/\sqrt{2}$ ($x$ = the panel's peak)"),
               Patch(color="0.4", alpha=0.25, label=r"range around the peak with speedup $\geq x/\sqrt{2}$")]
    if predicted is not None:
        handles.insert(1, Line2D([], [], color="0.15", label="fitted model (Algorithm 1)"))
    if repeats is not None:
        handles.insert(1, Line2D([], [], ls="", marker=".", color="0.4", alpha=0.45, label="single repeats"))
    figure.legend(handles=handles, loc="lower center", ncol=len(handles), bbox_to_anchor=(0.5, -0.01))
    figure.subplots_adjust(bottom=0.17)
    if title:
        figure.suptitle(title, fontsize=11)
    return figure


DIAGRAM_METHOD = ["Theory\nEqs. 4, 8, 10, 11", "Speedup expression\nwith 10 relaxation\nparameters",
                  "Profile m runs\n$(B, \\gamma, K, E, \\sigma$, speedup$)$", "Least squares\n(TRF, bounds)",
                  "Predict the speedup\nof any workload"]
"""Fig. 7's top row: the modelling method, as the paper draws it."""


def _box(ax, x, y, text, colour, size=8.5):
    """A text box centred at (x, y) in axes fraction, sized by its text (so no text is ever cut)."""
    return ax.text(x, y, text, ha="center", va="center", fontsize=size, transform=ax.transAxes, zorder=3,
                   linespacing=1.35, bbox=dict(boxstyle="round,pad=0.45", facecolor=colour, edgecolor="0.35", lw=0.8))


def _arrow(ax, source, target, start=(1, 0.5), end=(0, 0.5)):
    """An arrow from a point of ``source``'s box to a point of ``target``'s (fractions of each box)."""
    ax.annotate("", xy=end, xycoords=target, xytext=start, textcoords=source, zorder=2,
                arrowprops=dict(arrowstyle="-|>", color="0.3", lw=1.0, shrinkA=2, shrinkB=2))


def speedup_model_diagram() -> plt.Figure:
    """Fig. 7 redrawn: the fitting method (top) and the structure of ``ComputeSpeedup`` (bottom).

    The top row is the paper's Fig. 7 (theory, the speedup expression with relaxation parameters,
    profiling, least squares, prediction). The frame below opens the second box: the inputs, Eq. 8's
    activated experts N(t), Eq. 10's tokens per expert, Eq. 11's roofline growth G, the four stage
    times of Algorithm 1 (verification at ``B gamma`` tokens as the paper writes it) and Eq. 4's
    speedup. Every box is a text bounding box, so its size follows its text.
    """
    from matplotlib.patches import FancyBboxPatch

    figure = plt.figure(figsize=(12.5, 6.2))
    ax = figure.add_axes([0, 0, 1, 1])
    ax.set_axis_off()
    method_colour, theory_colour, stage_colour, out_colour = "#e3eef7", "#fbeed5", "#e6f2ea", "#f6e1e4"
    ax.text(0.5, 0.985, "the method (the paper's Fig. 7)", transform=ax.transAxes, ha="center", va="top",
            fontsize=9, color="0.35", style="italic")
    xs = np.linspace(0.09, 0.91, len(DIAGRAM_METHOD))
    method = [_box(ax, x, 0.87, text, method_colour) for x, text in zip(xs, DIAGRAM_METHOD)]
    for source, target in zip(method, method[1:]):
        _arrow(ax, source, target)
    ax.add_patch(FancyBboxPatch((0.02, 0.02), 0.96, 0.68, boxstyle="round,pad=0.005", transform=ax.transAxes,
                                facecolor="none", edgecolor="0.6", ls="--", lw=0.9))
    ax.text(0.62, 0.665, "inside the speedup expression: Algorithm 1's ComputeSpeedup (App. C)",
            transform=ax.transAxes, ha="center", va="center", fontsize=9, color="0.35", style="italic")
    ax.annotate("", xy=(xs[1], 0.70), xycoords="axes fraction", xytext=(0.5, 0), textcoords=method[1],
                arrowprops=dict(arrowstyle="-|>", color="0.6", lw=1.0, ls="--", shrinkA=2, shrinkB=0))
    inputs = _box(ax, 0.075, 0.40, "inputs\n$B$, $\\gamma$, $K$, $E$, $\\sigma$\nridge point RP", method_colour)
    activated = _box(ax, 0.29, 0.56, "Eq. 8: activated experts\n$N(t) = E\\,(1 - (1 - K/E)^{t})$", theory_colour)
    per_expert = _box(ax, 0.29, 0.40, "Eq. 10: tokens per expert\n$\\bar T(t) = tK / N(t)$", theory_colour)
    growth = _box(ax, 0.29, 0.235, "Eq. 11: roofline growth $G(t;\\lambda\\,\\mathrm{RP}, s)$\n"
                                   "$s^t$ up to $\\lambda\\,\\mathrm{RP}$ tokens, linear after", theory_colour)
    ar = _box(ax, 0.625, 0.56, "ar = bias + $k_1 G(B) + k_2 N(B) + k_3 G(\\bar T(B))$", stage_colour)
    verify = _box(ax, 0.625, 0.43, "verify = the same at $B\\gamma$ tokens", stage_colour)
    draft = _box(ax, 0.625, 0.30, "draft = draft_bias + draft_k $G(B)$", stage_colour)
    reject = _box(ax, 0.625, 0.09, "reject = reject_bias + reject_k $B$", stage_colour)
    result = _box(ax, 0.895, 0.36, "Eq. 4:\nspeedup = $\\sigma(\\gamma+1)\\;$ar / $D$\n"
                                   "$D = \\gamma\\,$draft + verify + reject\n(line 11 prints\n"
                                   "$D$ = draft + ar + verify + reject)", out_colour)
    for target in (activated, per_expert, growth):
        _arrow(ax, inputs, target)
    _arrow(ax, activated, per_expert, start=(0.5, 0), end=(0.5, 1))
    for target in (ar, verify):
        _arrow(ax, activated, target)
        _arrow(ax, per_expert, target)
        _arrow(ax, growth, target)
    _arrow(ax, growth, draft)
    ax.annotate("", xy=(0, 0.5), xycoords=reject, xytext=(0.5, 0), textcoords=inputs, zorder=2,
                arrowprops=dict(arrowstyle="-|>", color="0.3", lw=1.0, shrinkA=2, shrinkB=2,
                                connectionstyle="angle,angleA=-90,angleB=180,rad=0"))
    for source in (ar, verify, draft, reject):
        _arrow(ax, source, result)
    return figure
