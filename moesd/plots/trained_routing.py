"""Figures of trained routing: skew, Fig. 1a/1b on trained routers, and the popularity-routed forward study.

The first three serve the routing chapter (``book/routing_traces.ipynb``), the last the target-efficiency
chapter's section on popularity routing. Captions (with provenance) are glued by the chapters with
:func:`moesd.plots.caption`.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from moesd.plots import PALETTE

_LINESTYLES = ("-", "--", ":", "-.", (0, (5, 1)), (0, (1, 1)))


def expert_shares(shares: dict, top_k: int, num_experts: int) -> plt.Figure:
    """Each expert's share of a layer's choices, sorted from the most chosen, against uniform routing's ``1/E``.

    Parameters
    ----------
    shares : dict
        Label to a popularity vector ``p`` (summing to ``top_k``); plotted as ``p / top_k``.
    top_k, num_experts : int
        K and E of the vectors.
    """
    figure, ax = plt.subplots(figsize=(6.4, 3.6))
    rank = np.arange(1, num_experts + 1)
    for (label, p), style in zip(shares.items(), _LINESTYLES * 4):
        ax.plot(rank, np.sort(np.asarray(p))[::-1] / top_k, ls=style, label=label)
    ax.axhline(1 / num_experts, color="0.2", lw=1, label=f"uniform, 1/E = 1/{num_experts}")
    ax.set(xlabel="expert, by rank", ylabel="share of the layer's choices", yscale="log")
    ax.legend(ncol=2)
    return figure


def popularity_ratio(curves: pd.DataFrame, tolerance: float) -> plt.Figure:
    """``N_pop(t) / N_Eq8(t)`` against ``t``: one panel per model, a colour per domain, a line style per layer.

    Parameters
    ----------
    curves : pandas.DataFrame
        :func:`moesd.routing.activation.popularity_curves`.
    tolerance : float
        The material reading's threshold (:data:`moesd.paper.fig1.TOLERANCE`), drawn as a line.
    """
    models = list(dict.fromkeys(curves["model"]))
    columns = 2
    rows = -(-len(models) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(6.4, 2.6 * rows), sharex=True, sharey=True, squeeze=False)
    low = min(0.4, float(curves["ratio"].min()) - 0.02)
    for ax, model in zip(axes.ravel(), models):
        part = curves[curves["model"] == model]
        domains, layers = list(dict.fromkeys(part["domain"])), sorted(part["layer"].unique())
        for (domain, layer), line in part.groupby(["domain", "layer"], sort=False):
            ax.plot(line["t"], line["ratio"], color=PALETTE[domains.index(domain) % len(PALETTE)],
                    ls=_LINESTYLES[layers.index(layer) % len(_LINESTYLES)], lw=1.2,
                    label=domain if layer == layers[0] else None)
        ax.axhline(tolerance, color="0.3", lw=0.8, ls=":")
        ax.set(xscale="log", ylim=(low, 1.01), title=f"{model} (layers {', '.join(map(str, layers))})")
        ax.legend(loc="lower left", ncol=2)
    for ax in axes.ravel()[len(models):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel(r"tokens $t$")
    for ax in axes[:, 0]:
        ax.set_ylabel(r"$N_{pop}(t) / N_{Eq. 8}(t)$")
    return figure


def window_activation(curves: pd.DataFrame, popularity: dict, num_experts: int, top_k: int) -> plt.Figure:
    """Measured experts over windows of ``t`` consecutive tokens, per sequence, against Eq. 8 and the popularity model.

    Parameters
    ----------
    curves : pandas.DataFrame
        :func:`moesd.routing.activation.window_curves`: ``layer``, ``sequence``, ``t``, ``measured``.
    popularity : dict
        Layer to its popularity vector.
    num_experts, top_k : int
        E and K.
    """
    from moesd.theory.experts import expected_active_experts, expected_active_experts_from_popularity

    layers = sorted(curves["layer"].unique())
    figure, axes = plt.subplots(2, -(-len(layers) // 2), figsize=(6.4, 4.6), sharex=True, sharey=True,
                                squeeze=False)
    grid = np.arange(1, int(curves["t"].max()) + 1)
    for ax, layer in zip(axes.ravel(), layers):
        ax.plot(grid, expected_active_experts(grid, num_experts, top_k), color="0.2", lw=1.2, label="Eq. 8")
        ax.plot(grid, expected_active_experts_from_popularity(grid, popularity[layer]), color=PALETTE[2], ls="--",
                lw=1.2, label="popularity")
        for index, (sequence, line) in enumerate(curves[curves["layer"] == layer].groupby("sequence")):
            ax.plot(line["t"], line["measured"], color=PALETTE[index % 2 * 3], lw=1.2,
                    label="measured windows" if index == 0 else None)
        ax.set_title(f"layer {layer}")
    for ax in axes[-1]:
        ax.set_xlabel(r"window $t$ (tokens)")
    for ax in axes[:, 0]:
        ax.set_ylabel("activated experts")
    axes[0, 0].legend(loc="upper left")
    return figure


def routing_efficiency(comparison, predicted: pd.DataFrame) -> plt.Figure:
    """Target efficiency of the uniform and the popularity-routed forward study, with the predictor's curves.

    Parameters
    ----------
    comparison : moesd.paper.routing_study.RoutingComparison
        Measured means and standard errors per batch size.
    predicted : pandas.DataFrame
        :func:`moesd.paper.routing_study.predicted_efficiency` rows at the comparison's gamma.
    """
    table = comparison.table
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(6.4, 5.4), sharex=True, height_ratios=(2, 1))
    for column, colour, text in (("uniform", PALETTE[0], "uniform routing"),
                                 ("popularity", PALETTE[1], "popularity routing")):
        top.errorbar(table["batch_size"], table[column], yerr=table[f"{column}_se"], fmt="o-", color=colour,
                     capsize=2, label=f"{text}, measured")
        top.plot(predicted["batch_size"], predicted[column], ls="--", color=colour, lw=1.2,
                 label=f"{text}, predicted")
    top.set(ylabel=rf"$T_T(B,1)/T_T(B,{comparison.gamma + 1})$")
    top.legend(ncol=2)
    bottom.errorbar(table["batch_size"], table["difference"], yerr=3 * table["difference_se"], fmt="o",
                    color="0.3", capsize=2, label="measured (bars: 3 standard errors)")
    bottom.plot(predicted["batch_size"], predicted["difference"], ls="--", color=PALETTE[1], label="predicted")
    bottom.axhline(0, color="0.5", lw=0.8)
    bottom.set(xscale="log", xlabel="batch size $B$", ylabel="popularity - uniform")
    bottom.legend(ncol=2)
    return figure
