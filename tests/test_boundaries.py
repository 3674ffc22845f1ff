"""Boundary cases that a mutation pass over the theory found untested (tools/mutants.py): each test fails when
one operator or constant of the code it names is changed.

* the 2**53 limit of Eq. 9's threshold (``full_activation_threshold``);
* the rounding before ``ceil`` there, which keeps an exact whole ratio from being pushed up by one;
* the clip after Newton's steps in ``alpha_from_sigma``, which keeps alpha in [0, 1] at the floor of sigma;
* the 1e-12 tolerance of the Eq. 4 ceiling check in ``min_target_efficiency``;
* ``any`` (not ``all``) over layers when ``random_union`` leaves out tokens with unlogged entries;
* the ranges of acceptance by draft position, and the tolerance of the acceptance length's inversion;
* the first token count ``compute_bound_tokens`` searches (one token), and the zero latencies of a device record
  that names no link (``Hardware``'s defaults).
"""

import numpy as np
import pytest
from oracles import random_trace

from moesd.routing.traces import MISSING, RoutingTrace
from moesd.routing.unions import random_union
from moesd.theory.acceptance import alpha_for_acceptance_length, position_acceptance, tokens_per_round
from moesd.theory.experts import full_activation_threshold
from moesd.theory.roofline import Hardware, compute_bound_tokens
from moesd.theory.speedup import alpha_from_sigma, min_target_efficiency

TAU = 0.95


def rho_for_threshold(tokens: float, tau: float = TAU) -> float:
    """The sparsity whose exact Eq. 9 ratio ``log(1 - tau) / log(1 - rho)`` is ``tokens``."""
    return float(-np.expm1(np.log1p(-tau) / tokens))


def test_threshold_counts_up_to_2_to_the_53_and_refuses_beyond():
    """Below 2**53 tokens the threshold is a whole number float64 still counts; above, it is refused, and the
    message gives the smallest sparsity that works."""
    below = full_activation_threshold(rho_for_threshold(0.75 * 2**53))
    assert 0.74 * 2**53 < below <= 0.76 * 2**53 and isinstance(below, int)
    smallest = rho_for_threshold(2.0**53)
    with pytest.raises(ValueError, match=rf"rho must be >= {smallest:.3g} for tau = 0.95 \(T_thres would exceed 2\*\*53"):
        full_activation_threshold(rho_for_threshold(1.5 * 2**53))
    with pytest.raises(ValueError, match="exceed 2"):
        full_activation_threshold(rho_for_threshold(1.01 * 2**53))
    rho = 1.0057759593016345e-16  # with this tau, log(1 - tau) / log(1 - rho) is 2**53 exactly: still counted
    tau = float(-np.expm1(np.log1p(-rho) * 2.0**53))
    assert np.log1p(-tau) / np.log1p(-rho) == 2.0**53
    assert full_activation_threshold(rho, tau) == 2**53


@pytest.mark.parametrize("rho, tokens", [(0.25, 3), (0.25, 6), (0.25, 9), (0.5, 29), (0.5, 31)])
def test_an_exact_whole_ratio_is_not_pushed_up_by_float_noise(rho, tokens):
    """With ``tau = 1 - (1 - rho)**t`` exactly, ``t`` tokens reach ``tau E`` (Eq. 9's definition), though the float
    ratio of logarithms lands a hair above ``t`` (3.0000000000000004 for rho = 1/4, t = 3)."""
    tau = 1 - (1 - rho) ** tokens
    assert np.log1p(-tau) / np.log1p(-rho) > tokens  # the noise the rounding removes
    assert full_activation_threshold(rho, tau) == tokens
    assert 1 - (1 - rho) ** (tokens - 1) < tau  # one token fewer does not reach it


@pytest.mark.parametrize("gamma", range(1, 65))
def test_alpha_stays_in_the_unit_interval_at_both_ends_of_sigma(gamma):
    """At sigma's floor 1 / (gamma + 1) no draft token is accepted (alpha = 0), at 1 all are (alpha = 1); Newton's
    steps from the table would leave [0, 1] by a rounding error at the floor (gamma = 48: -7.5e-17)."""
    floor = alpha_from_sigma(1 / (gamma + 1), gamma)
    top = alpha_from_sigma(1.0, gamma)
    assert 0.0 <= floor <= 1e-12 and 1 - 1e-12 <= top <= 1.0
    inside = alpha_from_sigma(np.linspace(1 / (gamma + 1), 1, 41), gamma)
    assert ((inside >= 0) & (inside <= 1)).all()


def test_a_speedup_at_the_ceiling_up_to_rounding_is_allowed_and_one_above_is_not():
    """sigma (gamma + 1) computed in another order differs from the ceiling by one rounding error (2.2e-16
    relative): that is the ceiling, bound 1; a speedup 1e-9 above it is refused."""
    sigma, gamma = 0.3, 5
    at_ceiling = sigma * gamma + sigma  # 1.8000000000000003 where sigma * (gamma + 1) = 1.8
    assert at_ceiling / (sigma * (gamma + 1.0)) > 1.0
    assert min_target_efficiency(at_ceiling, sigma, gamma) == pytest.approx(1.0, abs=1e-15)
    with pytest.raises(ValueError, match="Eq. 4's ceiling"):
        min_target_efficiency(sigma * (gamma + 1) * (1 + 1e-9), sigma, gamma)
    assert min_target_efficiency(1 + 1e-12, 0.5, 1) == 1 + 1e-12  # the tolerance itself is allowed (ceiling 1.0)


def test_random_union_leaves_out_a_token_unlogged_in_one_layer():
    """A token with one unlogged (token, layer) entry is left out of the draws, though its other layers are logged:
    with t the number of complete tokens, every draw is all of them."""
    base = random_trace(seed=3, tokens=6, layers=2, E=16, K=2, sequences=2, calls=2)
    experts = base.experts.copy()
    experts[0, 1] = MISSING  # token 0: logged in layer 0, not in layer 1
    trace = RoutingTrace(experts, base.num_experts, base.sequence, base.position, base.call, layers=base.layers)
    with pytest.raises(ValueError, match=r"t must be a whole number in \[1, 5\]"):
        random_union(trace, 6, samples=3)
    drawn = random_union(trace, 5, samples=3)
    for layer_index, layer in enumerate(trace.layers):
        everyone = len(set(experts[1:, layer_index].ravel().tolist()))
        assert (drawn.loc[drawn["layer"] == layer, "union"] == everyone).all()


def test_acceptance_by_position_refuses_values_outside_their_ranges():
    """alpha and decay are probabilities in [0, 1], gamma whole in [1, 4096]; each edge itself is allowed."""
    assert position_acceptance(1.0, 4096, 1.0).shape == (4096,) and position_acceptance(0.5, 1).tolist() == [0.5]
    for arguments, name in [((1.001, 3), "alpha"), ((0.5, 3, 1.001), "decay"), ((0.5, 4097), "gamma"),
                            ((0.5, 0), "gamma")]:
        with pytest.raises(ValueError, match=name):
            position_acceptance(*arguments)
    assert tokens_per_round([1.0, 1.0]) == 3.0
    with pytest.raises(ValueError, match="acceptance"):
        tokens_per_round([0.5, 1.001])


def test_acceptance_length_is_inverted_up_to_every_draft_accepted_and_no_further():
    """A length of 1 (nothing accepted) gives alpha 0, the longest (every draft accepted) alpha 1, even when it
    is one float step longer; a length beyond it, or below 1, is refused, also when
    only one value of an array is."""
    assert alpha_for_acceptance_length(1.0, 3) == pytest.approx(0.0, abs=1e-9)
    alpha = alpha_for_acceptance_length(1.5, 3)  # 1 + a + a^2 + a^3 = 1.5
    assert 1 + alpha + alpha**2 + alpha**3 == pytest.approx(1.5, abs=1e-9)
    longest = float(tokens_per_round(position_acceptance(1.0, 3, 0.9)))  # 1 + 1 + 0.9 + 0.729 = 3.629
    assert alpha_for_acceptance_length(np.nextafter(longest, 4.0), 3, 0.9) == pytest.approx(1.0, abs=1e-9)
    assert alpha_for_acceptance_length(4096 + 1, 4096) == pytest.approx(1.0, abs=1e-9)
    assert alpha_for_acceptance_length(2.0 + 1e-12, 1) == pytest.approx(1.0, abs=1e-9)  # gamma 1, the tolerance itself
    for length, gamma, match in [(longest + 1e-9, 3, "at most 3.629"), (0.999, 3, "length"),
                                 ([2.0, 4.5], 3, "at most 4 tokens"), (2.0, 4097, "gamma")]:
        with pytest.raises(ValueError, match=match):
            alpha_for_acceptance_length(length, gamma, 0.9 if length == longest + 1e-9 else 1.0)


def test_a_device_whose_ridge_point_one_token_reaches_is_compute_bound_from_one_token():
    """A bf16 FFN does about 1 FLOP per byte at one token; a device with a ridge point of 0.1 FLOP per byte is
    compute-bound there already, and the search says 1, not the next count."""
    toy = Hardware("toy", peak_flops=1e12, memory_bandwidth=1e13, memory_bytes=1e9, source="test")
    assert toy.ridge_point == pytest.approx(0.1)
    assert compute_bound_tokens(toy, 1024, 4096) == 1


def test_a_device_that_names_no_link_adds_no_latency():
    toy = Hardware("toy", peak_flops=1e12, memory_bandwidth=1e12, memory_bytes=1e9, source="test")
    assert toy.interconnect_latency == 0.0 and toy.internode_latency == 0.0
