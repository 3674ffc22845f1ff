"""Fig. 1 on trained routers (N(t) of the shipped sources), the popularity-routed study's comparison and
prediction, the predictor's routing by source name, and their figures and sentences."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from moesd import narration  # noqa: E402
from moesd.paper.routing_study import (compare_routings, efficiency_summary, mean_difference,  # noqa: E402
                                        predicted_efficiency)
from moesd.measure.studies import load  # noqa: E402
from moesd.predictor.forward import step_time  # noqa: E402
from moesd.paper import fig1  # noqa: E402
from moesd.paper.criteria import FAILS, HOLDS, UNTESTABLE  # noqa: E402
from moesd.plots import trained_routing as plots  # noqa: E402
from moesd.routing import activation, sources  # noqa: E402
from moesd.routing.traces import RoutingTrace  # noqa: E402
from moesd.theory.experts import expected_active_experts, expected_active_experts_from_popularity  # noqa: E402


def test_the_standard_error_of_the_popularity_curve_matches_resampled_counts():
    rng = np.random.default_rng(0)
    p = np.r_[np.full(4, 0.15), np.full(8, 0.05)]  # K = 1, E = 12
    tokens, t = 2000, np.array([2, 8, 32])
    resampled = np.array([expected_active_experts_from_popularity(t, rng.multinomial(tokens, p) / tokens)
                          for _ in range(2000)])
    np.testing.assert_allclose(activation.popularity_standard_error(t, p, tokens), resampled.std(axis=0), rtol=0.1)


def test_popularity_curves_lie_at_or_below_eq8_and_meet_it_at_one_token():
    curves = activation.popularity_curves(["olmoe/github", "mixtral/c4", "switch-base-128/mixed"])
    assert (curves["ratio"] <= 1 + 1e-12).all()
    one = curves[curves["t"] == 1]
    np.testing.assert_allclose(one["popularity"], one["uniform"])  # one token activates exactly K experts
    olmoe = curves[curves["model"] == "olmoe"]
    np.testing.assert_allclose(olmoe["uniform"], expected_active_experts(olmoe["t"], 64, 8))
    assert (curves["popularity_se"] >= 0).all() and set(curves["layer"]) == {0, 7, 15, 1, 3, 5, 9, 11}


def test_ratio_and_skew_tables_keep_the_sources_order_and_bounds():
    ratios = activation.ratio_table(["olmoe/c4", "switch-base-128/mixed"])
    assert list(ratios.columns) == ["t = 8", "t = 32", "t = 128"]
    assert list(ratios.index.get_level_values("layer")) == [0, 7, 15, 1, 3, 5, 7, 9, 11]
    skew = activation.skew_table()
    assert ((skew["effective_experts"] >= skew["K"]) & (skew["effective_experts"] <= skew["E"] + 1e-9)).all()
    assert ((skew["top_share"] >= skew["K"] / skew["E"] - 1e-12) & (skew["top_share"] <= 1)).all()
    assert (skew["max_over_uniform"] >= 1).all() and len(skew) == 45


def _trace(experts, sequences) -> RoutingTrace:
    experts = np.asarray(experts).reshape(-1, 1, 1)
    positions = np.concatenate([np.arange(n) for n in sequences])
    return RoutingTrace(experts, 128, sequence=np.repeat(np.arange(len(sequences)), sequences), position=positions,
                        layers=np.array([1]))


def test_window_activation_measures_each_sequence_and_sets_the_predictions_beside_it():
    repeated = _trace([5] * 40 + list(range(40)), [40, 40])  # one sequence reuses one expert, one never repeats
    frame = activation.window_activation({1: repeated}, "switch-base-128/mixed", t=(8, 32))
    measured = frame.set_index(["sequence", "t"])["measured"]
    assert measured[0, 8] == measured[0, 32] == 1 and measured[1, 8] == 8 and measured[1, 32] == 32
    p = sources.popularity("switch-base-128/mixed")[0]  # layer 1
    assert frame.set_index(["sequence", "t"]).loc[(0, 8), "popularity"] == pytest.approx(
        float(expected_active_experts_from_popularity(8, p)))
    assert (frame["uniform"] == expected_active_experts(frame["t"], 128, 1)).all()
    curves = activation.window_curves({1: repeated}, t=(1, 4))
    assert set(curves["t"]) == {1, 4} and curves.query("sequence == 1 and t == 4")["measured"].iloc[0] == 4


def test_batch_activation_skips_layers_with_too_few_sequences():
    two = _trace(list(range(10)) + list(range(5, 15)), [10, 10])
    assert activation.batch_activation({1: two}, "switch-base-128/mixed", 3, 2).empty
    batch = activation.batch_activation({1: two}, "switch-base-128/mixed", 2, 2, samples=50)
    assert batch.iloc[0]["tokens"] == 4 and 2 <= batch.iloc[0]["measured"] <= 4


def test_the_shipped_data_are_judged_and_name_what_they_cannot_show():
    inputs = fig1.fig1_inputs()
    assert inputs["sequences_per_layer"] == 2 and not inputs["decode"]
    judged = fig1.judge_fig1(**inputs)
    assert judged.status in (HOLDS, FAILS, fig1.PARTLY) and judged.strict_status in (HOLDS, FAILS, fig1.PARTLY)
    assert {"decode", "paper_models", "batches"} <= {part for part, _ in judged.untestable}
    windows = judged.parts.set_index("part").loc["windows"]
    assert windows["material"] != UNTESTABLE and windows["count"] == 12
    assert len(judged.layers) == 45
    assert narration.fig1_summary(judged).startswith("Fig. 1 on trained routers: ")
    assert "Not testable here" in narration.fig1_sentence(judged)


def _study(factor_at_one: float, runs: int = 4) -> pd.DataFrame:
    rows = []
    for run in range(runs):
        for batch in (1, 4, 16):
            for tokens in (1, 5):
                seconds = (1.0 + 0.1 * batch) * (factor_at_one if tokens == 1 else 2.0) * (1 + 0.01 * run)
                rows.append({"run": run, "role": "target", "batch_size": batch, "tokens": tokens, "context": 8,
                             "seconds": seconds})
    return pd.DataFrame(rows)


def test_compare_routings_by_hand():
    comparison = compare_routings(_study(1.0), _study(1.2), gamma=4)
    table = comparison.table.set_index("batch_size")
    np.testing.assert_allclose(table["uniform"], 0.5)
    np.testing.assert_allclose(table["popularity"], 0.6)
    np.testing.assert_allclose(table["difference"], 0.1)
    assert table["beyond_noise"].all()  # no scatter over repeats: any difference is beyond it
    assert comparison.peak_change == pytest.approx(0.1) and comparison.peak_change_se == pytest.approx(0)
    assert efficiency_summary(_study(1.0), 4)["runs"].tolist() == [4, 4, 4]
    assert "+0.100" in narration.popularity_peak_sentence(comparison, -0.05)
    assert mean_difference(comparison, 2, 16) == pytest.approx((0.1, 0.0))
    with pytest.raises(ValueError, match="no batch size"):
        mean_difference(comparison, 30, 40)


def test_the_prediction_is_the_uniform_one_under_uniform_popularity_and_meets_it_at_large_batches():
    forward, sidecar = load("forward")
    same = predicted_efficiency(forward, sidecar, np.full((1, 64), 8 / 64), gammas=(4,))
    np.testing.assert_allclose(same["difference"], 0, atol=1e-12)
    skewed = predicted_efficiency(forward, sidecar, sources.popularity("olmoe/github", num_layers=1), gammas=(4,))
    by_batch = skewed.set_index("batch_size")["difference"]
    assert abs(by_batch.loc[100]) < 1e-3 and by_batch.abs().max() > 0.01


def test_the_predictor_takes_a_shipped_source_by_name():
    args = ("qwen2-57b-a14b", "H100", np.array([1, 5]), np.array([8, 8]), 512)
    by_name = step_time(*args, routing="olmoe/c4").total
    mapped = step_time(*args, routing=sources.popularity("olmoe/c4", 28)).total
    np.testing.assert_allclose(by_name, mapped)
    assert (by_name != step_time(*args).total).any()
    with pytest.raises(ValueError, match="olmoe/nowhere"):
        step_time(*args, routing="olmoe/nowhere")


def test_figures_draw():
    curves = activation.popularity_curves(["olmoe/c4", "olmoe/github", "mixtral/c4"], t=np.arange(1, 65))
    for figure in (plots.popularity_ratio(curves, fig1.TOLERANCE),
                   plots.expert_shares({"a": sources.popularity("olmoe/c4")[0]}, 8, 64),
                   plots.window_activation(activation.window_curves(sources.token_traces(), t=(1, 8, 16)),
                                           dict(zip((1, 3, 5, 7, 9, 11), sources.popularity("switch-base-128/mixed"))),
                                           128, 1),
                   plots.routing_efficiency(compare_routings(_study(1.0), _study(1.2)),
                                            pd.DataFrame({"batch_size": [1, 4, 16], "uniform": 0.5,
                                                          "popularity": 0.55, "difference": 0.05}))):
        assert figure.axes
        plt.close(figure)
