"""Figures of the chapter "Routing traces" (``book/routing_traces.ipynb``): one function per figure.

Captions (with provenance) are glued by the chapter with :func:`moesd.plots.caption`.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from moesd.theory.experts import expected_active_experts, expected_active_experts_from_popularity
from moesd.plots import PALETTE
from moesd.predictor.predict import best_gamma
from moesd.routing.traces import RoutingTrace
from moesd.routing.unions import adjacent_overlap, batch_union, popularity, random_union, window_union


def label(name: str, trace: RoutingTrace) -> str:
    """A short label of a trace that says whether its weights were random (or the trace synthetic)."""
    recorded = str(trace.meta.get("weights", ""))
    weights = ("random weights" if recorded.startswith("random") else "synthetic" if recorded.startswith("none")
               else "pretrained")
    return f"{trace.meta.get('model_id', name).split('/')[-1]} on {trace.meta.get('dataset', '?')} ({weights})"


def activation_curves(traces: dict, token_counts=(1, 2, 4, 8, 16, 32, 64)) -> plt.Figure:
    """Activated experts against the token count: Eq. 8, its popularity form, and three measured groupings.

    One panel per trace, stacked so that each keeps the column's full width. Random tokens (:func:`~moesd.routing.unions.random_union`) and consecutive tokens
    (:func:`~moesd.routing.unions.window_union`) are means over layers, with bands spanning the per-layer
    means; decode calls (:func:`~moesd.routing.unions.batch_union`) are one point.

    Parameters
    ----------
    traces : dict
        Name to a :class:`~moesd.routing.traces.RoutingTrace` (decode tokens).
    token_counts : sequence of int
        Token counts of the measured groupings.
    """
    token_counts = np.asarray(token_counts)
    figure, axes = plt.subplots(len(traces), 1, figsize=(6.4, 4.4 * len(traces)), squeeze=False)
    for ax, (name, trace) in zip(axes[:, 0], traces.items()):
        E, K = trace.num_experts, trace.top_k
        shares = popularity(trace).pivot(index="layer", columns="expert", values="probability").to_numpy()
        grid = np.arange(1, token_counts[-1] + 1)
        ax.plot(grid, expected_active_experts(grid, E, K), color="0.2", label="Eq. 8 (uniform, independent)")
        ax.plot(grid, expected_active_experts_from_popularity(grid[:, None], shares).mean(axis=1), color=PALETTE[2],
                ls="--", zorder=5, label="Eq. 8 with measured popularity")
        for statistic, colour, text in [(lambda t: random_union(trace, t, samples=400, seed=0), PALETTE[0],
                                         "random tokens"),
                                        (lambda t: window_union(trace, t), PALETTE[1], "consecutive tokens")]:
            per_layer = np.array([statistic(t).groupby("layer")["union"].mean().to_numpy() for t in token_counts])
            ax.plot(token_counts, per_layer.mean(axis=1), "o-", color=colour, label=text)
            ax.fill_between(token_counts, per_layer.min(axis=1), per_layer.max(axis=1), color=colour, alpha=0.15)
        calls = batch_union(trace)
        ax.plot(calls["tokens"].mean(), calls["union"].mean(), "s", color=PALETTE[3], ms=8,
                label=f"decode calls (batch of {int(calls['tokens'].median())})")
        ax.set(xscale="log", xlabel=r"tokens $t$", ylabel=r"activated experts $N(t)$", ylim=(0, E * 1.05),
               title=f"{label(name, trace)}\n$E$ = {E}, $K$ = {K}")
        ax.legend(loc="upper left")
    figure.tight_layout()
    return figure


def overlap_by_layer(traces: dict) -> plt.Figure:
    """Shared fraction of the top-K of adjacent decode tokens per layer, against independent tokens and K/E."""
    figure, ax = plt.subplots()
    for colour, (name, trace) in zip(PALETTE, traces.items()):
        overlap = adjacent_overlap(trace)
        ax.plot(overlap["layer"], overlap["overlap"], "o-", color=colour, label=label(name, trace))
        ax.plot(overlap["layer"], overlap["independent"], "x:", color=colour, label="  independent tokens")
        ax.axhline(trace.top_k / trace.num_experts, color=colour, lw=0.8, alpha=0.5, label="  uniform $K/E$")
    ax.set(xlabel="layer", ylabel="shared fraction of the top-$K$", ylim=(0, 1.02), title="Adjacent decode tokens")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)
    return figure


def verification_load(predictions, traces: dict) -> plt.Figure:
    """Experts one batched verification loads: measured (dots), the windows prediction and Eq. 8 (lines).

    One panel per trace, stacked; the legend is on the first.

    Parameters
    ----------
    predictions : pandas.DataFrame
        Columns ``trace``, ``B``, ``w``, ``measured``, ``windows``, ``uniform`` (means over layers).
    traces : dict
        Name to trace, for the panel titles.
    """
    figure, axes = plt.subplots(len(traces), 1, figsize=(6.4, 4.0 * len(traces)), squeeze=False)
    for ax, (name, trace) in zip(axes[:, 0], traces.items()):
        for colour, window in zip(PALETTE, sorted(predictions["w"].unique())):
            part = predictions[(predictions["trace"] == name) & (predictions["w"] == window)]
            ax.plot(part["B"], part["measured"], "o", color=colour, label=f"measured, $w$ = {window}")
            ax.plot(part["B"], part["windows"], "-", color=colour, label="  windows prediction")
            ax.plot(part["B"], part["uniform"], ":", color=colour, label="  Eq. 8")
        ax.set(xscale="log", xlabel=r"batch size $B$", ylabel="experts loaded by one verification",
               title=label(name, trace), ylim=(0, trace.num_experts * 1.05))
    axes[0][0].legend(ncol=3, fontsize=7, loc="upper left")
    figure.tight_layout()
    return figure


def routed_speedup(frames: dict, thresholds: dict, traces: dict) -> plt.Figure:
    """Predicted whole-model speedup at the best gamma under three routing models, one panel per trace (stacked).

    Parameters
    ----------
    frames : dict
        ``(trace name, routing model)`` to a :func:`moesd.predictor.predict.predict_sd` frame; routing models
        ``"uniform"``, ``"popularity"``, ``"windows"``.
    thresholds : dict
        Trace name to ``T_thres`` of Eq. 9 (a vertical line).
    traces : dict
        Name to trace, for the panel titles.
    """
    styles = {"uniform": ("0.2", ":", "Eq. 8 (i.i.d. uniform)"), "popularity": (PALETTE[2], "--", "measured popularity"),
              "windows": (PALETTE[1], "-", "measured windows (correlated)")}
    figure, axes = plt.subplots(len(traces), 1, figsize=(6.4, 4.0 * len(traces)), squeeze=False, sharex=True)
    for ax, (name, trace) in zip(axes[:, 0], traces.items()):
        for model, (colour, style, text) in styles.items():
            best = best_gamma(frames[name, model])
            ax.plot(best["batch_size"], best["speedup"], style, color=colour, label=text)
        ax.axvline(thresholds[name], color="0.5", lw=0.8, label=r"$T_\mathrm{thres}$ (Eq. 9)")
        ax.set(xscale="log", xlabel=r"batch size $B$", ylabel=r"predicted speedup at the best $\gamma$",
               title=label(name, trace))
    axes[0][0].legend(loc="lower right")
    figure.tight_layout()
    return figure
