"""The Measuring SD chapter's tables: the protocol checks, the regime, the step against N(B)."""

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from moesd.measure.checks import (expert_cost_fit, expert_read_seconds, protocol_checks, regime_steps,
                                  sigma_standard_error, step_against_experts, streaming_shares, study_durations)
from moesd.plots.measuring_sd import plot_regime_gemm, plot_step_against_experts
from moesd.measure.regime import RegimeCheck, study_sidecar


def e2e_rows(rounds=5, sigma_shift=0.0):
    rows = []
    for run in (0, 1):
        for b in (1, 2, 4, 8):
            for g, target in ((2, 0.95), (4, 0.9)):
                rows.append({"run": run, "batch_size": b, "gamma": g, "rounds": rounds, "ar_steps": rounds,
                             "warmup_rounds": 1, "speedup": 2.0, "speedup_eq4": 2.0 / (1 + 0.01 * run),
                             "sigma": target + sigma_shift + (0.02 if b == 8 else 0.0), "sigma_target": target,
                             "alpha": 0.95})
    return pd.DataFrame(rows)


def test_protocol_checks_count_points_with_the_asked_rounds_and_the_sigma_bias():
    sidecar = {"settings": {"rounds": 5, "warmup_rounds": 1}}
    rows = e2e_rows(sigma_shift=-0.01)
    rows.loc[0, "ar_steps"] = 4  # one point short of its AR steps
    table = protocol_checks(rows, sidecar)
    assert table.loc[2, "rows"] == 8 and table.loc[2, "rounds asked"] == 5
    assert table.loc[2, "points with those rounds"] == 7 and table.loc[4, "points with those rounds"] == 8
    assert table.loc[4, "speedup / Eq. 4, min"] == pytest.approx(1.0)
    assert table.loc[4, "speedup / Eq. 4, max"] == pytest.approx(1.01)
    assert table["sigma bias"].to_numpy() == pytest.approx([-0.01, -0.01])  # B = 8 is left out
    assert table.loc[2, "target sigma"] == 0.95
    wider = protocol_checks(rows, sidecar, small_batch=8)
    assert wider["sigma bias"].to_numpy() == pytest.approx([-0.005, -0.005])
    expected = sigma_standard_error(0.95, 4, [5, 5, 10, 10, 20, 20])  # B x rounds of B = 1, 2, 4, two repeats
    assert table.loc[4, "standard error"] == pytest.approx(expected)
    assert table.loc[4, "bias / standard error"] == pytest.approx(-0.01 / expected)


def test_sigma_standard_error_matches_simulated_windows():
    rng = np.random.default_rng(0)
    alpha, gamma, rounds = 0.9, 4, 5
    batch_sizes = [1, 2, 4]
    means = []
    for _ in range(4000):
        sigmas = []
        for b in batch_sizes:
            accepted = np.minimum(rng.geometric(1 - alpha, b * rounds) - 1, gamma)
            sigmas.append((accepted + 1).mean() / (gamma + 1))
        means.append(np.mean(sigmas))
    predicted = sigma_standard_error(alpha, gamma, [b * rounds for b in batch_sizes])
    assert np.std(means) == pytest.approx(predicted, rel=0.05)
    assert np.mean(means) == pytest.approx((1 - alpha ** (gamma + 1)) / (1 - alpha) / (gamma + 1), abs=0.002)
    assert sigma_standard_error(1.0, 4, [10]) == 0.0  # every draft accepted: no spread
    assert sigma_standard_error(0.9, 4, [40]) == pytest.approx(sigma_standard_error(0.9, 4, [10]) / 2)
    with pytest.raises(ValueError, match="alpha must be in"):
        sigma_standard_error(1.5, 4, [10])


def regime_check():
    gemm = pd.DataFrame([{"projection": p, "dtype": d, "tokens": m, "median_seconds": 1e-3 * m ** 0.5,
                          "weight_bandwidth": 1e10 / m ** 0.5, "median_flop_per_s": 1e9 * m}
                         for p in ("a", "b") for d in ("float32", "bfloat16") for m in (1, 2, 4)])
    steps = pd.DataFrame([{"model": "m", "dtype": d, "step_seconds": 0.1, "bytes": 2e9 if d == "float32" else 1e9,
                           "bandwidth": bw, "streaming_share": 0.5,
                           "products_seconds": 0.09, "products_share": 0.9, "products_bandwidth": 1.2e10,
                           "dispatch_share": 0.02} for d, bw in (("float32", 2.5e10), ("bfloat16", 4.5e10))])
    return RegimeCheck(gemm, pd.DataFrame(), steps, {"threads": 2})


def test_regime_steps_are_in_readable_units():
    table = regime_steps(regime_check())
    row = table.loc[("m", "bfloat16")]
    assert row["step (ms)"] == pytest.approx(100) and row["STREAM (GB/s)"] == pytest.approx(45)
    assert row["products read (GB/s)"] == pytest.approx(12) and row["dispatch share"] == 0.02
    assert row["bytes (GB)"] == pytest.approx(1) and row["bytes / step (GB/s)"] == pytest.approx(10)
    assert table.loc[("m", "float32"), "bytes / step (GB/s)"] == pytest.approx(20)


def test_the_regime_figure_draws_every_projection_and_dtype_and_each_stream_bandwidth():
    figure = plot_regime_gemm(regime_check())
    left, right = figure.axes
    assert len(figure.legends[0].get_texts()) == 4 + 2  # 2 projections x 2 dtypes, 2 STREAM lines
    assert len(right.get_lines()) == 4
    streams = sorted(line.get_ydata()[0] for line in left.get_lines()[4:])
    assert streams == pytest.approx([25, 45])
    plt.close("all")


def test_streaming_shares_read_the_sidecar_and_compute_a_missing_one():
    recorded = study_sidecar("qwen2-57b-a14b", "bfloat16", bandwidth=20e9)
    recorded["streaming_share"] = {"share": 0.4, "bytes": 1e9, "bandwidth": 20e9, "step_seconds": 0.125}
    missing = study_sidecar("qwen2-57b-a14b", "bfloat16", bandwidth=20e9)
    rows = pd.DataFrame({"role": ["target", "target", "draft"], "batch_size": [1, 1, 1], "tokens": [1, 1, 1],
                         "seconds": [0.1, 0.3, 0.01]})
    table = streaming_shares({"recorded": (rows, recorded), "missing": (rows, missing)})
    assert table.loc["recorded", "streaming share"] == 0.4 and table.loc["recorded", "source"] == "sidecar"
    assert table.loc["missing", "source"] == "computed from the rows"
    assert table.loc["missing", "step (ms)"] == pytest.approx(200)  # the median of 0.1 and 0.3 s
    expected = table.loc["missing", "bytes (GB)"] * 1e9 / 20e9 / 0.2
    assert table.loc["missing", "streaming share"] == pytest.approx(expected)
    assert table.loc["missing", "dtype"] == "bfloat16" and table.loc["missing", "width"] == 1.0


def test_an_expert_reads_its_three_matrices_at_the_rate():
    from moesd.zoo import get_model

    config = get_model("qwen2-57b-a14b").config
    values = 3 * config["hidden_size"] * config["moe_intermediate_size"]
    sidecar = study_sidecar("qwen2-57b-a14b", "bfloat16", bandwidth=40e9)
    assert expert_read_seconds(sidecar) == pytest.approx(2 * values / 40e9, rel=1e-3)
    assert expert_read_seconds(sidecar, rate=10e9) == pytest.approx(4 * expert_read_seconds(sidecar))
    with pytest.raises(ValueError, match="no routed experts"):
        expert_read_seconds(study_sidecar("opt-30b", "bfloat16", bandwidth=40e9))


def forward_with_experts(fixed=0.02, per_expert=0.004, per_token=0.0005, runs=3):
    rows = []
    for run in range(runs):
        for b in (1, 2, 4, 8, 16, 32, 64, 100):
            n = 64 * (1 - (56 / 64) ** b)
            for s in (1, 2):
                rows.append({"run": run, "role": "target", "batch_size": b, "tokens": s, "activated_experts": n,
                             "seconds": (fixed + per_expert * n + per_token * b * s) * (1 + 0.1 * run)})
                rows.append({"run": run, "role": "draft", "batch_size": b, "tokens": s, "activated_experts": np.nan,
                             "seconds": 0.003 + 1e-5 * b})
    return pd.DataFrame(rows)


def test_the_step_fit_recovers_a_linear_cost_in_experts_and_tokens():
    steps = step_against_experts(forward_with_experts())
    assert list(steps.index) == [1, 2, 4, 8, 16, 32, 64, 100]
    assert steps.loc[1, "activated_experts"] == pytest.approx(8)
    assert steps.loc[4, "target_s"] == pytest.approx(1.1 * (0.02 + 0.004 * steps.loc[4, "activated_experts"]
                                                            + 0.0005 * 4))  # the median of the 3 repeats
    assert (steps["target_low"] <= steps["target_s"]).all() and (steps["target_s"] <= steps["target_high"]).all()
    assert steps.loc[100, "draft_s"] == pytest.approx(0.004)
    fit = expert_cost_fit(steps)
    assert fit["fixed_s"] == pytest.approx(0.022) and fit["per_expert_s"] == pytest.approx(0.0044)
    assert fit["per_token_s"] == pytest.approx(0.00055) and fit["largest_residual"] < 1e-9
    assert expert_cost_fit(steps, moe_layers=2)["per_expert_s"] == pytest.approx(0.0022)
    with pytest.raises(ValueError, match="lack activated_experts"):
        step_against_experts(forward_with_experts().assign(activated_experts=np.nan))


def test_the_step_figure_has_the_fit_and_a_line_per_gamma():
    steps = step_against_experts(forward_with_experts())
    draft_terms = pd.DataFrame([{"batch_size": b, "gamma": g, "draft_term": 0.1 * g / b}
                                for b in (1, 8, 100) for g in (2, 4)])
    figure = plot_step_against_experts(steps, draft_terms, expert_cost_fit(steps), experts=64)
    assert len(figure.axes) == 2
    assert len(figure.axes[0].get_legend().get_texts()) == 3  # measured, fit, E
    assert len(figure.axes[1].get_lines()) == 2
    plt.close("all")


def test_study_durations_run_from_one_start_to_the_next():
    table = study_durations({"b": "2026-11-26T07:08:21+00:00", "a": "2026-11-26T07:01:51+00:00",
                             "c": "2026-11-26T07:12:57+00:00"})
    assert list(table.index) == ["a", "b", "c"]
    assert table["minutes, at most"].iloc[:2].to_numpy() == pytest.approx([6.5, 4.6])
    assert np.isnan(table.loc["c", "minutes, at most"])
    assert table.loc["a", "started"] == "2026-11-26 07:01"


def test_doubling_tokens_find_where_a_product_s_time_first_doubles():
    from moesd.measure.checks import doubling_tokens

    gemm = pd.DataFrame([{"projection": "p", "dtype": "float32", "tokens": m, "median_seconds": s}
                         for m, s in ((1, 1.0), (2, 2.5), (4, 2.0), (8, 3.0))]
                        + [{"projection": "p", "dtype": "bfloat16", "tokens": m, "median_seconds": s}
                           for m, s in ((1, 1.0), (2, 0.9), (4, 1.2), (8, 1.9))])
    table = doubling_tokens(RegimeCheck(gemm, pd.DataFrame(), pd.DataFrame(), {}))
    assert table.loc["p", "float32"] == 2  # a one-token kernel jump
    assert np.isnan(table.loc["p", "bfloat16"])  # flat over every measured M


def test_an_expert_s_products_are_gate_up_twice_and_down():
    from moesd.measure.checks import expert_products_seconds

    gemm = pd.DataFrame([{"projection": f"m expert {p}", "dtype": d, "tokens": m, "median_seconds": s * m * f}
                         for p, s in (("gate/up", 1.0), ("down", 0.5)) for d, f in (("float32", 2), ("bfloat16", 1))
                         for m in (1, 2)])
    seconds = expert_products_seconds(RegimeCheck(gemm, pd.DataFrame(), pd.DataFrame(), {}), "m")
    assert seconds["bfloat16"] == pytest.approx(2.5) and seconds["float32"] == pytest.approx(5.0)
    assert expert_products_seconds(RegimeCheck(gemm, pd.DataFrame(), pd.DataFrame(), {}), "m", 2)[
        "bfloat16"] == pytest.approx(5.0)
