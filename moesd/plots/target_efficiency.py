"""Figures of the chapter *Target efficiency* (``book/target_efficiency.ipynb``).

Fig. 2 (speedup and target efficiency of the e2e study against B), Fig. 3 (target efficiency of the
forward studies, MoE beside dense) and Eq. 4 evaluated from the forward studies' stage times.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from moesd.plots import PALETTE


def plot_fig2(e2e: pd.DataFrame) -> plt.Figure:
    """Fig. 2: SD speedup (left axis, solid) and target efficiency (right axis, dashed) against B, per gamma.

    Means over repeats of an e2e study (``batch_size``, ``gamma``, ``speedup``, ``target_efficiency``).
    The legend has an entry for each gamma and line kind.
    """
    means = e2e.groupby(["gamma", "batch_size"])[["speedup", "target_efficiency"]].mean().reset_index()
    figure, ax = plt.subplots(figsize=(7.2, 4.2))
    twin = ax.twinx()
    handles = []
    for colour, (gamma, part) in zip(PALETTE, means.groupby("gamma")):
        handles += ax.plot(part["batch_size"], part["speedup"], "o-", color=colour,
                           label=rf"speedup, $\gamma = {gamma}$")
        handles += twin.plot(part["batch_size"], part["target_efficiency"], "s--", color=colour, ms=3, alpha=0.8,
                             label=rf"target efficiency, $\gamma = {gamma}$")
    ax.set(xlabel="batch size $B$", ylabel=r"speedup $T_{AR} / T_{SD}$ (solid)", ylim=(0, None))
    twin.set(ylabel=r"target efficiency $T_T(B,1) / T_T(B,\gamma+1)$ (dashed)", ylim=(0, 1.05))
    twin.spines["right"].set_visible(True)
    twin.grid(False)
    order = handles[0::2] + handles[1::2]
    ax.legend(order, [h.get_label() for h in order], ncol=2, loc="lower center")
    figure.tight_layout()
    return figure


def _panels(tables: dict, column: str, ylabel: str, t_thres: float | None, sharey: bool) -> plt.Figure:
    """One panel per model (``tables``: title -> frame with ``batch_size``, ``gamma``, ``column``, ``low``, ``high``)."""
    figure, axes = plt.subplots(1, len(tables), figsize=(5.4 * len(tables), 3.9), sharey=sharey, squeeze=False)
    for ax, (title, table) in zip(axes[0], tables.items()):
        for colour, (gamma, part) in zip(PALETTE, table.groupby("gamma")):
            ax.plot(part["batch_size"], part[column], "o-", color=colour, label=rf"$\gamma = {gamma}$")
            ax.fill_between(part["batch_size"], part["low"], part["high"], color=colour, alpha=0.15)
        if t_thres is not None and "MoE" in title:
            ax.axvline(t_thres, color="0.4", ls=":", lw=1)
            ax.annotate(r"$T_{thres}$ (Eq. 9)", (t_thres, 0.02), xycoords=("data", "axes fraction"),
                        xytext=(4, 0), textcoords="offset points", fontsize=8, color="0.3")
        ax.set(xlabel="batch size $B$", title=title)
    axes[0][0].set_ylabel(ylabel)
    axes[0][-1].legend(title="median; band: quartiles over repeats")
    figure.tight_layout()
    return figure


def plot_fig3(tables: dict, t_thres: float | None = None) -> plt.Figure:
    """Fig. 3: target efficiency ``T_T(B, 1) / T_T(B, gamma + 1)`` against B, one panel per model.

    ``tables`` maps a panel title to :func:`moesd.measure.analysis.forward_target_efficiency`'s table; a
    title containing "MoE" gets a dotted line at ``t_thres`` (Eq. 9).
    """
    return _panels(tables, "efficiency", r"target efficiency $T_T(B,1) / T_T(B,\gamma+1)$", t_thres, sharey=True)


def plot_forward_speedup(tables: dict, t_thres: float | None = None) -> plt.Figure:
    """Eq. 4 from a forward study's stage times against B, one panel per model.

    ``tables`` maps a panel title to :func:`moesd.measure.analysis.forward_speedup`'s table; a title
    containing "MoE" gets a dotted line at ``t_thres`` (Eq. 9).
    """
    return _panels(tables, "speedup", r"Eq. 4 speedup from forward times", t_thres, sharey=True)
