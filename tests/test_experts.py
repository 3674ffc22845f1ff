"""Eqs. 6-10 and 12-14: expected activated experts, tokens per expert, T_thres, Appendix B."""

import mpmath  # pinned (a dependency of sympy): an independent high-precision reference
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from moesd.theory.experts import (
    appendix_b_f,
    expected_active_experts,
    expected_active_experts_from_popularity,
    full_activation_threshold,
    most_loaded_share,
    tokens_per_expert,
    tokens_per_expert_derivative,
)

experts_and_k = st.integers(1, 256).flatmap(lambda e: st.tuples(st.just(e), st.integers(1, e)))
# N(t) <= tK and "uniform routing activates most" hold at t = 0 and for t >= 1: between 0
# and 1 token, 1 - (1 - p)**t is convex in p and N(t) lies above the chord tK.
token_counts = st.one_of(st.just(0.0), st.floats(1, 5000))
sparsities = st.floats(1e-4, 1.0)


# Values worked by hand --------------------------------------------------------------------

def test_two_tokens_by_hand():
    # 64 (1 - (56/64)^2) = 64 (1 - 0.765625) = 15
    assert expected_active_experts(2, 64, 8) == pytest.approx(15.0, rel=1e-14)
    # 8 (1 - (6/8)^2) = 3.5
    assert expected_active_experts(2, 8, 2) == pytest.approx(3.5, rel=1e-14)
    # 0.25 / 0.234375
    assert tokens_per_expert(2, 0.125) == pytest.approx(0.25 / 0.234375, rel=1e-14)
    # Half a token: 64 (1 - sqrt(7/8)) = 4.13348, above the chord t K = 4.
    assert expected_active_experts(0.5, 64, 8) == pytest.approx(4.133481811616939, rel=1e-12)


def test_worked_table_of_the_specification():
    """MOESD.md section 5: N(t) for the paper's models and T_thres."""
    tokens = [1, 2, 4, 8, 16, 32, 64, 100]
    expected = {
        (64, 8): [8.0, 15.0, 26.5, 42.0, 56.4, 63.1, 64.0, 64.0],
        (8, 2): [2.0, 3.5, 5.5, 7.2, 7.9, 8.0, 8.0, 8.0],
        (64, 6): [6.0, 11.4, 20.8, 34.9, 50.8, 61.3, 63.9, 64.0],
        (60, 4): [4.0, 7.7, 14.5, 25.5, 40.1, 53.4, 59.3, 59.9],
    }
    for (E, K), values in expected.items():
        np.testing.assert_allclose(np.round(expected_active_experts(tokens, E, K), 1), values)
    assert [full_activation_threshold(K / E) for E, K in expected] == [23, 11, 31, 44]
    thresholds = full_activation_threshold(np.array([1, 2, 4, 8, 16, 32]) / 64)
    assert thresholds.tolist() == [191, 95, 47, 23, 11, 5]
    np.testing.assert_allclose(np.round(tokens_per_expert(16, np.array([1, 2, 4, 8]) / 64), 2),
                               [1.12, 1.26, 1.55, 2.27])


def test_threshold_exact_power_is_not_pushed_up():
    # (1 - 0.5)^2 = 0.25 = 1 - 0.75 exactly: two tokens suffice.
    assert full_activation_threshold(0.5, tau=0.75) == 2
    assert full_activation_threshold(1.0) == 1


def test_threshold_is_the_smallest_whole_token_count():
    K = np.arange(1, 257)
    threshold = full_activation_threshold(K / 256, 0.9)
    assert (expected_active_experts(threshold, 256, K) >= 0.9 * 256 * (1 - 1e-12)).all()
    assert (expected_active_experts(threshold - 1, 256, K) < 0.9 * 256).all()


def test_dense_limit():
    t = np.array([1.0, 3.0, 50.0])
    np.testing.assert_allclose(tokens_per_expert(t, 1.0), t)
    np.testing.assert_allclose(expected_active_experts(t, 16, 16), 16)


def test_broadcasting_shapes():
    t = np.arange(1, 11)[:, None]
    K = np.array([1, 2, 4, 8])[None, :]
    assert expected_active_experts(t, 64, K).shape == (10, 4)
    assert tokens_per_expert(t, K / 64).shape == (10, 4)
    assert full_activation_threshold(np.full((2, 3), 0.1)).shape == (2, 3)


# Appendix B -------------------------------------------------------------------------------

def test_derivative_matches_finite_difference():
    t = np.array([2.0, 8.0, 64.0, 400.0])
    rho = np.array([0.05, 0.125, 0.3, 0.7])
    h = 1e-6
    numeric = (tokens_per_expert(t, rho + h) - tokens_per_expert(t, rho - h)) / (2 * h)
    np.testing.assert_allclose(tokens_per_expert_derivative(t, rho), numeric, rtol=1e-6)


@pytest.mark.parametrize("t", [1.0, 1.5, 2.0, 10.0, 1e4, 1e6])
@pytest.mark.parametrize("rho", [1e-300, 1e-20, 1e-9, 1e-6, 3e-6, 1e-4, 0.01, 0.5, 1.0])
def test_derivative_against_high_precision(t, rho):
    """Against Eq. 12 in 700-digit arithmetic (mpmath): within 1e-9 even where rho t is tiny,
    where the float64 closed form cancels to noise and its denominator underflows."""
    with mpmath.workdps(700):
        T, r = mpmath.mpf(t), mpmath.mpf(rho)
        activated = 1 - (1 - r)**T
        reference = T * (activated - r * T * (1 - r)**(T - 1)) / activated**2
    assert tokens_per_expert_derivative(t, rho) == pytest.approx(float(reference), rel=1e-9, abs=1e-300)


def test_threshold_up_to_the_largest_exact_count():
    """Just above the smallest allowed rho the threshold is about 2**53 tokens, and still exact Eq. 9."""
    rho = 3.4e-16
    threshold = full_activation_threshold(rho)
    assert threshold == pytest.approx(np.log(0.05) / np.log1p(-rho), rel=1e-12) and threshold < 2**53
    with pytest.raises(ValueError, match="rho must be >= 3.33e-16"):
        full_activation_threshold(3.2e-16)


def test_f_by_hand_and_limits():
    assert appendix_b_f(0.5, 2) == pytest.approx(0.75)  # 0.5 * (1 + 0.5)
    assert appendix_b_f(1.0, 3) == 0.0
    assert appendix_b_f(1e-9, 10) == pytest.approx(1.0, abs=1e-12)
    assert appendix_b_f(0.3, 1) == 1.0  # T = 1: equality, no gain from sparsity


def test_f_below_one_iff_derivative_positive_on_a_grid():
    rho, t = np.meshgrid(np.linspace(1e-3, 1, 200), np.arange(2, 200))
    f = appendix_b_f(rho, t)
    assert (f < 1).all()
    assert (tokens_per_expert_derivative(t, rho) > 0).all()


# Non-uniform routing ----------------------------------------------------------------------

def test_uniform_popularity_is_eq8():
    t = np.arange(0, 60)
    np.testing.assert_allclose(expected_active_experts_from_popularity(t, np.full(64, 8 / 64)),
                               expected_active_experts(t, 64, 8), rtol=1e-12)


def test_fixed_routing_activates_only_k_experts():
    p = np.zeros(32)
    p[:4] = 1.0
    np.testing.assert_allclose(expected_active_experts_from_popularity([0, 1, 7, 100], p),
                               [0, 4, 4, 4])


def test_popularity_per_layer_broadcasts():
    p = np.stack([np.full(8, 0.25), np.r_[np.ones(2), np.zeros(6)]])
    result = expected_active_experts_from_popularity(np.array([[3.0], [5.0]]), p)
    assert result.shape == (2, 2)


@given(experts_and_k, token_counts, st.integers(0, 2**31 - 1))
def test_skewed_popularity_never_beats_uniform(ek, t, seed):
    # Any p in [0, 1]^E with sum K is a mixture of indicator vectors of K-subsets.
    E, K = ek
    rng = np.random.default_rng(seed)
    subsets = np.zeros((3, E))
    for row in subsets:
        row[rng.choice(E, K, replace=False)] = 1.0
    p = np.minimum(rng.dirichlet(np.ones(3)) @ subsets, 1.0)  # round-off can exceed 1
    skewed = expected_active_experts_from_popularity(t, p)
    assert skewed <= expected_active_experts(t, E, K) + 1e-9
    # and never below what the tokens must activate: one token alone activates K distinct experts
    # (sum_i p_i = K), and a mixture of 3 K-subsets activates at most 3 K however many tokens
    if t >= 1:
        assert K - 1e-9 <= skewed <= min(E, 3 * K) + 1e-9


# Properties -------------------------------------------------------------------------------

@given(st.floats(1, 1e5), experts_and_k)
def test_active_experts_bounded_from_one_token(t, ek):
    """t >= 1: at least the K experts of one token, at most t K (every pick a new expert) and E."""
    E, K = ek
    n = expected_active_experts(t, E, K)
    assert K * (1 - 1e-12) <= n <= min(t * K, E) * (1 + 1e-12)


@given(st.floats(0, 1), experts_and_k)
def test_active_experts_bounded_below_one_token(t, ek):
    """0 <= t <= 1: N is concave in t with N(0) = 0 and N(1) = K, so it lies between the chord t K and K
    (above t K, not below it)."""
    E, K = ek
    n = expected_active_experts(t, E, K)
    assert t * K * (1 - 1e-12) <= n <= K * (1 + 1e-12)


@given(token_counts, st.floats(0, 100), experts_and_k)
def test_active_experts_non_decreasing(t, dt, ek):
    E, K = ek
    assert expected_active_experts(t + dt, E, K) >= expected_active_experts(t, E, K)


@given(experts_and_k)
def test_zero_and_one_token(ek):
    E, K = ek
    assert expected_active_experts(0, E, K) == 0
    assert expected_active_experts(1, E, K) == pytest.approx(K, rel=1e-12)


@given(st.floats(1, 5000), sparsities)
def test_tokens_per_expert_lower_bound(t, rho):
    assert tokens_per_expert(t, rho) >= max(1.0, rho * t) * (1 - 1e-9)
    assert tokens_per_expert(t, rho) <= t * (1 + 1e-12)


@given(st.floats(1.01, 2000), sparsities, sparsities)
def test_tokens_per_expert_increasing_in_rho(t, rho_a, rho_b):
    low, high = sorted((rho_a, rho_b))
    if high - low < 1e-6:
        return
    assert tokens_per_expert(t, low) < tokens_per_expert(t, high)


# Bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("call, name", [
    (lambda: expected_active_experts(1, 8, 9), "K"),
    (lambda: expected_active_experts(1, 0, 1), "E"),
    (lambda: expected_active_experts(1, 8.5, 2), "E"),
    (lambda: expected_active_experts(1, 8, 0), "K"),
    (lambda: expected_active_experts(-1, 8, 2), "t"),
    (lambda: expected_active_experts(np.nan, 8, 2), "t"),
    (lambda: expected_active_experts([1, np.nan], 8, 2), "t"),
    (lambda: expected_active_experts("many", 8, 2), "t"),
    (lambda: tokens_per_expert(0.5, 0.1), "t"),
    (lambda: tokens_per_expert(4, 0.0), "rho"),
    (lambda: tokens_per_expert(4, 1.5), "rho"),
    (lambda: tokens_per_expert(4, np.nan), "rho"),
    (lambda: full_activation_threshold(0.1, 1.0), "tau"),
    (lambda: full_activation_threshold(0.1, 0.0), "tau"),
    (lambda: full_activation_threshold(-0.1), "rho"),
    (lambda: tokens_per_expert_derivative(4, 0), "rho"),
    (lambda: appendix_b_f(0.5, 0.5), "t"),
    (lambda: expected_active_experts_from_popularity(3, [0.5, 0.7]), "p"),
    (lambda: expected_active_experts_from_popularity(3, [0.5, 1.2, 0.3]), "p"),
    (lambda: expected_active_experts_from_popularity(3, 0.5), "p"),
    (lambda: expected_active_experts_from_popularity(-3, [0.5, 0.5]), "t"),
])
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError, match=rf"^{name} "):
        call()


@pytest.mark.parametrize("tokens", [1, 8, 64])
def test_the_most_loaded_gpu_matches_a_monte_carlo_of_uniform_routing(tokens):
    """Each of t tokens picks K distinct experts of E uniformly; EP deals them to 8 GPUs of E / 8 each."""
    E, K, parts, samples = 256, 8, 8, 1500
    rng = np.random.default_rng(tokens)
    picks = np.argsort(rng.random((samples, tokens, E)), axis=-1)[..., :K].reshape(samples, -1)
    activated = np.zeros((samples, E), dtype=bool)
    np.put_along_axis(activated, picks, True, axis=1)
    busiest = activated.reshape(samples, parts, E // parts).sum(-1).max(-1)
    N = expected_active_experts(tokens, E, K)
    predicted = most_loaded_share(N, E, parts)
    assert predicted == pytest.approx(busiest.mean(), rel=0.03)
    assert N / parts <= predicted <= min(N, E / parts)


def test_the_most_loaded_share_at_its_limits():
    assert most_loaded_share(np.array([0.0, 17.5, 64.0]), 64, 1).tolist() == [0.0, 17.5, 64.0]  # one GPU: all
    assert most_loaded_share(64.0, 64, 4) == pytest.approx(16) and most_loaded_share(0.0, 64, 4) == pytest.approx(0)
    # one activated expert: one GPU holds it; two of 4 experts on 2 GPUs: together (chance 2/6) or apart
    assert most_loaded_share(1.0, 64, 4) == pytest.approx(1.0, rel=1e-12)
    assert most_loaded_share(2.0, 4, 2) == pytest.approx(2 * 2 / 6 + 1 * 4 / 6, rel=1e-12)
    assert most_loaded_share(1.5, 4, 2) == pytest.approx((1 + 4 / 3) / 2, rel=1e-12)  # between whole counts
    for bad, match in (((10.0, 64, 3), "parts must divide"), ((70.0, 64, 4), "active"), ((1.0, 64, 0), "parts"),
                       ((1.0, 2048, 2), "E must be at most")):
        with pytest.raises(ValueError, match=match):
            most_loaded_share(*bad)
