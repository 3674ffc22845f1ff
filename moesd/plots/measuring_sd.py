"""Figures of the chapter *Measuring SD* (``book/measuring_sd.ipynb``): the Eq. 4 check, the regime's GEMM rates and
the step against the activated experts. They draw what :mod:`moesd.measure.checks` computes.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from moesd.plots import PALETTE


def plot_eq4_check(terms: pd.DataFrame, sigma_target: dict) -> plt.Figure:
    """Measured speedup against Eq. 4 of the same windows, measured sigma, and the draft term, against B.

    ``terms`` is :func:`moesd.measure.analysis.eq4_terms`'s table (index reset); ``sigma_target`` maps gamma (int or str) to the sigma the
    synthetic acceptance aimed at.
    """
    figure, axes = plt.subplots(1, 3, figsize=(12.5, 3.8))
    for colour, (gamma, part) in zip(PALETTE, terms.groupby("gamma")):
        label = rf"$\gamma = {gamma}$"
        axes[0].plot(part["batch_size"], part["speedup_eq4"], "-", color=colour, label=f"Eq. 4, {label}")
        axes[0].plot(part["batch_size"], part["speedup"], "o", color=colour, label=f"measured, {label}")
        axes[1].plot(part["batch_size"], part["sigma"], "o-", color=colour, label=f"measured, {label}")
        target = sigma_target.get(gamma, sigma_target.get(str(gamma)))
        axes[1].axhline(target, color=colour, ls="--", lw=1, label=f"target, {label}")
        axes[2].plot(part["batch_size"], part["draft"], "o-", color=colour, label=label)
    axes[0].set(xlabel="batch size $B$", ylabel=r"speedup $T_{AR} / T_{SD}$", title="speedup: measured and Eq. 4")
    axes[1].set(xlabel="batch size $B$", ylabel=r"$\sigma$", title=r"measured $\sigma$ and its target")
    axes[2].set(xlabel="batch size $B$", ylabel=r"$\gamma\, T_D(B, 1) / T_T(B, 1)$", ylim=(0, None),
                title="draft term of Eq. 4")
    axes[0].legend(ncol=2, fontsize=7)
    axes[1].legend(ncol=2, fontsize=7)
    axes[2].legend()
    figure.tight_layout()
    return figure


# ---- Is the study in the paper's regime? ------------------------------------------------------------


def plot_regime_gemm(check) -> plt.Figure:
    """The regime check's GEMM curves: weight bandwidth (left) and seconds (right) against the tokens M.

    One line per real projection (colour) and dtype (solid bf16, dashed float32); on the left, the
    STREAM bandwidth measured in each dtype's run (dotted). ``check`` is a
    :class:`moesd.measure.regime.RegimeCheck`.
    """
    styles = {"bfloat16": "-", "float32": "--"}
    figure, axes = plt.subplots(1, 2, figsize=(11.5, 5.0))
    colours = dict(zip(check.gemm["projection"].unique(), PALETTE))
    for (projection, dtype), part in check.gemm.groupby(["projection", "dtype"], sort=False):
        style = dict(color=colours[projection], ls=styles.get(dtype, "-."), marker="o", ms=3)
        axes[0].plot(part["tokens"], part["weight_bandwidth"] / 1e9, label=f"{projection}, {dtype}", **style)
        axes[1].plot(part["tokens"], 1e3 * part["median_seconds"], **style)
    streams = check.steps.groupby("dtype", sort=False)["bandwidth"].first()
    for dtype, bandwidth in streams.items():
        axes[0].axhline(bandwidth / 1e9, color=PALETTE[6], ls=":" if dtype == "bfloat16" else "-.", lw=1.2,
                        label=f"STREAM, {dtype} run")
    axes[0].set(xscale="log", xlabel="tokens $M$ per product", ylabel="weight bytes / second (GB/s)",
                ylim=(0, None), title="rate a product reads its weight")
    axes[1].set(xscale="log", yscale="log", xlabel="tokens $M$ per product", ylabel="ms per product",
                title="seconds per product")
    for ax in axes:
        ax.set_xticks(sorted(check.gemm["tokens"].unique()))
        ax.set_xticklabels([str(t) for t in sorted(check.gemm["tokens"].unique())])
    figure.tight_layout(rect=(0, 0.2, 1, 1))
    figure.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=8)
    return figure










# ---- What the forward study shows --------------------------------------------------------------------


def plot_step_against_experts(steps: pd.DataFrame, draft_terms: pd.DataFrame, fit: dict | None = None,
                              experts: int | None = None) -> plt.Figure:
    """The target's step against the activated experts (left) and Eq. 4's draft term against B (right).

    Parameters
    ----------
    steps : pandas.DataFrame
        :func:`step_against_experts`'s table.
    draft_terms : pandas.DataFrame
        ``batch_size``, ``gamma``, ``draft_term`` (:func:`moesd.measure.analysis.forward_speedup`).
    fit : dict, optional
        :func:`expert_cost_fit`'s result: its line at each batch size is drawn.
    experts : int, optional
        E, marked on the left panel.
    """
    figure, axes = plt.subplots(1, 2, figsize=(11.0, 3.9))
    ax = axes[0]
    ms = 1e3 * steps[["target_s", "target_low", "target_high"]]
    ax.errorbar(steps["activated_experts"], ms["target_s"],
                yerr=[ms["target_s"] - ms["target_low"], ms["target_high"] - ms["target_s"]], fmt="o",
                color=PALETTE[0], label=r"measured $T_T(B, 1)$ (median, quartiles)")
    if fit is not None:
        line = fit["fixed_s"] + fit["per_expert_s"] * steps["activated_experts"] + fit["per_token_s"] * steps.index
        ax.plot(steps["activated_experts"], 1e3 * line, "x", color=PALETTE[1], label="least-squares fit")
    for batch in (1, 4, 8, 16, 32, 100):
        if batch in steps.index:
            ax.annotate(f"B={batch}", (steps.loc[batch, "activated_experts"], ms.loc[batch, "target_s"]),
                        textcoords="offset points", xytext=(-6, 7), fontsize=7, ha="right")
    if experts:
        ax.axvline(experts, color=PALETTE[6], ls=":", lw=1, label=f"E = {experts}")
    ax.set(xlabel="activated experts per layer, measured $N(B)$", ylabel="ms per decode step", ylim=(0, None),
           title="target decode step")
    ax.legend(loc="upper left")
    for colour, (gamma, part) in zip(PALETTE, draft_terms.groupby("gamma")):
        axes[1].plot(part["batch_size"], part["draft_term"], "o-", color=colour, label=rf"$\gamma = {gamma}$")
    axes[1].set(xlabel="batch size $B$", ylabel=r"$\gamma\, T_D(B, 1) / T_T(B, 1)$", ylim=(0, None),
                title="draft term of Eq. 4")
    axes[1].legend()
    figure.tight_layout()
    return figure


# ---- Measuring afresh --------------------------------------------------------------------------------

