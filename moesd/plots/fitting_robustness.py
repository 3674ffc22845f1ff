"""Figures of the chapter *Fitting robustness* (Appendix C of the paper: Algorithm 1, Figs. 8-28, Table 3).

Every function takes the tables of :mod:`moesd.model.diagnostics` and :mod:`moesd.paper.sparsity_verdicts` and returns a figure;
the chapter glues the captions (:func:`moesd.plots.caption`).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D
from matplotlib.ticker import FormatStrFormatter

from moesd.plots import PALETTE, plain_log_axis


def _k_legend(figure: plt.Figure, ks, measured: str = "measured", model: str = "fitted", **where) -> None:
    """One legend for a figure: a colour per K, and what points and lines are."""
    handles = [Line2D([], [], color=PALETTE[i % len(PALETTE)], lw=2, label=f"$K = {k:g}$") for i, k in enumerate(ks)]
    handles += [Line2D([], [], color="0.3", ls="", marker="o", ms=4, label=measured),
                Line2D([], [], color="0.3", lw=1.3, label=model)]
    figure.legend(handles=handles, ncol=len(handles), frameon=False, fontsize=8,
                  **({"loc": "lower center", "bbox_to_anchor": (0.5, 1.0)} | where))


def mse_against_m(ours, paper, label_ours: str = "this project", label_paper: str = "paper, Table 3") -> plt.Figure:
    """MSE of each fit against its number of measurements m: this project's and the paper's, on separate axes.

    Parameters
    ----------
    ours, paper : pandas.DataFrame
        :attr:`moesd.paper.criteria.Verdict.numbers` of :func:`moesd.paper.sparsity_verdicts.poor_coverage_worst_fits`:
        columns ``m``, ``mse`` (over every point of its study; dimensionless: squared speedup), ``poor`` (the sample leaves a longer
        run of batch sizes out than an even spread would) and ``judged`` (m above the parameter count).
        Poorly covering, unjudged and worst samples are labelled with their m.
    """
    figure, axes = plt.subplots(1, 2, figsize=(9.0, 3.2))
    for ax, table, title, colour in ((axes[0], ours, label_ours, PALETTE[0]), (axes[1], paper, label_paper, PALETTE[1])):
        ax.plot(table["m"], table["mse"], "-", color=colour, lw=1.0, alpha=0.6)
        poor = table["poor"].astype(bool)
        ax.plot(table.loc[~poor, "m"], table.loc[~poor, "mse"], "o", color=colour, label="even coverage")
        ax.plot(table.loc[poor, "m"], table.loc[poor, "mse"], "s", mfc="white", mec=colour, mew=1.5, ms=6,
                label="poor coverage")
        marked = poor | ~table["judged"].astype(bool) | (table["mse"] == table["mse"].max())
        for row in table[marked].itertuples():
            ax.annotate(f"$m = {row.m}$", (row.m, row.mse), textcoords="offset points", xytext=(6, 2), fontsize=8)
        ax.set(xscale="log", xlabel="measurements fitted $m$", ylabel="MSE over every point", title=title)
        plain_log_axis(ax)
        ax.legend(loc="upper right")
    figure.tight_layout()
    return figure


def residuals_against_b(table) -> plt.Figure:
    """Residuals (predicted minus measured speedup) against B (log axis): one panel per gamma, a colour per K.

    Parameters
    ----------
    table : pandas.DataFrame
        :func:`moesd.model.diagnostics.residual_table` (columns ``K``, ``gamma``, ``B``, ``residual``, ``fitted``).
    """
    gammas, ks = sorted(table["gamma"].unique()), sorted(table["K"].unique())
    figure, axes = plt.subplots(1, len(gammas), figsize=(4.5 * len(gammas), 3.2), sharey=True, squeeze=False)
    for ax, gamma in zip(axes[0], gammas):
        for i, k in enumerate(ks):
            rows = table[(table["gamma"] == gamma) & (table["K"] == k)].sort_values("B")
            colour = PALETTE[i % len(PALETTE)]
            ax.plot(rows["B"], rows["residual"], "-", color=colour, lw=1.0)
            fitted = rows[rows["fitted"]]
            ax.plot(fitted["B"], fitted["residual"], "o", color=colour, ms=5)
        ax.axhline(0, color="0.2", lw=0.8)
        ax.set(xlabel="batch size $B$", title=f"$\\gamma = {gamma:g}$", xscale="log")
        plain_log_axis(ax)
    axes[0][0].set_ylabel("predicted $-$ measured speedup")
    handles = [Line2D([], [], color=PALETTE[i % len(PALETTE)], lw=2, label=f"$K = {k:g}$") for i, k in enumerate(ks)]
    handles.append(Line2D([], [], color="0.3", ls="", marker="o", ms=5, label="fitted point"))
    figure.legend(handles=handles, ncol=len(handles), frameon=False, fontsize=8, loc="lower center",
                  bbox_to_anchor=(0.5, 1.0))
    figure.tight_layout()
    return figure


def stage_time_ratios(table, gamma: int) -> plt.Figure:
    """Fitted against measured stage times over a decode step, against B (log axis), at one gamma.

    Panels: the draft step, the verification, the rejection and the round's cost outside the
    verification (``gamma draft + reject``, when the table has it). Draft, rejection and that sum on
    log scales (they span decades), the verification on a linear one. A log axis starts at a tenth of
    the smallest measured value: a fitted term at or near zero lies below it (the panel says so).

    Parameters
    ----------
    table : pandas.DataFrame
        :func:`moesd.model.diagnostics.compare_stage_times` (``B``, ``gamma``, ``K``, ``<stage>_fitted``,
        ``<stage>_measured``; dimensionless ratios to the decode step).
    gamma : int
        The draft length shown.
    """
    stages = [s for s in ("draft", "verify", "reject", "overhead") if f"{s}_fitted" in table]
    rows = table[table["gamma"] == gamma]
    ks = sorted(rows["K"].unique())
    names = {"draft": "draft step", "verify": f"verification ($\\gamma = {gamma:g}$)", "reject": "rejection",
             "overhead": "$\\gamma\\,$draft + rejection"}
    figure, axes = plt.subplots(1, len(stages), figsize=(3.3 * len(stages), 3.0), squeeze=False)
    for ax, stage in zip(axes[0], stages):
        for i, k in enumerate(ks):
            part = rows[rows["K"] == k].sort_values("B")
            colour = PALETTE[i % len(PALETTE)]
            ax.plot(part["B"], part[f"{stage}_measured"], "o", color=colour, ms=3)
            ax.plot(part["B"], part[f"{stage}_fitted"], "-", color=colour, lw=1.3)
        ax.set(xlabel="batch size $B$", title=names[stage], xscale="log")
        plain_log_axis(ax)
        if stage != "verify":  # draft and rejection span decades; verification lies within one
            measured = rows[f"{stage}_measured"]
            floor = measured[measured > 0].min() / 10
            top = max(measured.max(), rows[f"{stage}_fitted"].max()) * 2
            ax.set_yscale("log")
            ax.set_ylim(floor, top)
            ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
            if (rows[f"{stage}_fitted"] < floor).any():
                ax.text(0.03, 0.04, "fitted: below the axis", transform=ax.transAxes, fontsize=7, color="0.35")
    axes[0][0].set_ylabel("time / decode step")
    _k_legend(figure, ks, measured="measured", model="fitted")
    figure.tight_layout()
    return figure


def fit_grid(frame, fits, fits_per_row: int = 1, panel: tuple = (2.6, 1.9)) -> plt.Figure:
    """Measured speedups (points) and fitted models (lines), a colour per K: one panel per fit and gamma.

    The layout of the paper's Figs. 8-28, compact, B on a log axis: each fit takes one row of panels (one per gamma),
    ``fits_per_row`` fits side by side.

    Parameters
    ----------
    frame : pandas.DataFrame
        Columns ``B``, ``gamma``, ``K`` and ``speedup`` (measured).
    fits : sequence of (str, array_like)
        A title (e.g. ``"$m = 21$"``) and the predicted speedup of each row of ``frame``, per fit.
    fits_per_row : int
        Fits drawn side by side.
    panel : (float, float)
        Width and height of one panel (inches).
    """
    gammas, ks = sorted(frame["gamma"].unique()), sorted(frame["K"].unique())
    rows = int(np.ceil(len(fits) / fits_per_row))
    columns = fits_per_row * len(gammas)
    figure, axes = plt.subplots(rows, columns, figsize=(panel[0] * columns, panel[1] * rows), sharex=True,
                                sharey=True, squeeze=False)
    for ax in axes.flat[len(fits) * len(gammas):]:
        ax.set_visible(False)
    for index, (title, predicted) in enumerate(fits):
        data = frame.assign(predicted=np.asarray(predicted, dtype=float))
        for j, gamma in enumerate(gammas):
            ax = axes[index // fits_per_row][(index % fits_per_row) * len(gammas) + j]
            part = data[data["gamma"] == gamma]
            for i, k in enumerate(ks):
                curve = part[part["K"] == k].sort_values("B")
                colour = PALETTE[i % len(PALETTE)]
                ax.plot(curve["B"], curve["speedup"], "o", color=colour, ms=2.2)
                ax.plot(curve["B"], curve["predicted"], "-", color=colour, lw=1.0)
            ax.set_title(f"{title}, $\\gamma = {gamma:g}$", fontsize=9)
            ax.set_xscale("log")
            plain_log_axis(ax)
            ax.tick_params(labelsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("batch size $B$", fontsize=9)
    for ax in axes[:, 0]:
        ax.set_ylabel("speedup", fontsize=9)
    _k_legend(figure, ks)
    figure.tight_layout()
    return figure
