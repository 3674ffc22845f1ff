"""Figures of the theory chapters: speculative decoding, expert activation and rooflines.

One function per figure; each returns the figure and draws only what the package computes (or what
its arguments hold: the paper's tables, a measured roofline), so a chapter's visible cell is the call.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from moesd.plots import PALETTE

_LINESTYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1)))


def sigma_curves(gammas=(1, 2, 3, 4, 6, 8)) -> plt.Figure:
    """Eq. 5: the emitted fraction ``sigma`` against the acceptance probability ``alpha``, one line per gamma."""
    from moesd.theory.speedup import sigma

    alpha = np.linspace(0, 1, 201)
    figure, ax = plt.subplots()
    for gamma in gammas:
        ax.plot(alpha, sigma(alpha, gamma), label=f"$\\gamma$ = {gamma}")
    ax.set(xlabel="per-token acceptance probability $\\alpha$", ylabel="$\\sigma$ (Eq. 5)",
           title="Emitted fraction of the $\\gamma+1$ possible tokens per round")
    ax.legend(title="draft length")
    return figure


def speedup_against_efficiency(sigma: float = 0.90, gamma: int = 4, draft_costs=(0.0, 0.05, 0.1),
                               reference: tuple[float, str] | None = None) -> plt.Figure:
    """Eq. 4 against target efficiency at fixed ``sigma`` and ``gamma``, one line per draft cost ``T_D/T_T``.

    Parameters
    ----------
    sigma, gamma : float, int
        Acceptance (emitted fraction) and draft length.
    draft_costs : sequence of float
        ``T_D(B,1) / T_T(B,1)`` (dimensionless).
    reference : (float, str), optional
        A speedup to mark with a dotted line, and its legend label.
    """
    from moesd.theory.speedup import speedup

    efficiency = np.linspace(1 / (gamma + 1), 1, 200)  # from a verification that costs gamma + 1 decode steps
    figure, ax = plt.subplots()
    for draft_cost in draft_costs:
        ax.plot(efficiency, speedup(sigma, gamma, 1.0, 1.0 / efficiency, draft_cost),
                label=f"$T_D/T_T$ = {draft_cost:g}")
    ax.axhline(1.0, color="0.5", lw=1, ls="--", label="no gain")
    if reference is not None:
        ax.axhline(reference[0], color="0.3", lw=1, ls=":", label=reference[1])
    ax.set(xlabel="target efficiency $T_T(B,1)/T_T(B,\\gamma+1)$", ylabel="speedup (Eq. 4)",
           title=f"Speedup at $\\sigma$ = {sigma:g}, $\\gamma$ = {gamma}")
    ax.legend()
    return figure


def efficiency_bounds(tables) -> plt.Figure:
    """Lower bounds on target efficiency implied by the paper's peak speedups, per device and table.

    ``tables`` holds ``device``, ``table``, ``gamma`` and ``min target efficiency`` (one row per printed
    peak); the points of each device are shifted sideways a little so that they do not hide each other.
    """
    groups = list(tables.groupby(["device", "table"]))
    offsets = np.linspace(-0.2, 0.2, len(groups))
    markers = "osD^v<>p"
    figure, ax = plt.subplots()
    for (key, group), offset, colour, marker in zip(groups, offsets, PALETTE, markers * 2):
        ax.scatter(group["gamma"] + offset, group["min target efficiency"], s=18, color=colour, marker=marker,
                   label=f"{key[0]} (Table {key[1]})")
    gammas = np.array(sorted(tables["gamma"].unique()))
    ax.plot(gammas, 1 / (gammas + 1), "k_", ms=22, mew=1.5, label="$1/(\\gamma+1)$ (time grows with positions)")
    ax.set(xlabel="$\\gamma$", ylabel="lower bound on target efficiency", xticks=gammas, ylim=(0, 1.05),
           title="Verification cost implied by the paper's peak speedups")
    ax.legend(loc="lower left", ncol=2)
    return figure


def activated_fraction(models, max_tokens: int = 128) -> plt.Figure:
    """Eq. 8: the expected activated fraction ``N(t)/E`` against tokens, with ``T_thres`` marked.

    ``models`` holds ``model``, ``E``, ``K`` and ``T_thres`` (one row per MoE).
    """
    from moesd.theory.experts import expected_active_experts

    tokens = np.arange(0, max_tokens + 1)
    figure, ax = plt.subplots()
    for (_, row), colour in zip(models.iterrows(), PALETTE):
        E, K, threshold = int(row["E"]), int(row["K"]), int(row["T_thres"])
        ax.plot(tokens, expected_active_experts(tokens, E, K) / E, color=colour,
                label=f"{row['model']} ($K/E$ = {K}/{E}), $T_{{thres}}$ = {threshold}")
        ax.plot(threshold, expected_active_experts(threshold, E, K) / E, "o", color=colour)
    ax.axhline(0.95, color="0.5", lw=1, ls=":")
    ax.set(xlabel="tokens in the forward pass $t$", ylabel="activated fraction $N(t)/E$",
           title="Expected activated experts (Eq. 8); dots: $T_{thres}$ (Eq. 9)")
    ax.legend(loc="lower right")
    return figure


def normalised_tokens_per_expert(token_counts=(4, 16, 64, 256, 1024), marks=None) -> plt.Figure:
    """Fig. 1c: ``T_exp(T; rho) / T`` against ``rho``, one line per ``T``; ``marks`` names sparsities to mark."""
    from moesd.theory.experts import tokens_per_expert

    rho = np.logspace(-3, 0, 400)
    figure, ax = plt.subplots()
    for T, style in zip(token_counts, _LINESTYLES * 2):
        ax.plot(rho, tokens_per_expert(T, rho) / T, ls=style, label=f"$T$ = {T}")
    for name, value in (marks or {}).items():
        ax.axvline(value, color="0.6", lw=0.8, ls="--")
        ax.text(value * 0.93, 0.62, name, rotation=90, fontsize=7, ha="right", va="center", color="0.35")
    ax.set(xscale="log", xlabel="sparsity $\\rho = K/E$", ylabel="$\\overline{T}_{exp}(T;\\rho)\\,/\\,T$",
           title="Normalised tokens per activated expert (Fig. 1c)")
    ax.legend(loc="upper left")
    return figure


def threshold_against_k(E: int = 64, K=np.arange(1, 33), taus=(0.95, 0.99)) -> plt.Figure:
    """Eq. 9: ``T_thres`` against ``K`` for ``E`` experts, one line per fraction ``tau``."""
    from moesd.theory.experts import full_activation_threshold

    K = np.asarray(K)
    figure, ax = plt.subplots()
    for tau, style in zip(taus, _LINESTYLES):
        ax.step(K, full_activation_threshold(K / E, tau=tau), where="mid", ls=style,
                label=f"$T_{{thres}}$, $\\tau$ = {tau:g}")
    ticks = [k for k in (1, 2, 4, 8, 16, 32, 64) if K.min() <= k <= K.max()]
    ax.set(xscale="log", yscale="log", xlabel=f"experts per token $K$ (of $E$ = {E})",
           ylabel="tokens to activate a fraction $\\tau$ of experts", xticks=ticks,
           xticklabels=[str(k) for k in ticks], title="Full-activation threshold (Eq. 9)")
    ax.legend()
    return figure


def tokens_per_expert_asymptotes(rho: float = 0.125, max_tokens: int = 200) -> plt.Figure:
    """Eq. 10 against ``t`` at one ``rho``, with its two asymptotes and ``T_thres`` marked."""
    from moesd.theory.experts import full_activation_threshold, tokens_per_expert

    t = np.linspace(1, max_tokens, 400)
    threshold = full_activation_threshold(rho)
    figure, ax = plt.subplots()
    ax.plot(t, tokens_per_expert(t, rho), label="$\\overline{T}_{exp}(t;\\rho)$ (Eq. 10)")
    ax.plot(t, 1 + rho * (t - 1) / 2, ls="--", label="$1 + \\rho(t-1)/2$ (few tokens)")
    ax.plot(t, rho * t, ls=":", label="$\\rho t$ (every expert active)")
    ax.axvline(threshold, color="0.5", lw=0.8, ls="-.", label=f"$T_{{thres}}$ = {threshold}")
    ax.set(xlabel="tokens $t$", ylabel="tokens per activated expert", ylim=(0, rho * max_tokens * 1.15),
           title=f"Tokens per expert and its asymptotes, $\\rho$ = {rho:g}")
    ax.legend(loc="upper left")
    return figure


def appendix_b_f(token_counts=(2, 4, 16, 64)) -> plt.Figure:
    """Appendix B, Eq. 13: ``F(rho; T)`` against ``rho``, one line per ``T``."""
    from moesd.theory.experts import appendix_b_f as f

    rho = np.linspace(0, 1, 400)[1:]
    figure, ax = plt.subplots()
    for T, style in zip(token_counts, _LINESTYLES):
        ax.plot(rho, f(rho, T), ls=style, label=f"$T$ = {T}")
    ax.axhline(1.0, color="0.5", lw=1, ls="--")
    ax.set(xlabel="$\\rho$", ylabel="$F(\\rho; T)$", title="Eq. 13 stays below 1 and falls with $\\rho$")
    ax.legend()
    return figure


def _roofline(ax, hw, intensity, colour, style, label):
    attainable = np.minimum(hw.peak_flops, intensity * hw.memory_bandwidth)
    ax.plot(intensity, attainable, color=colour, ls=style, label=label)
    ax.plot(hw.ridge_point, hw.peak_flops, "o", color=colour, ms=5)


def rooflines(records, measured=None) -> plt.Figure:
    """Eq. 1 rooflines of data-sheet records beside the measured roofline of the measuring machine.

    Left: attainable FLOP/s against arithmetic intensity for each record (a dot at its ridge point;
    the ridge point in the legend, not on the canvas). Right (with ``measured``): the measured GEMM
    FLOP/s against the GEMM's arithmetic intensity, under the roofline they define.

    Parameters
    ----------
    records : sequence of moesd.theory.roofline.Hardware
        Data-sheet records.
    measured : moesd.measure.hardware.RooflineMeasurement, optional
        A measured roofline (:meth:`~moesd.measure.hardware.RooflineMeasurement.from_sidecar`).
    """
    intensity = np.logspace(-1, 4, 400)
    panels = 2 if measured is not None else 1
    figure, axes = plt.subplots(1, panels, figsize=(6.4 * panels, 4.2), squeeze=False)
    ax = axes[0][0]
    for hw, colour, style in zip(records, PALETTE, _LINESTYLES * 2):
        _roofline(ax, hw, intensity, colour, style, f"{hw.name}: RP {hw.ridge_point:.0f}")
    if measured is not None:
        hw = measured.hardware
        _roofline(ax, hw, intensity, "k", "-", f"measuring machine: RP {hw.ridge_point:.1f}")
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP/byte)", ylabel="attainable FLOP/s",
           title="Rooflines (Eq. 1); dots: ridge points")
    ax.legend(loc="upper left")
    if measured is not None:
        ax = axes[0][1]
        hw, gemm = measured.hardware, measured.gemm
        _roofline(ax, hw, np.logspace(-1, 3, 200), "k", "-", f"measured roofline, RP {hw.ridge_point:.1f}")
        ax.plot(gemm["arithmetic_intensity"], gemm["flop_per_s"], "o", color=PALETTE[1],
                label="GEMM, best of repeats")
        ax.plot(gemm["arithmetic_intensity"], gemm["median_flop_per_s"], "x", color=PALETTE[3],
                label="GEMM, median of repeats")
        ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity of the GEMM (FLOP/byte)",
               ylabel="achieved FLOP/s",
               title=f"The measuring machine: GEMMs of $M$ = {gemm['tokens'].min()} to {gemm['tokens'].max()} tokens")
        ax.legend(loc="lower right")
    figure.tight_layout()
    return figure


def intensity_against_tokens(tokens, dense_ai, moe_ai, ridge_points: dict, labels=("dense FFN", "routed experts"),
                             title: str = "") -> plt.Figure:
    """Arithmetic intensity of a dense FFN and of routed experts against tokens, with ridge points as lines.

    ``ridge_points`` maps a device name to its ridge point (FLOP/byte); each gets its own line style and
    a legend entry, so labels never overprint however close the ridge points are.
    """
    figure, ax = plt.subplots()
    ax.plot(tokens, dense_ai, color=PALETTE[0], label=labels[0])
    ax.plot(tokens, moe_ai, color=PALETTE[1], label=labels[1])
    for (name, rp), style in zip(ridge_points.items(), _LINESTYLES[1:] * 2):
        ax.axhline(rp, color="0.35", lw=1, ls=style, label=f"{name} ridge point ({rp:.0f})")
    ax.set(xscale="log", yscale="log", xlabel="tokens in the forward pass ($B$ or $B(\\gamma+1)$)",
           ylabel="arithmetic intensity (FLOP/byte)", title=title)
    ax.legend(loc="upper left")
    return figure


def ffn_efficiency(batch, gamma: int, curves: dict) -> plt.Figure:
    """Roofline-floor target efficiency ``T(B, 1) / T(B, gamma + 1)`` of one FFN layer against batch size.

    ``curves`` maps ``(layer, device)`` to an efficiency array over ``batch`` (verification passes of ``gamma + 1``
    tokens per sequence); the layer sets the colour, the device the line style. A dotted line marks
    ``1 / (gamma + 1)``, the efficiency of a compute-bound layer.
    """
    layers = list(dict.fromkeys(layer for layer, _ in curves))
    devices = list(dict.fromkeys(device for _, device in curves))
    figure, ax = plt.subplots()
    for (layer, device), efficiency in curves.items():
        ax.plot(batch, efficiency, color=PALETTE[layers.index(layer)], ls=_LINESTYLES[devices.index(device)],
                label=f"{layer}, {device}")
    ax.axhline(1 / (gamma + 1), color="0.5", lw=1, ls=":", label="$1/(\\gamma+1)$")
    ax.set(xscale="log", xlabel="batch size $B$", ylabel="$T(B,1)\\,/\\,T(B,\\gamma+1)$ of the FFN layer",
           title=f"Roofline-floor target efficiency of one FFN layer, $\\gamma$ = {gamma}")
    ax.legend()
    return figure


def g_curves(rp: float, settings=((1.0, 1.005), (0.5, 1.005), (0.5, 1.01), (0.2, 1.02)),
             max_tokens: int = 600, device: str = "") -> plt.Figure:
    """Eq. 11's ``G(t; lambda RP, s)`` for several ``(lambda, s)``, a dot at each transition ``lambda RP``."""
    from moesd.theory.growth import G

    t = np.linspace(0, max_tokens, max_tokens + 1)
    figure, ax = plt.subplots()
    for (lam, s), colour, style in zip(settings, PALETTE, _LINESTYLES):
        ax.plot(t, G(t, lam * rp, s), color=colour, ls=style, label=f"$\\lambda$ = {lam:g}, $s$ = {s:g}")
        ax.plot(lam * rp, G(lam * rp, lam * rp, s), "o", color=colour)
    ax.set(xlabel="tokens $t$", ylabel="$G(t;\\lambda RP, s)$",
           title=f"Eq. 11 with the {device} ridge point (RP = {rp:.0f}); dots: $\\lambda$RP".replace("  ", " "))
    ax.legend()
    return figure


# ---- The algorithm of speculative decoding, run (the speculative decoding chapter) --------------------
