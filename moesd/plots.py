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
