"""Figures of the chapter "SD as engines serve it" (book/serving.ipynb)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from moesd.plots import plain_log_axis


def tree_efficiency(frame: pd.DataFrame) -> plt.Figure:
    """Target efficiency against batch size, one panel per target, one line per tokens verified per sequence.

    Parameters
    ----------
    frame : pandas.DataFrame
        :func:`moesd.predictor.predict.predict_sd` rows with two more columns: ``target`` (the panel) and
        ``verified`` (tokens per sequence in the verification pass, the line).
    """
    targets = list(dict.fromkeys(frame["target"]))
    figure, axes = plt.subplots(1, len(targets), figsize=(6.4, 3.4), sharey=True, squeeze=False)
    for ax, target in zip(axes[0], targets):
        for verified, rows in frame[frame["target"] == target].groupby("verified"):
            rows = rows.sort_values("batch_size")
            ax.plot(rows["batch_size"], rows["target_efficiency"], marker="o", label=f"N = {verified}")
        ax.set(xscale="log", xlabel="batch size $B$", title=target)
        plain_log_axis(ax)
    axes[0][0].set(ylabel="target efficiency $T_T(B,1)/T_T(B,N)$", ylim=(0, 1.05))
    axes[0][0].legend(title="tokens verified")
    figure.tight_layout()
    return figure
