"""Eq. 4 from forward studies, the Measuring chapter's Eq. 4 terms, and the two chapters' figures."""

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from moesd.measure.analysis import forward_speedup, forward_target_efficiency
from moesd.measure.analysis import eq4_terms
from moesd.plots.measuring_sd import plot_eq4_check
from moesd.plots.target_efficiency import plot_fig2, plot_fig3, plot_forward_speedup
from moesd.theory.speedup import speedup


def forward_study(runs=3, batch_sizes=(1, 2, 4, 8, 16), drift=0.3):
    """A synthetic forward study: T_T(B, s) = 1 + 0.1 s B, T_D(B, 1) = 0.2 + 0.001 B, run r slowed by (1 + drift r)."""
    rows = []
    for r in range(runs):
        for b in batch_sizes:
            for s in (1, 2, 3, 4, 5):
                rows.append({"run": r, "role": "target", "batch_size": b, "tokens": s,
                             "seconds": (1 + 0.1 * s * b) * (1 + drift * r)})
                rows.append({"run": r, "role": "draft", "batch_size": b, "tokens": s,
                             "seconds": (0.2 + 0.001 * s * b) * (1 + drift * r)})
    return pd.DataFrame(rows)


def test_forward_speedup_is_eq4_of_the_stage_times_and_cancels_drift():
    study = forward_study()
    table = forward_speedup(study, {"2": 0.95, "4": 0.9}, gammas=(2, 4))
    for _, row in table.iterrows():
        b, g = row["batch_size"], row["gamma"]
        expected = speedup(row["sigma"], g, 1 + 0.1 * b, 1 + 0.1 * (g + 1) * b, 0.2 + 0.001 * b)
        assert row["speedup"] == pytest.approx(expected)  # a drift that scales a whole repeat cancels
        assert row["low"] == pytest.approx(expected) and row["high"] == pytest.approx(expected)
        assert row["draft_term"] == pytest.approx(g * (0.2 + 0.001 * b) / (1 + 0.1 * b))
        assert row["runs"] == 3
    assert set(table["sigma"]) == {0.95, 0.9}
    one = forward_speedup(study, 0.9, gammas=(4,))
    assert one["speedup"].tolist() == pytest.approx(table[table["gamma"] == 4]["speedup"].tolist())


def test_forward_speedup_with_a_free_draft_is_sigma_gamma_plus_one_times_efficiency():
    study = forward_study()
    study.loc[study["role"] == "draft", "seconds"] = 0.0
    table = forward_speedup(study, 0.8, gammas=(3,))
    efficiency = forward_target_efficiency(study, gammas=(3,))
    assert table["speedup"].to_numpy() == pytest.approx(0.8 * 4 * efficiency["efficiency"].to_numpy())


def test_forward_speedup_rejects_missing_passes():
    study = forward_study()
    with pytest.raises(ValueError, match="target pass of 6"):
        forward_speedup(study, 0.9, gammas=(5,))
    with pytest.raises(ValueError, match="draft pass of 1"):
        forward_speedup(study[~((study["role"] == "draft") & (study["tokens"] == 1))], 0.9, gammas=(2,))


def e2e_rows():
    rng = np.random.default_rng(0)
    rows = []
    for run in (0, 1):
        for b in (1, 2, 4, 8, 16, 32):
            for g in (2, 4):
                t_ar = 0.01 + 0.001 * b
                row = {"run": run, "batch_size": b, "gamma": g, "t_ar": t_ar, "t_target_gamma": t_ar * (1 + 0.1 * g),
                       "t_draft": 0.002, "t_reject": 1e-4, "sigma": rng.uniform(0.8, 0.95)}
                row["speedup_eq4"] = speedup(row["sigma"], g, t_ar, row["t_target_gamma"], 0.002, 1e-4)
                row["speedup"] = row["speedup_eq4"] * rng.uniform(0.98, 1.02)
                row["target_efficiency"] = t_ar / row["t_target_gamma"]
                rows.append(row)
    return pd.DataFrame(rows)


def test_eq4_terms_recombine_to_eq4_and_average_repeats():
    e2e = e2e_rows()
    terms = eq4_terms(e2e).reset_index()
    assert len(terms) == 12
    recombined = terms["sigma"] * (terms["gamma"] + 1) / (terms["draft"] + terms["verify"] + terms["reject"])
    # terms of each repeat share t_ar etc. here, so the mean sigma recombines to the mean Eq. 4
    assert recombined.to_numpy() == pytest.approx(terms["speedup_eq4"].to_numpy())
    row = terms[(terms["gamma"] == 4) & (terms["batch_size"] == 8)].iloc[0]
    assert row["draft"] == pytest.approx(4 * 0.002 / 0.018) and row["verify"] == pytest.approx(1.4)
    assert row["speedup"] == pytest.approx(e2e[(e2e["gamma"] == 4) & (e2e["batch_size"] == 8)]["speedup"].mean())


def test_figures_have_a_legend_entry_for_every_line():
    e2e = e2e_rows()
    fig = plot_fig2(e2e)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert sorted(labels) == sorted([rf"speedup, $\gamma = {g}$" for g in (2, 4)]
                                    + [rf"target efficiency, $\gamma = {g}$" for g in (2, 4)])
    fig = plot_eq4_check(eq4_terms(e2e).reset_index(), {"2": 0.95, "4": 0.9})
    assert len(fig.axes) == 3 and all(ax.get_legend() is not None for ax in fig.axes)
    study = forward_study()
    tables = {"MoE": forward_target_efficiency(study, gammas=(2, 4)),
              "dense": forward_target_efficiency(study, gammas=(2, 4))}
    fig = plot_fig3(tables, t_thres=8)
    assert len(fig.axes) == 2 and len(fig.axes[-1].get_legend().get_texts()) == 2
    fig = plot_forward_speedup({"MoE": forward_speedup(study, 0.9, gammas=(2, 4))}, t_thres=8)
    assert len(fig.axes[0].get_legend().get_texts()) == 2
    plt.close("all")
