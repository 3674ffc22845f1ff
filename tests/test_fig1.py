"""The Fig. 1 criterion on synthetic routing whose answer is known."""

import numpy as np
import pandas as pd
import pytest

from moesd.paper import fig1
from moesd.paper.criteria import FAILS, HOLDS, UNTESTABLE
from moesd.theory.experts import expected_active_experts, expected_active_experts_from_popularity

E, K = 64, 8


def _curves(layers: dict, se: float = 0.0, model: str = "m", domain: str = "d") -> pd.DataFrame:
    """Curves of each layer's popularity (name -> p), as moesd.routing.activation builds them."""
    t = fig1.TOKENS
    frames = [pd.DataFrame({"model": model, "domain": domain, "layer": layer, "t": t,
                            "uniform": expected_active_experts(t, E, K),
                            "popularity": expected_active_experts_from_popularity(t, p),
                            "popularity_se": se})
              for layer, p in layers.items()]
    return pd.concat(frames, ignore_index=True)


def _skewed(share_of_top_half: float) -> np.ndarray:
    """Popularity with the first 32 experts taking ``share_of_top_half`` of the K choices."""
    p = np.r_[np.full(32, share_of_top_half), np.full(32, 1 - share_of_top_half)] * K / 32
    return p


UNIFORM = np.full(E, K / E)


def test_uniform_routing_follows_eq8_under_both_readings():
    judged = fig1.judge_fig1(_curves({0: UNIFORM, 7: UNIFORM}))
    assert (judged.status, judged.strict_status) == (HOLDS, HOLDS)
    assert judged.layers["min_ratio"].min() == pytest.approx(1.0)
    assert judged.layers["follows"].all() and not judged.layers["beyond_noise"].any()
    assert set(judged.layers.columns) >= {"ratio_8", "ratio_32", "ratio_128", "t_at_min"}


def test_strong_skew_fails_and_a_mix_of_layers_partly_holds():
    strong = _skewed(0.9)  # 90 % of the choices on half the experts
    assert fig1.judge_fig1(_curves({0: strong})).status == FAILS
    mixed = fig1.judge_fig1(_curves({0: UNIFORM, 7: strong}))
    assert mixed.status == fig1.PARTLY
    assert mixed.layers.set_index("layer")["follows"].to_dict() == {0: True, 7: False}
    row = mixed.parts[(mixed.parts["part"] == "skew") & (mixed.parts["scope"] == "m")].iloc[0]
    assert row["worst_ratio"] < fig1.TOLERANCE and "layer 7" in row["where"]


def test_the_worst_ratio_is_the_minimum_over_t_and_not_at_the_ends():
    judged = fig1.judge_fig1(_curves({0: _skewed(0.9)}))
    worst = judged.layers.iloc[0]
    ratio = (expected_active_experts_from_popularity(fig1.TOKENS, _skewed(0.9))
             / expected_active_experts(fig1.TOKENS, E, K))
    assert worst["min_ratio"] == pytest.approx(ratio.min())
    assert 1 < worst["t_at_min"] < 256  # N(1) = K for any popularity; both saturate near E
    assert worst["ratio_32"] == pytest.approx(ratio[31])


def test_small_skew_is_material_holds_but_strict_departs_when_the_noise_is_small():
    mild = _skewed(0.55)
    ratio = (expected_active_experts_from_popularity(fig1.TOKENS, mild)
             / expected_active_experts(fig1.TOKENS, E, K))
    assert ratio.min() > fig1.TOLERANCE  # a mild skew
    precise = fig1.judge_fig1(_curves({0: mild}, se=1e-3))
    assert (precise.status, precise.strict_status) == (HOLDS, FAILS)
    noisy = fig1.judge_fig1(_curves({0: mild}, se=10.0))  # a shortfall within 3 standard errors
    assert noisy.strict_status == HOLDS


def _windows(ratios, t=(8, 32)) -> pd.DataFrame:
    rows = []
    for sequence, r in enumerate(ratios):
        for tokens in t:
            uniform = float(expected_active_experts(tokens, E, K))
            rows.append({"sequence": sequence, "layer": sequence % 3, "t": tokens, "measured": r * uniform,
                         "uniform": uniform, "popularity": uniform})
    return pd.DataFrame(rows)


def test_windows_need_five_sequences_and_are_judged_by_median_and_sign_test():
    curves = _curves({0: UNIFORM})
    few = fig1.judge_fig1(curves, _windows([0.5, 0.6]))
    row = few.parts.set_index("part").loc["windows"]
    assert row["material"] == UNTESTABLE and "fewer than 5" in row["reason"]
    assert few.status == HOLDS  # the skew part alone
    below = fig1.judge_fig1(curves, _windows([0.97, 0.98, 0.96, 0.99, 0.97]))
    row = below.parts.set_index("part").loc["windows"]
    assert (row["material"], row["strict"]) == (HOLDS, FAILS)  # all 5 below: p = 1/32 < 0.05
    assert below.strict_status == fig1.PARTLY
    low = fig1.judge_fig1(curves, _windows([0.5, 0.6, 0.7, 1.1, 1.2]))
    assert low.parts.set_index("part").loc["windows", "material"] == FAILS
    assert set(low.sequences.columns) == {"sequence", "layer", "t", "ratio", "ratio_popularity", "measured",
                                          "uniform", "popularity"}


def test_sign_test():
    assert fig1.sign_test(5, 5) == pytest.approx(1 / 32)
    assert fig1.sign_test(0, 7) == pytest.approx(1.0)
    assert fig1.sign_test(9, 10) == pytest.approx(11 / 1024)


def test_what_the_data_cannot_show_is_named():
    judged = fig1.judge_fig1(_curves({0: UNIFORM}))
    untestable = dict(judged.untestable)
    assert set(untestable) == {"windows", "batches", "decode", "paper_models"}
    assert "prefill" in untestable["decode"]
    with_paper = fig1.judge_fig1(_curves({0: UNIFORM}), checkpoints=fig1.PAPER_CHECKPOINTS[:1], decode=True)
    assert {part for part, _ in with_paper.untestable} == {"windows", "batches"}


def test_batches_are_judged_where_each_layer_has_enough_sequences():
    batches = pd.DataFrame({"layer": range(5), "tokens": 16, "measured": 30.0,
                            "uniform": float(expected_active_experts(16, E, K)), "popularity": 40.0})
    judged = fig1.judge_fig1(_curves({0: UNIFORM}), sequences_per_layer=6, batches=batches)
    row = judged.parts.set_index("part").loc["batches"]
    assert (row["material"], row["strict"]) == (FAILS, FAILS)


def test_bad_input_names_the_missing_columns():
    with pytest.raises(ValueError, match="popularity_se"):
        fig1.judge_fig1(_curves({0: UNIFORM}).drop(columns="popularity_se"))
