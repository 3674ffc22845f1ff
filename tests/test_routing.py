"""Routing into the verification cost: activated experts under four routing models, the expert-bytes
ratio and the roofline target efficiency, against hand computation and moesd.theory.roofline."""

import numpy as np
import pytest

from moesd.theory.roofline import HARDWARE, ffn_target_efficiency
from moesd.routing.loads import activated_experts, routed_ffn_target_efficiency, verification_expert_ratio
from moesd.routing.traces import RoutingTrace


def correlated_trace(sequences=60, length=20, E=32, K=2, seed=0):
    """Each sequence repeats one token's routing: consecutive tokens share every expert."""
    rng = np.random.default_rng(seed)
    per_sequence = np.argsort(rng.random((sequences, 2, E)), axis=-1)[..., :K]
    return RoutingTrace(np.repeat(per_sequence, length, axis=0), E,
                        sequence=np.repeat(np.arange(sequences), length), position=np.tile(np.arange(length), sequences))


def test_windows_model_by_hand():
    # One sequence {0,1}, {0,1}, {2,3}: windows of 2 are {0,1} and {0,1,2,3}, so q = 1, 1, 1/2, 1/2 on
    # experts 0-3 and N(B = 2) = 1 + 1 + (1 - 1/4) + (1 - 1/4) = 3.5.
    trace = RoutingTrace(np.array([[[0, 1]], [[0, 1]], [[2, 3]]]), 6)
    assert activated_experts(trace, 2, 2, "windows").tolist() == [3.5]
    # With w = 1 the window model is the popularity model: p = 2/3, 2/3, 1/3, 1/3 and N(2) = 2 (8/9) + 2 (5/9).
    assert activated_experts(trace, 2, 1, "windows") == pytest.approx([2 * 8 / 9 + 2 * 5 / 9])
    assert activated_experts(trace, 2, 1, "popularity") == pytest.approx([2 * 8 / 9 + 2 * 5 / 9])


def test_uniform_popularity_is_eq8_and_broadcasts():
    p = np.full(64, 8 / 64)
    got = activated_experts(p, [1, 2, 4], [[1], [4]], "popularity")
    assert got.shape == (2, 3, 1)
    assert got[1, 0, 0] == pytest.approx(64 * (1 - (56 / 64) ** 4))  # 26.48, Eq. 8 at t = 4
    np.testing.assert_allclose(got, activated_experts(p, [1, 2, 4], [[1], [4]], "uniform"))


def test_windows_model_sees_correlated_routing_and_eq8_does_not():
    trace = correlated_trace()
    windows = activated_experts(trace, 4, 5, "windows")
    measured = activated_experts(trace, 4, 5, "measured", samples=2000)
    np.testing.assert_allclose(windows, measured, rtol=0.05)
    # Four sequences of repeated routing load what four independent tokens do: Eq. 8 at t = 4, not 20.
    np.testing.assert_allclose(windows, 32 * (1 - (30 / 32) ** 4), rtol=0.08)
    assert (activated_experts(trace, 4, 5, "uniform") > 1.5 * measured).all()


def test_expert_ratio_lies_between_one_and_w():
    trace = correlated_trace()
    assert verification_expert_ratio(trace, 4, 5, "windows") == pytest.approx(1.0, abs=0.02)
    uniform = verification_expert_ratio(trace, np.array([1, 4, 64]), 5, "uniform")
    assert uniform[0] == pytest.approx(32 * (1 - (30 / 32) ** 5) / 2)  # N(5) / N(1), Eq. 8
    assert (np.diff(uniform) < 0).all() and (uniform >= 1).all() and (uniform <= 5).all()


def test_routed_target_efficiency_with_eq8_counts_is_the_roofline_one():
    trace = correlated_trace()
    batch = np.array([1, 2, 8, 64, 512])
    routed = routed_ffn_target_efficiency(trace, batch, 4, HARDWARE["H100"], 2048, 1408, model="uniform")
    np.testing.assert_allclose(routed, ffn_target_efficiency(batch, 4, HARDWARE["H100"], 2048, 1408, 32, 2))
    correlated = routed_ffn_target_efficiency(trace, batch[:2], 4, HARDWARE["H100"], 2048, 1408, model="windows")
    assert (correlated > routed[:2]).all() and (correlated <= 1).all()


@pytest.mark.parametrize("call, message", [
    (lambda t: activated_experts(t, 2, 1, "mean"), "model must be one of"),
    (lambda t: activated_experts(np.full(8, 0.25), 2, 2, "windows"), "needs a RoutingTrace"),
    (lambda t: activated_experts(np.full((2, 2, 8), 0.25), 2, 1), r"shape \(E,\) or \(layers, E\)"),
    (lambda t: activated_experts(t, 2.5, 2, "measured"), "whole batch sizes"),
    (lambda t: activated_experts(t, 2, 1.5), "tokens_per_sequence must be a whole number"),
    (lambda t: activated_experts(t, -1, 1), "batch_size must be .*>= 0"),
])
def test_bad_inputs(call, message):
    with pytest.raises(ValueError, match=message):
        call(correlated_trace(sequences=4, length=5))
