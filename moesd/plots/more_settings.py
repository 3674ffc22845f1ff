"""Figures of the chapter *More settings* (the paper's Figs. 5 and 6).

:func:`settings_runs` draws the settings study (one panel per workload: every run and their mean,
with the paper's peak speedup of that workload for reference); :func:`moe_vs_dense` draws the MoE
and dense SD speedups against batch size, one panel per draft length, marking rows that
:func:`moesd.measure.studies.check_rows` flags.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from moesd.plots import PALETTE


def settings_runs(settings: pd.DataFrame, paper_peaks: dict | None = None, title: str = "") -> plt.Figure:
    """Fig. 5: each run of the settings study (thin lines) and their mean (thick), one panel per workload.

    Parameters
    ----------
    settings : pandas.DataFrame
        The settings study: ``setting``, ``dataset``, ``temperature``, ``run``, ``batch_size``,
        ``gamma`` and ``speedup`` (dimensionless).
    paper_peaks : dict, optional
        ``setting -> speedup``: the paper's peak speedup of that workload (Table 1), drawn dotted.
    title : str
        Figure title.
    """
    datasets, temperatures = sorted(settings["dataset"].unique()), sorted(settings["temperature"].unique())
    figure, axes = plt.subplots(len(datasets), len(temperatures), figsize=(4.2 * len(temperatures),
                                3.0 * len(datasets) + 0.6), sharex=True, sharey=True, squeeze=False)
    for row, dataset in enumerate(datasets):
        for column, temperature in enumerate(temperatures):
            ax = axes[row][column]
            part = settings[(settings["dataset"] == dataset) & (settings["temperature"] == temperature)]
            for colour, (gamma, rows) in zip(PALETTE, part.groupby("gamma")):
                for index, (_, run) in enumerate(rows.groupby("run")):
                    run = run.sort_values("batch_size")
                    ax.plot(run["batch_size"], run["speedup"], "-", color=colour, lw=0.8, alpha=0.45,
                            label=f"each run, $\\gamma = {gamma}$" if index == 0 else None)
                mean = rows.groupby("batch_size")["speedup"].mean()
                ax.plot(mean.index, mean.to_numpy(), "o-", color=colour, lw=2.0,
                        label=f"mean of {rows['run'].nunique()} runs, $\\gamma = {gamma}$")
            setting = part["setting"].iloc[0]
            if paper_peaks and setting in paper_peaks:
                ax.axhline(paper_peaks[setting], color="0.3", ls=":", lw=1.2,
                           label="paper's peak speedup (Table 1, 2xA800)")
            sigma = part["sigma_target"].iloc[0]
            ax.set_title(f"{dataset}, $T = {temperature:g}$ ($\\sigma = {sigma:g}$)", fontsize=10)
            if row == len(datasets) - 1:
                ax.set_xlabel("batch size $B$")
        axes[row][0].set_ylabel("speedup")
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=len(labels), bbox_to_anchor=(0.5, 0.0))
    if title:
        figure.suptitle(title, fontsize=11)
    figure.tight_layout(rect=(0, 0.05, 1, 1))
    return figure


def moe_vs_dense(moe: pd.DataFrame, dense: pd.DataFrame, flagged: pd.DataFrame | None = None, beyond: float = 16,
                 title: str = "") -> plt.Figure:
    """Fig. 6: MoE and dense SD speedup against batch size, one panel per draft length.

    Means over repeats are lines, single repeats faint points; rows in ``flagged`` (speedup above
    Eq. 4's ceiling) are circled in red; the range ``B > beyond`` the verdict judges is shaded.

    Parameters
    ----------
    moe, dense : pandas.DataFrame
        e2e-type studies (``batch_size``, ``gamma``, ``run``, ``speedup``).
    flagged : pandas.DataFrame, optional
        Rows of either study to mark (same columns).
    beyond : float
        Left edge of the shaded range (sequences).
    title : str
        Figure title.
    """
    gammas = sorted(set(moe["gamma"]) & set(dense["gamma"]))
    figure, axes = plt.subplots(1, len(gammas), figsize=(3.9 * len(gammas), 3.6), sharey=True, squeeze=False)
    for ax, gamma in zip(axes[0], gammas):
        ax.axvspan(beyond, max(moe["batch_size"].max(), dense["batch_size"].max()), color="0.5", alpha=0.08, lw=0,
                   label=f"$B > {beyond:g}$ (judged)")
        for colour, marker, name, frame in ((PALETTE[0], "o", "MoE (Qwen2-57B-A14B shape)", moe),
                                            (PALETTE[1], "s", "dense (OPT-30B shape)", dense)):
            part = frame[frame["gamma"] == gamma]
            mean = part.groupby("batch_size")["speedup"].mean()
            ax.plot(part["batch_size"], part["speedup"], marker, color=colour, ms=2.5, alpha=0.35)
            ax.plot(mean.index, mean.to_numpy(), "-", marker=marker, color=colour, ms=3.5,
                    label=f"{name}, mean of {part['run'].nunique()} repeats")
        if flagged is not None and not flagged.empty:
            bad = flagged[flagged["gamma"] == gamma]
            ax.plot(bad["batch_size"], bad["speedup"], "o", ms=9, mfc="none", mec="#c0392b", mew=1.2,
                    label=r"repeat above $\sigma(\gamma+1)$")
        ax.axhline(1, color="0.5", lw=0.8)
        ax.set(xlabel="batch size $B$", title=f"$\\gamma = {gamma}$")
    axes[0][0].set_ylabel("speedup")
    handles, labels = [], []
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    figure.legend(handles, labels, loc="lower center", ncol=len(labels), bbox_to_anchor=(0.5, -0.02))
    if title:
        figure.suptitle(title, fontsize=11)
    figure.tight_layout(rect=(0, 0.08, 1, 1))
    return figure


def denominator_terms(terms: pd.DataFrame, title: str = "") -> plt.Figure:
    """Eq. 4's denominator against batch size: the verification, draft and rejection terms stacked.

    Parameters
    ----------
    terms : pandas.DataFrame
        :func:`moesd.measure.analysis.eq4_terms` indexed by ``batch_size`` alone (e.g. pooled over workloads).
    title : str
        Axes title.
    """
    terms = terms.sort_index()
    batch = terms.index.to_numpy(dtype=float)
    figure, ax = plt.subplots(figsize=(6.4, 3.8))
    names = {"verify": r"verification $T_T(B,\gamma+1)/T_T(B,1)$", "draft": r"draft $\gamma T_D(B,1)/T_T(B,1)$",
             "reject": r"rejection $T_{reject}/T_T(B,1)$"}
    ax.stackplot(batch, *(terms[name].to_numpy() for name in names), labels=list(names.values()),
                 colors=PALETTE[:3], alpha=0.8)
    ax.plot(batch, terms["denominator"].to_numpy(), "o", color="0.2", ms=3.5, label="sum: a round in decode steps")
    ax.axhline(1, color="0.5", lw=0.8, ls=":")
    ax.set(xscale="log", xlabel="batch size $B$", ylabel="decode steps", title=title,
           ylim=(0, 1.45 * terms["denominator"].max()))
    ax.legend(loc="upper center", ncol=2)
    return figure
