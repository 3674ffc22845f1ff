"""Diagrams of the book's introduction: one speculative-decoding round, and routing in a batch.

Both are drawings, not data: the timeline's durations are illustrative parameters, and the routing
diagram draws one seeded uniform routing (the assumption of the paper's Eq. 8). Every text sits
inside its axes, so nothing is cut when the figure is saved tightly.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import FancyBboxPatch, Rectangle

from moesd.plots import PALETTE
from moesd.theory.experts import uniform_routing

DRAFT, TARGET, REJECT, ACCEPTED, REJECTED, BONUS = (PALETTE[0], PALETTE[1], PALETTE[6], PALETTE[4],
                                                    "0.75", PALETTE[2])


def _box(ax, x, y, width, height, colour, text, text_colour="white", fontsize=9):
    """A rounded box with centred text."""
    ax.add_patch(FancyBboxPatch((x, y), width, height, boxstyle="round,pad=0,rounding_size=0.04",
                                facecolor=colour, edgecolor="white", linewidth=1.2))
    ax.text(x + width / 2, y + height / 2, text, ha="center", va="center", color=text_colour, fontsize=fontsize)


def sd_round_timeline(gamma: int = 4, accepted: int = 2, t_draft: float = 0.12, t_verify: float = 1.3,
                      t_reject: float = 0.08) -> plt.Figure:
    """Timeline of one speculative-decoding round beside autoregressive decoding (Eq. 2).

    Top: the draft model's ``gamma`` steps ``T_D(B, 1)``, the target's one verification pass
    ``T_T(B, gamma)`` over ``gamma + 1`` positions per sequence, and rejection sampling ``T_reject``.
    Middle: autoregressive decoding emitting the same tokens, one target step ``T_T(B, 1)`` each.
    Bottom: the tokens of one sequence: the accepted draft prefix, the rejected rest, and the one
    token the target adds (a correction, or a bonus when every draft token is accepted).

    Parameters
    ----------
    gamma : int, default 4
        Draft tokens per round (>= 1).
    accepted : int, default 2
        Draft tokens of the drawn sequence that are accepted (0 .. gamma).
    t_draft, t_verify, t_reject : float
        Illustrative durations in units of one target decode step ``T_T(B, 1)``.
    """
    if not 0 <= accepted <= gamma:
        raise ValueError(f"accepted must lie in 0..gamma = {gamma}, got {accepted}")
    emitted = accepted + 1
    sd_end = gamma * t_draft + t_verify + t_reject
    right = max(sd_end, emitted) + 0.15
    figure, (ax_time, ax_tokens) = plt.subplots(2, 1, figsize=(8.4, 4.6), height_ratios=[2.2, 1])

    lane = {"draft": 2.0, "target": 1.0, "AR": -0.3}
    for i in range(gamma):
        _box(ax_time, i * t_draft, lane["draft"], t_draft, 0.7, DRAFT, f"$d_{i + 1}$")
    start = gamma * t_draft
    _box(ax_time, start, lane["target"], t_verify, 0.7, TARGET,
         f"verify $\\gamma+1$ = {gamma + 1} positions: $T_T(B,\\gamma+1)$")
    _box(ax_time, start + t_verify, lane["target"], t_reject, 0.7, REJECT, "")
    ax_time.annotate("rejection\nsampling $T_{reject}$", xy=(sd_end - t_reject / 2, lane["target"] + 0.7),
                     xytext=(sd_end - t_reject / 2, lane["draft"] + 0.35), ha="center", va="center", fontsize=8,
                     arrowprops={"arrowstyle": "->", "color": "0.3"})
    for i in range(emitted):
        _box(ax_time, i, lane["AR"], 1.0, 0.7, PALETTE[3], "$T_T(B,1)$")
    ax_time.annotate("", xy=(0, 0.75), xytext=(sd_end, 0.75),
                     arrowprops={"arrowstyle": "<->", "color": "0.3"})
    ax_time.text(sd_end / 2, 0.6, "one SD round: $\\gamma\\,T_D(B,1) + T_T(B,\\gamma+1) + T_{reject}$",
                 ha="center", va="top", fontsize=8)
    ax_time.set_yticks([lane["draft"] + 0.35, lane["target"] + 0.35, lane["AR"] + 0.35],
                       [f"draft: $\\gamma$ = {gamma} steps\n$T_D(B,1)$ each", "target",
                        f"autoregressive:\n{emitted} target steps"])
    ax_time.set(xlim=(-0.02, right), ylim=(-0.45, 2.85), xticks=np.arange(0, right - 0.1, 0.5),
                xlabel="time, in target decode steps $T_T(B,1)$ (illustrative durations)")
    ax_time.grid(False)
    ax_time.spines[["left"]].set_visible(False)
    ax_time.tick_params(axis="y", length=0)

    labels = [f"$d_{i + 1}$" for i in range(gamma)]
    for i, label in enumerate(labels):
        ok = i < accepted
        _box(ax_tokens, i * 1.1, 0, 1.0, 0.8, ACCEPTED if ok else REJECTED,
             f"{label}\n{'accepted' if ok else 'rejected'}", text_colour="white" if ok else "0.2", fontsize=8)
    bonus = "bonus" if accepted == gamma else "correction"
    _box(ax_tokens, gamma * 1.1 + 0.3, 0, 1.3, 0.8, BONUS, f"target's\n{bonus}", text_colour="0.1", fontsize=8)
    ax_tokens.text(gamma * 1.1 + 1.8, 0.4,
                   f"{emitted} of {gamma + 1} possible tokens emitted\n"
                   f"this round; on average $\\sigma(\\gamma+1)$", va="center", fontsize=8)
    ax_tokens.set(xlim=(-0.05, gamma * 1.1 + 4.9), ylim=(-0.15, 0.95),
                  title="one sequence's tokens in this round", xticks=[], yticks=[])
    ax_tokens.title.set_fontsize(9)
    ax_tokens.axis("off")
    figure.tight_layout()
    return figure


def _routing_panel(ax, routes: np.ndarray, E: int, sequences: int, per_sequence: int, title: str):
    """Tokens (left) joined to their experts (right); activated experts filled, with their token counts."""
    tokens = len(routes)
    token_y = np.linspace(E - 1, 0, tokens) if tokens > 1 else np.array([(E - 1) / 2])
    counts = np.bincount(routes.ravel(), minlength=E)
    colours = [PALETTE[i % len(PALETTE)] for i in range(sequences)]
    for i, experts in enumerate(routes):
        colour = colours[i // per_sequence]
        for expert in experts:
            ax.plot([0.3, 2.7], [token_y[i], E - 1 - expert], color=colour, lw=0.9, alpha=0.7)
        position = i % per_sequence
        name = f"$s_{i // per_sequence + 1}$" + (f", pos. {position}" if per_sequence > 1 else "")
        ax.add_patch(Rectangle((-0.3, token_y[i] - 0.35), 0.6, 0.7, facecolor=colour, edgecolor="none"))
        ax.text(-0.4, token_y[i], name, ha="right", va="center", fontsize=7)
    for expert in range(E):
        active = counts[expert] > 0
        ax.add_patch(Rectangle((2.7, E - 1 - expert - 0.4), 0.6, 0.8, facecolor="0.25" if active else "white",
                               edgecolor="0.25", linewidth=0.8))
        ax.text(3.45, E - 1 - expert, f"{counts[expert]}" if active else "idle", va="center", fontsize=7,
                color="0.1" if active else "0.55")
    ax.text(0, E - 0.1, "tokens", ha="center", va="bottom", fontsize=8, color="0.3")
    ax.text(3.0, E - 0.1, "experts (tokens each)", ha="center", va="bottom", fontsize=8, color="0.3")
    active = int((counts > 0).sum())
    ax.set_title(f"{title}\n{active} of {E} experts loaded, {tokens * routes.shape[1] / max(active, 1):.2f} "
                 "tokens per loaded expert", fontsize=9)
    ax.set(xlim=(-1.9, 4.2), ylim=(-1, E + 0.7))
    ax.axis("off")


def routing_diagram(batch_size: int = 3, gamma: int = 2, E: int = 16, K: int = 2, seed: int = 0) -> plt.Figure:
    """Token-to-expert routing of one MoE layer for a decode step and for a verification pass.

    Left: a decode step, one token for each of the ``batch_size`` sequences ``s_i``. Right: the
    verification pass of the same batch, ``gamma + 1`` positions per sequence. Each token is joined
    to the ``K`` of ``E`` experts it picks (uniform routing, seeded); a loaded expert is filled and
    shows how many tokens it processes. The first tokens on the right route like those on the left
    (the same draw).

    Parameters
    ----------
    batch_size : int, default 3
        Sequences ``B``.
    gamma : int, default 2
        Draft tokens per sequence.
    E, K : int
        Routed experts and experts per token.
    seed : int
        Seed of the routing draw.
    """
    verify = uniform_routing(batch_size * (gamma + 1), E, K, seed)
    decode = verify.reshape(batch_size, gamma + 1, K)[:, 0, :]
    figure, axes = plt.subplots(1, 2, figsize=(8.4, 4.8))
    _routing_panel(axes[0], decode, E, batch_size, 1, f"decode step: $B$ = {batch_size} tokens")
    _routing_panel(axes[1], verify, E, batch_size, gamma + 1,
                   f"verification: $B(\\gamma+1)$ = {batch_size * (gamma + 1)} tokens ($\\gamma$ = {gamma})")
    figure.text(0.5, 0.01, f"each token picks $K$ = {K} of $E$ = {E} experts", ha="center", fontsize=8)
    figure.tight_layout(rect=(0, 0.03, 1, 1))
    return figure
