"""Figures of the chapter *Measuring speculative decoding* (``book/measuring_sd.ipynb``), and the tables behind them.

:func:`step_budget` sets a measured decode step beside the time its weights take to stream at the
measured bandwidth; :func:`eq4_terms` splits each e2e point's Eq. 4 into its draft, verification and
rejection terms. The two ``plot_`` functions draw them.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from moesd.plots import PALETTE


def step_budget(forward: pd.DataFrame, sidecar: dict) -> pd.DataFrame:
    """A forward study's decode steps beside the time their bytes take to stream from memory.

    For the target and the draft of the study (shapes, layers, width and KV length from the sidecar's
    ``settings``) and every batch size: the measured step ``T(B, 1)`` (median over repeats and its
    quartiles), the bytes a step must read (:func:`moesd.hardware.step_cost`: weights, the ``N(B)``
    experts of Eq. 8 per MoE layer, KV cache) and the seconds those bytes take at two rates from the
    sidecar's measured roofline: the STREAM bandwidth (the floor) and the rate at which a matrix-vector
    product (the GEMM curve at M = 1) reads its weight.

    Parameters
    ----------
    forward : pandas.DataFrame
        A forward study (``run``, ``role``, ``batch_size``, ``tokens``, ``seconds``).
    sidecar : dict
        Its sidecar, with ``settings`` and a measured roofline (``hardware``, ``roofline_measurement``).

    Returns
    -------
    pandas.DataFrame
        Columns ``role``, ``model``, ``batch_size``, ``measured_s`` (s), ``low_s``, ``high_s``,
        ``bytes`` (read per step), ``expert_bytes`` (the routed experts' part of them), ``active_experts``
        (per MoE layer), ``moe_layers``, ``stream_s`` (bytes / STREAM bandwidth, s),
        ``gemv_s`` (bytes / the M = 1 weight rate, s), ``stream_share`` and ``gemv_share`` (of
        ``measured_s``).
    """
    from moesd.hardware import RooflineMeasurement, step_cost

    settings = sidecar["settings"]
    roofline = RooflineMeasurement.from_sidecar(sidecar)
    gemv_rate = float(roofline.gemm.loc[roofline.gemm["tokens"] == 1, "weight_bandwidth"].iloc[0])
    bytes_per_value = {"float32": 4, "bfloat16": 2, "float16": 2}[settings["dtype"]]
    steps = forward[forward["tokens"] == 1].groupby(["role", "batch_size"])["seconds"]
    parts = []
    for role, model, layers in (("target", settings["target"], settings["layers"]),
                                ("draft", settings["draft"], settings["draft_layers"])):
        measured = steps.median()[role]
        cost = step_cost(model, measured.index, layers, settings["width"], settings["context"], bytes_per_value)
        parts.append(pd.DataFrame({
            "role": role, "model": model, "batch_size": measured.index.to_numpy(),
            "measured_s": measured.to_numpy(), "low_s": steps.quantile(0.25)[role].to_numpy(),
            "high_s": steps.quantile(0.75)[role].to_numpy(), "bytes": cost["bytes"].to_numpy(),
            "expert_bytes": cost["expert_bytes"].to_numpy(), "active_experts": cost["active_experts"].to_numpy(),
            "moe_layers": cost["moe_layers"].to_numpy(),
            "stream_s": cost["bytes"].to_numpy() / roofline.hardware.memory_bandwidth,
            "gemv_s": cost["bytes"].to_numpy() / gemv_rate}))
    budget = pd.concat(parts, ignore_index=True)
    budget["stream_share"] = budget["stream_s"] / budget["measured_s"]
    budget["gemv_share"] = budget["gemv_s"] / budget["measured_s"]
    return budget


def eq4_terms(e2e: pd.DataFrame) -> pd.DataFrame:
    """Eq. 4's terms for each e2e point, averaged over repeats.

    Eq. 4 reads ``speedup = sigma (gamma + 1) / (draft + verify + reject)`` with ``draft = gamma T_D(B, 1) /
    T_T(B, 1)``, ``verify = T_T(B, gamma) / T_T(B, 1)`` and ``reject = T_reject / T_T(B, 1)``, ``T_T(B, 1)``
    the AR step (:func:`moesd.speedup.speedup_terms` with ``T_T(B, 1) = t_ar``, as the ``speedup_eq4`` column).

    Returns
    -------
    pandas.DataFrame
        One row per (gamma, batch size): ``gamma``, ``batch_size``, ``sigma``, ``draft``, ``verify``,
        ``reject``, ``speedup`` (measured), ``speedup_eq4``, ``target_efficiency``; means over repeats.
    """
    from moesd.speedup import speedup_terms

    terms = speedup_terms(e2e["sigma"], e2e["gamma"], e2e["t_ar"], e2e["t_target_gamma"], e2e["t_draft"],
                          e2e["t_reject"])
    rows = e2e[["gamma", "batch_size", "sigma", "speedup", "speedup_eq4", "target_efficiency"]].assign(
        draft=np.asarray(terms.draft), verify=np.asarray(terms.verify), reject=np.asarray(terms.reject))
    columns = ["sigma", "draft", "verify", "reject", "speedup", "speedup_eq4", "target_efficiency"]
    return rows.groupby(["gamma", "batch_size"])[columns].mean().reset_index()


def plot_step_budget(budget: pd.DataFrame) -> plt.Figure:
    """Measured decode steps against their weight-streaming time: one panel for the target, one for the draft.

    ``budget`` is :func:`step_budget`'s table.
    """
    figure, axes = plt.subplots(1, 2, figsize=(10.5, 3.8))
    for ax, (role, part) in zip(axes, budget.groupby("role", sort=False)):
        ms = {column: 1e3 * part[column] for column in ("measured_s", "low_s", "high_s", "stream_s", "gemv_s")}
        ax.plot(part["batch_size"], ms["measured_s"], "o-", color=PALETTE[0], label=r"measured $T(B, 1)$")
        ax.fill_between(part["batch_size"], ms["low_s"], ms["high_s"], color=PALETTE[0], alpha=0.2)
        ax.plot(part["batch_size"], ms["gemv_s"], "--", color=PALETTE[1],
                label="bytes / matrix-vector weight rate")
        ax.plot(part["batch_size"], ms["stream_s"], ":", color=PALETTE[3], label="bytes / STREAM bandwidth")
        ax.set(xlabel="batch size $B$", ylabel="ms per decode step", ylim=(0, None),
               title=f"{role} ({part['model'].iloc[0]} shape)")
    axes[0].legend(loc="upper left")
    figure.tight_layout()
    return figure


def plot_eq4_check(terms: pd.DataFrame, sigma_target: dict) -> plt.Figure:
    """Measured speedup against Eq. 4 of the same windows, measured sigma, and the draft term, against B.

    ``terms`` is :func:`eq4_terms`'s table; ``sigma_target`` maps gamma (int or str) to the sigma the
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
