"""One figure style for the whole book.

Chapters call :func:`use_style` once and :func:`note_provenance` on every figure whose
numbers are not the package's pure theory, so a reader always sees where data came from
(the paper's print, a CPU or GPU measurement, random weights, synthetic acceptance).
"""

from __future__ import annotations

import matplotlib as mpl
import matplotlib.pyplot as plt

PALETTE = ["#1b6ca8", "#d1495b", "#edae49", "#00798c", "#66a182", "#8d5a97", "#30343f", "#e07a5f"]
"""Colour cycle, readable in print and for the common colour-vision deficiencies."""

STYLE = {
    "figure.figsize": (6.4, 4.0),
    "figure.dpi": 100,
    "savefig.dpi": 150,
    "axes.prop_cycle": mpl.cycler(color=PALETTE),
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "lines.linewidth": 1.8,
    "lines.markersize": 4,
}


def use_style() -> None:
    """Apply the book's matplotlib style to every later figure."""
    mpl.rcParams.update(STYLE)


def note_provenance(figure: plt.Figure, text: str) -> None:
    """Write where a figure's data come from in small grey type under it.

    Parameters
    ----------
    figure : matplotlib.figure.Figure
        The figure to label.
    text : str
        E.g. ``"paper, Table 2"`` or ``"CPU, random weights, synthetic acceptance 0.95"``.
    """
    figure.text(0.01, -0.02, f"Data: {text}", fontsize=7, color="0.4", ha="left", va="top")


def plot_speedup_fit(frame, predicted, gammas=None, title: str = "", sharey: bool = True) -> plt.Figure:
    """Measured speedups (points) against a fitted model (lines): one panel per gamma, one colour per K.

    The layout of the paper's Fig. 4 and Figs. 8-28. A dashed line per K marks ``x / sqrt(2)``, ``x`` the
    largest measured speedup of that K (the paper's "range above x/sqrt(2)").

    Parameters
    ----------
    frame : pandas.DataFrame
        Columns ``B``, ``gamma``, ``K`` and ``speedup`` (measured, e.g. sigma-adjusted).
    predicted : array_like
        The model's speedup for each row of ``frame``.
    gammas : sequence of int, optional
        Panels to draw (default: every gamma in ``frame``).
    title : str
        Figure title.
    """
    import numpy as np

    frame = frame.assign(predicted=np.asarray(predicted, dtype=float))
    gammas = sorted(frame["gamma"].unique()) if gammas is None else list(gammas)
    figure, axes = plt.subplots(1, len(gammas), figsize=(5.2 * len(gammas), 3.8), sharey=sharey, squeeze=False)
    for ax, gamma in zip(axes[0], gammas):
        part = frame[frame["gamma"] == gamma]
        for colour, (k, rows) in zip(PALETTE * 2, part.groupby("K")):
            rows = rows.sort_values("B")
            ax.plot(rows["B"], rows["speedup"], "o", color=colour, ms=3.5, label=f"K = {k}")
            ax.plot(rows["B"], rows["predicted"], "-", color=colour, lw=1.3)
            ax.axhline(rows["speedup"].max() / np.sqrt(2), color=colour, ls="--", lw=0.7, alpha=0.6)
        ax.set(xlabel="batch size B", title=f"gamma = {gamma}")
    axes[0][0].set_ylabel("speedup (points: measured, lines: model)")
    axes[0][-1].legend(fontsize=7, ncol=2)
    if title:
        figure.suptitle(title, fontsize=11)
    return figure
