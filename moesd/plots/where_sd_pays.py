"""Figures of the chapter "Where SD pays" (``book/where_sd_pays.ipynb``): one function per figure.

Each takes frames the chapter computed with :mod:`moesd.predictor.predict` and returns the figure; captions
(with provenance) are glued by the chapter with :func:`moesd.plots.caption`.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from moesd.plots import PALETTE, speedup_heatmap
from moesd.predictor.predict import best_gamma


def printed_vs_predicted(comparison) -> plt.Figure:
    """Predicted peak speedup against the paper's printed ``x``, one colour per device.

    Parameters
    ----------
    comparison : pandas.DataFrame
        :func:`moesd.paper.predictor_check.paper_comparison` rows (``device``, ``printed``, ``predicted``).
    """
    figure, ax = plt.subplots(figsize=(4.8, 4.2))
    for colour, (device, rows) in zip(PALETTE, comparison.groupby("device")):
        ax.plot(rows["printed"], rows["predicted"], "o", color=colour, label=device.replace("x", r"$\times$"))
    line = np.array([1.0, comparison["predicted"].max()])
    ax.plot(line, line, color="0.5", lw=1, ls="--", label="predicted = printed")
    ax.set(xlabel=r"printed peak speedup $x$ (paper)", ylabel="predicted peak speedup",
           title="Qwen2-57B-A14B + Qwen2-0.5B, Tables 1-2")
    ax.legend(loc="upper left")
    return figure


def modern_heatmaps(frames: dict, context: int) -> plt.Figure:
    """Predicted speedup over (B, gamma), one panel per setup, the best gamma per B as a white line.

    Parameters
    ----------
    frames : dict
        ``(model, hardware, tp, dtype)`` to a :func:`moesd.predictor.predict.predict_sd` frame.
    context : int
        The context of the rows to draw (tokens).
    """
    figure, axes = plt.subplots(len(frames), 1, figsize=(6.4, 2.8 * len(frames)), constrained_layout=True)
    for ax, ((model, hardware, tp, dtype), frame) in zip(np.atleast_1d(axes), frames.items()):
        speedup_heatmap(frame[frame["context"] == context], ax=ax,
                        title=rf"{model} on {tp} $\times$ {hardware} ({dtype})")
        ax.set(xlabel=r"batch size $B$", ylabel=r"draft length $\gamma$")
        ax.get_lines()[-1].set_label(r"best $\gamma$ per $B$")
        ax.legend(loc="lower left", fontsize=7, frameon=True, facecolor="0.4", labelcolor="white")
    return figure


def best_gamma_curves(frames: dict, title: str = "") -> plt.Figure:
    """Speedup at the best gamma against the batch size, one line per labelled frame.

    Parameters
    ----------
    frames : dict
        Label to a :func:`moesd.predictor.predict.predict_sd` frame.
    title : str
        Axes title.
    """
    figure, ax = plt.subplots()
    for colour, (label, frame) in zip(PALETTE * 2, frames.items()):
        best = best_gamma(frame)
        ax.plot(best["batch_size"], best["speedup"], color=colour, label=label)
    ax.axhline(1, color="0.5", lw=1, ls=":", label="no speedup")
    ax.set(xscale="log", xlabel=r"batch size $B$", ylabel=r"speedup at the best $\gamma$", title=title)
    ax.legend(fontsize=7)
    return figure


def calibration(fits: dict) -> plt.Figure:
    """Calibrated model (lines) against measured step times (dots; filled: held out), one panel per model.

    Parameters
    ----------
    fits : dict
        Role (``"target"``, ``"draft"``) to a :class:`moesd.model.calibrate.Calibration`.
    """
    figure, axes = plt.subplots(1, len(fits), figsize=(5.2 * len(fits), 3.8), squeeze=False)
    for ax, (role, fit) in zip(axes[0], fits.items()):
        for colour, (s, rows) in zip(PALETTE, fit.table.groupby("tokens")):
            held = rows[rows["held_out"]]
            ax.plot(rows["batch_size"], 1e3 * rows["predicted"], "-", color=colour, lw=1.2, label=f"$s$ = {s}")
            ax.plot(rows["batch_size"], 1e3 * rows["measured"], "o", color=colour, mfc="none")
            ax.plot(held["batch_size"], 1e3 * held["measured"], "o", color=colour)
        ax.set(xlabel=r"batch size $B$", ylabel=r"$T(B, s)$ in ms", title=f"{role}: model (lines), measured (dots)")
    axes[0][0].legend(ncol=2)
    return figure
