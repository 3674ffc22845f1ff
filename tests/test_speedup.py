"""Eqs. 2-5: sigma, its inverse, SD time, speedup, target efficiency, Leviathan's factor."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from moesd.theory.acceptance import rounds_to_generate
from moesd.theory.speedup import (
    alpha_from_sigma,
    expected_tokens_per_round,
    leviathan_speedup,
    min_target_efficiency,
    sd_time,
    sigma,
    speedup,
    speedup_terms,
    target_efficiency,
)

alphas = st.floats(0, 1)
gammas = st.integers(1, 16)


def test_sigma_by_hand():
    # (1 - 0.5^3) / (0.5 * 3) = 0.875 / 1.5
    assert sigma(0.5, 2) == pytest.approx(0.875 / 1.5, rel=1e-14)
    assert expected_tokens_per_round(0.5, 2) == pytest.approx(1.75, rel=1e-14)
    assert sigma(0.0, 4) == pytest.approx(0.2)
    assert sigma(1.0, 4) == 1.0


def test_alpha_from_sigma_on_table_1():
    """MOESD.md: sigma 0.94/0.93/0.91 at gamma 2/3/4 imply alpha 0.939/0.952/0.953."""
    alpha = alpha_from_sigma([0.94, 0.93, 0.91], [2, 3, 4])
    np.testing.assert_allclose(np.round(alpha, 3), [0.939, 0.952, 0.953])


def test_alpha_from_sigma_at_the_ends():
    assert alpha_from_sigma(1 / 3, 2) == pytest.approx(0.0, abs=1e-12)
    assert alpha_from_sigma(1.0, 5) == 1.0


def test_sd_time_by_hand():
    # 10 rounds x (3 x 1 + 2 + 0.5)
    assert sd_time(10, 3, 1.0, 2.0, 0.5) == pytest.approx(55.0)


def test_speedup_by_hand():
    # sigma (gamma+1) = 4.5; denominator 1.25 + 4 x 0.05 + 0.01 = 1.46
    assert speedup(0.9, 4, 1.0, 1.25, 0.05, 0.01) == pytest.approx(4.5 / 1.46)
    assert target_efficiency(1.0, 1.25) == pytest.approx(0.8)


def test_speedup_equals_time_ratio_of_eqs_2_and_3():
    """T_AR / T_SD with S = R sigma (gamma + 1) is Eq. 4."""
    rounds, gamma, s = 50, 3, 0.8
    t1, tg, td, tr = 0.020, 0.026, 0.002, 0.0005
    tokens = rounds * s * (gamma + 1)
    ratio = tokens * t1 / sd_time(rounds, gamma, td, tg, tr)
    assert speedup(s, gamma, t1, tg, td, tr) == pytest.approx(ratio, rel=1e-14)


def test_terms_recombine_and_bound():
    terms = speedup_terms(0.9, 4, 1.0, 2.0, 0.05, 0.01)
    assert terms.tokens_per_round == pytest.approx(4.5)
    assert terms.verify == pytest.approx(2.0)
    assert terms.target_efficiency == pytest.approx(0.5)
    assert terms.draft == pytest.approx(0.2)
    assert terms.reject == pytest.approx(0.01)
    assert terms.speedup == pytest.approx(4.5 / 2.21)


def test_min_target_efficiency_is_reached_with_free_drafting():
    # 2.29 / (0.90 x 5): Table 2's peak needed verification at most ~1.96 decode steps.
    assert min_target_efficiency(2.29, 0.90, 4) == pytest.approx(2.29 / 4.5)
    efficiency = 0.7
    observed = speedup(0.8, 3, 1.0, 1.0 / efficiency, 0.0, 0.0)
    assert min_target_efficiency(observed, 0.8, 3) == pytest.approx(efficiency)
    assert min_target_efficiency(speedup(0.8, 3, 1.0, 1 / efficiency, 0.02), 0.8, 3) < efficiency


def test_leviathan_by_hand():
    # alpha 0.8, gamma 4, c 0.05: (1 - 0.8**5) / ((1 - 0.8) (4 x 0.05 + 1)) = 0.67232 / 0.24 = 2.80133
    assert leviathan_speedup(0.8, 4, 0.05) == pytest.approx(0.67232 / 0.24, rel=1e-12)
    assert leviathan_speedup(0.8, 4, 0.05) == pytest.approx(2.801333, rel=1e-6)
    assert leviathan_speedup(1.0, 4, 0.0) == pytest.approx(5.0)  # every draft accepted, free drafting


@given(alphas, gammas, st.floats(0, 1))
def test_leviathan_is_eq4_with_unit_target_efficiency(alpha, gamma, c):
    ours = speedup(sigma(alpha, gamma), gamma, 1.0, 1.0, c, 0.0)
    assert leviathan_speedup(alpha, gamma, c) == pytest.approx(ours, rel=1e-12)


@given(alphas, gammas)
def test_sigma_in_range(alpha, gamma):
    value = sigma(alpha, gamma)
    assert 1 / (gamma + 1) * (1 - 1e-12) <= value <= 1


@given(alphas, st.floats(0, 1), gammas)
def test_sigma_increasing_in_alpha(a, b, gamma):
    low, high = sorted((a, b))
    assert sigma(low, gamma) <= sigma(high, gamma) + 1e-15


@given(alphas, gammas)
def test_alpha_from_sigma_inverts_sigma(alpha, gamma):
    s = sigma(alpha, gamma)
    # Where sigma is flat (alpha near 0) alpha is determined only to sqrt(eps) or so.
    assert sigma(alpha_from_sigma(s, gamma), gamma) == pytest.approx(s, rel=1e-12, abs=1e-14)
    assert alpha_from_sigma(s, gamma) == pytest.approx(alpha, abs=1e-7)


@given(alphas, st.integers(65, 10**9))
def test_alpha_from_sigma_inverts_sigma_for_long_drafts(alpha, gamma):
    """Past gamma = 64 the inverse bisects the closed form, in a time independent of gamma."""
    assert alpha_from_sigma(sigma(alpha, gamma), gamma) == pytest.approx(alpha, abs=1e-12)


def test_alpha_from_sigma_mixes_short_and_long_drafts():
    alpha = np.array([0.3, 0.9, 0.99, 0.5])
    gamma = np.array([4, 100, 64, 100_000])
    np.testing.assert_allclose(alpha_from_sigma(sigma(alpha, gamma), gamma), alpha, atol=1e-12)


def test_alpha_from_sigma_broadcasts_over_gamma():
    alpha = np.linspace(0, 1, 11)[:, None]
    gamma = np.array([1, 2, 5, 9])[None, :]
    np.testing.assert_allclose(alpha_from_sigma(sigma(alpha, gamma), gamma),
                               np.broadcast_to(alpha, (11, 4)), atol=1e-7)


@pytest.mark.parametrize("call, name", [
    (lambda: sigma(1.2, 2), "alpha"),
    (lambda: sigma(-0.1, 2), "alpha"),
    (lambda: sigma(0.5, 0), "gamma"),
    (lambda: sigma(0.5, 2.5), "gamma"),
    (lambda: sigma(np.nan, 2), "alpha"),
    (lambda: alpha_from_sigma(0.2, 2), "sigma"),
    (lambda: alpha_from_sigma(1.01, 2), "sigma"),
    (lambda: alpha_from_sigma(np.nan, 2), "sigma"),
    (lambda: target_efficiency(0.0, 1.0), "t_target_1"),
    (lambda: target_efficiency(1.0, -1.0), "t_target_gamma"),
    (lambda: sd_time(-1, 2, 1, 1, 1), "rounds"),
    (lambda: sd_time(1, 2, -1, 1, 1), "t_draft"),
    (lambda: speedup(0.1, 4, 1, 1, 0.1), "sigma"),
    (lambda: speedup(0.9, 4, 1, 1, 0.1, -0.1), "t_reject"),
    (lambda: leviathan_speedup(0.5, 2, -1), "cost_ratio"),
    (lambda: min_target_efficiency(0, 0.9, 2), "observed_speedup"),
])
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError, match=rf"^{name} "):
        call()


def test_eq4_at_times_near_the_float_maximum_does_not_overflow():
    """gamma T_D once overflowed to inf (a speedup of 0.0 with only a numpy warning); the ratios come first now."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert speedup(0.5, 4, 1e308, 1e308, 1e308, 1e308) == pytest.approx(2.5 / 6)
    # a verification 1e600 times a decode step is no float64: refused, naming the arguments (was inf in a field)
    with pytest.raises(ValueError, match="speedup_terms: sigma = 0.5, gamma = 2, t_target_1 = 1e-300, t_target_gamma "
                                         "= 1e[+]300, t_draft = 1, t_reject = 0 make a result a float64 cannot hold"):
        speedup_terms(0.5, 2, 1e-300, 1e300, 1.0)


def test_rounds_to_generate_lie_between_full_and_no_acceptance():
    rng = np.random.default_rng(0)
    none = rounds_to_generate(0.0, 4, 16, 3, 5, rng)  # nothing accepted: one token a round
    assert none.shape == (5, 3) and (none == 16).all()
    nearly = rounds_to_generate(1 - 1e-12, 4, 16, 3, 5, rng)  # every draft accepted: gamma + 1 tokens a round
    assert (nearly == 4).all()  # ceil(16 / 5)
    some = rounds_to_generate(0.7, 4, 16, 8, 400, rng)
    assert 4 <= some.min() and some.max() <= 16
    expected = 16 / (1 + sum(0.7 ** i for i in range(1, 5)))  # tokens over the expected tokens per round
    assert abs(some.mean() - expected) < 1.0  # rounds end in a partly used round: about half a round more
