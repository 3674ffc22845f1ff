"""One figure style for the whole book, and the figures of its chapters.

Chapters call :func:`use_style` once. Every figure whose numbers are not the package's pure theory
gets a caption that says where its data came from (the paper's print, a CPU or GPU measurement,
random weights, synthetic acceptance): :func:`caption` glues the provenance text into the chapter's
caption cell (myst-nb ``glue``), so it is part of the page, not of the canvas. A chapter's figure
functions live in a submodule of this package (``moesd.plots.<chapter>``), one function per figure.
"""

from __future__ import annotations

import matplotlib as mpl
import matplotlib.pyplot as plt
from matplotlib.ticker import LogFormatter

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


def caption(name: str, text: str) -> str:
    """Glue ``text`` under ``name`` for a caption cell (``{glue:text}`name```) and return it.

    Parameters
    ----------
    name : str
        The glue key, unique in the book (e.g. ``"fig2_source"``).
    text : str
        The provenance, e.g. :func:`moesd.measure.studies.provenance` of a study's sidecar.
    """
    from moesd.chapter import glue  # myst-nb's glue, recorded for a reader of the notebook in JupyterLab

    glue(name, text, display=False)
    return text


def plain_log_axis(ax) -> None:
    """Label a logarithmic x axis with plain numbers (1, 10, 100; 20, 30, 40 within a decade), not powers."""
    ax.xaxis.set_major_formatter(LogFormatter())
    ax.xaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.4)))


def speedup_heatmap(frame, title: str = "", ax=None, vmax: float | None = None) -> plt.Figure:
    """Predicted speedup over batch size (x, log scale) and draft length (y) of a ``moesd.predictor.predict`` frame.

    Colours are the speedup (1 = no gain; below 1 in red), a white line marks the best gamma per batch
    size. The frame must hold one ``sigma`` and one ``context``.

    Parameters
    ----------
    frame : pandas.DataFrame
        :func:`moesd.predictor.predict.predict_sd` rows (columns ``batch_size``, ``gamma``, ``speedup``).
    title : str
        Panel title.
    ax : matplotlib.axes.Axes, optional
        Where to draw (default: a new figure).
    vmax : float, optional
        Top of the colour scale (default: the frame's largest speedup).
    """
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm

    grid = frame.pivot_table(index="gamma", columns="batch_size", values="speedup", aggfunc="first")
    if ax is None:
        figure, ax = plt.subplots(figsize=(6.4, 3.2))
    else:
        figure = ax.figure
    top = max(vmax or float(np.nanmax(grid.to_numpy())), 1.01)
    norm = TwoSlopeNorm(vmin=min(0.5, float(np.nanmin(grid.to_numpy()))), vcenter=1.0, vmax=top)
    batch, gammas = grid.columns.to_numpy(), grid.index.to_numpy()
    mesh = ax.pcolormesh(_edges(batch, log=True), _edges(gammas), grid.to_numpy(), cmap="RdYlGn", norm=norm,
                         shading="flat")
    ax.plot(batch, gammas[np.nanargmax(grid.to_numpy(), axis=0)], color="white", lw=1.5, label=r"best $\gamma$",
            marker="o" if len(batch) == 1 else None)  # one batch size: a point, not a line
    ax.set(xscale="log", xlabel=r"batch size $B$", ylabel=r"draft length $\gamma$", title=title, yticks=gammas)
    ax.grid(False)
    figure.colorbar(mesh, ax=ax, label="predicted speedup")
    return figure


def _edges(centres, log=False):
    """Cell edges around sorted ``centres``: midpoints (geometric with ``log``), the outer cells as wide as
    their neighbours, and a cell of one unit (a factor of 2 with ``log``) around a single centre."""
    import numpy as np

    x = np.log2(np.asarray(centres, dtype=float)) if log else np.asarray(centres, dtype=float)
    if len(x) == 1:
        inner, first, last = np.array([]), x[0] - 0.5, x[0] + 0.5
    else:
        inner = (x[1:] + x[:-1]) / 2
        first, last = x[0] - (inner[0] - x[0]), x[-1] + (x[-1] - inner[-1])
    edges = np.concatenate([[first], inner, [last]])
    return 2 ** edges if log else edges
