"""How many experts a batch of tokens activates, and how many tokens each one gets.

The paper's Section 3.2 assumes each token picks ``K`` of ``E`` experts uniformly and
independently. Then an expert is activated by ``t`` tokens with probability
``1 - (1 - rho)**t`` (Eq. 7), where ``rho = K / E`` is the MoE sparsity, and

* ``N(t) = E (1 - (1 - rho)**t)`` experts are activated on average (Eq. 8);
* ``T_thres = ceil(log_(1 - rho)(1 - tau))`` tokens activate at least ``tau E`` of them (Eq. 9);
* each activated expert processes ``T_exp = t K / N(t) = rho t / (1 - (1 - rho)**t)``
  tokens (Eq. 10), its arithmetic intensity in a memory-bound GEMM.

Appendix B shows ``T_exp`` falls as ``rho`` falls for ``t > 1`` (Eqs. 12-14): sparser
models keep experts memory-bound at larger batches. Real routing is not uniform;
:func:`expected_active_experts_from_popularity` generalises Eq. 8 to measured per-expert
selection probabilities.

Every function broadcasts over numpy arrays and raises ``ValueError`` naming the argument,
the value and what is allowed on input outside its domain.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from moesd._checks import UsageError, as_array, broadcast, finite_results, within_memory


def _log_miss(t: np.ndarray, rho: np.ndarray) -> np.ndarray:
    """``log((1 - rho)**t)``, the log-probability that ``t`` tokens all skip one expert."""
    with np.errstate(divide="ignore", invalid="ignore"):
        value = t * np.log1p(-rho)
    return np.where(t == 0.0, 0.0, value)  # (1 - 1)**0 = 1, not 0 * -inf


def _activation_probability(t: np.ndarray, rho: np.ndarray) -> np.ndarray:
    """``1 - (1 - rho)**t`` (Eq. 7), accurate for small ``rho``."""
    return -np.expm1(_log_miss(t, rho))


_LARGEST_EXACT_COUNT = 2.0**53
"""Beyond this, float64 no longer holds every whole number: a larger ``T_thres`` is not exact."""


@finite_results
def sparsity(E, K):
    """MoE sparsity ``rho = K / E``, the probability that one token selects a given expert.

    Parameters
    ----------
    E : array_like
        Routed experts per MoE layer (whole number >= 1).
    K : array_like
        Experts each token activates (whole number, 1 <= K <= E).

    Returns
    -------
    numpy.ndarray or float
        ``rho`` in (0, 1].
    """
    E = as_array("E", E, low=1, whole=True)
    K = as_array("K", K, low=1, whole=True)
    broadcast(E=E, K=K)
    over = K > E
    if over.any():
        k, e = np.broadcast_arrays(K, E)
        raise UsageError(f"K must be <= E (a token cannot pick more experts than exist), "
                         f"got K = {k[over].flat[0]:g} with E = {e[over].flat[0]:g}")
    return K / E


@finite_results
def expected_active_experts(t, E, K):
    """Expected number of distinct experts activated by ``t`` tokens (Eq. 8).

    ``N(t) = E (1 - ((E - K) / E)**t)``, for tokens that each pick ``K`` of ``E`` experts
    uniformly and independently.

    Parameters
    ----------
    t : array_like
        Tokens passing through the gate in one forward pass (tokens, >= 0; real values allowed).
    E : array_like
        Routed experts per MoE layer (whole number >= 1).
    K : array_like
        Experts each token activates (whole number, 1 <= K <= E).

    Returns
    -------
    numpy.ndarray or float
        Expected activated experts. For ``t >= 1`` between ``K`` and ``min(t K, E)``; for
        ``0 <= t <= 1`` between ``t K`` and ``K``: N is concave in t with ``N(0) = 0`` and
        ``N(1) = K``, so it lies above that chord (``N(0.5; E=64, K=8) = 4.1335 > 4``).

    Examples
    --------
    >>> round(float(expected_active_experts(4, 64, 8)), 2)
    26.48
    """
    t = as_array("t", t, low=0)
    rho = sparsity(E, K)
    broadcast(t=t, E=E, K=K)
    return np.asarray(E, dtype=float) * _activation_probability(t, rho)


@finite_results
def tokens_per_expert(t, rho):
    """Mean number of tokens each activated expert processes (Eq. 10).

    ``T_exp(t; rho) = t K / N(t) = rho t / (1 - (1 - rho)**t)``.

    Parameters
    ----------
    t : array_like
        Tokens passing through the gate (tokens, >= 1: with fewer than one token the
        ratio has no meaning).
    rho : array_like
        Sparsity ``K / E`` in (0, 1]; ``rho = 1`` is a dense FFN, where ``T_exp = t``.

    Returns
    -------
    numpy.ndarray or float
        Tokens per activated expert, at least ``max(1, rho t)`` and at most ``t``.
    """
    t = as_array("t", t, low=1)
    rho = as_array("rho", rho, low=0, high=1, low_open=True)
    broadcast(t=t, rho=rho)
    return rho * t / _activation_probability(t, rho)


@finite_results
def full_activation_threshold(rho, tau=0.95):
    """Fewest tokens that activate at least a fraction ``tau`` of the experts (Eq. 9).

    ``T_thres = ceil(log_(1 - rho)(1 - tau))``: the smallest whole ``t`` with
    ``N(t) >= tau E``. Once a decode batch has ``B >= T_thres`` tokens, verifying draft
    tokens loads almost no new expert weights.

    Parameters
    ----------
    rho : array_like
        Sparsity ``K / E`` in (0, 1].
    tau : array_like, default 0.95
        Fraction of experts counted as "almost all", in (0, 1).

    Returns
    -------
    numpy.ndarray or int
        The threshold in tokens (whole numbers, >= 1).

    Raises
    ------
    ValueError
        For ``rho`` or ``tau`` outside their ranges, and for a ``rho`` so small that the threshold
        exceeds 2**53 tokens (``rho`` below about 3.3e-16 at ``tau = 0.95``), where float64 no
        longer represents every whole number.
    """
    rho = as_array("rho", rho, low=0, high=1, low_open=True)
    tau = as_array("tau", tau, low=0, high=1, low_open=True, high_open=True)
    broadcast(rho=rho, tau=tau)
    with np.errstate(divide="ignore"):
        exact = np.log1p(-tau) / np.log1p(-rho)
    too_large = exact > _LARGEST_EXACT_COUNT
    if too_large.any():
        rho_, tau_ = (np.broadcast_to(a, exact.shape)[too_large].flat[0] for a in (rho, tau))
        smallest = -np.expm1(np.log1p(-tau_) / _LARGEST_EXACT_COUNT)
        raise UsageError(f"rho must be >= {smallest:.3g} for tau = {tau_:g} (T_thres would exceed 2**53 "
                         f"tokens, where float64 stops counting whole numbers), got {rho_:g}")
    # Round away float noise first so that an exact whole ratio is not pushed up by one.
    threshold = np.maximum(np.ceil(np.round(exact, 9)), 1.0).astype(np.int64)
    return threshold if threshold.ndim else int(threshold)


@finite_results
def tokens_per_expert_derivative(t, rho):
    """Derivative of ``T_exp`` with respect to ``rho`` at fixed ``t`` (Appendix B, Eq. 12).

    ``dT_exp/drho = t (1 - (1 - rho)**t - rho t (1 - rho)**(t - 1)) / (1 - (1 - rho)**t)**2``,
    positive for ``t > 1``: fewer tokens per expert as the model gets sparser.

    Parameters
    ----------
    t : array_like
        Tokens (>= 1).
    rho : array_like
        Sparsity in (0, 1].

    Returns
    -------
    numpy.ndarray or float
        Tokens per unit of sparsity.
    """
    t = as_array("t", t, low=1)
    rho = as_array("rho", rho, low=0, high=1, low_open=True)
    broadcast(t=t, rho=rho)
    activated = _activation_probability(t, rho)
    with np.errstate(divide="ignore", invalid="ignore", under="ignore"):
        numerator = t * (activated - rho * t * np.exp(_log_miss(t - 1.0, rho)))
        exact = numerator / activated / activated
    # For rho t << 1 the numerator cancels to rounding noise (and activated**2 underflows): use the
    # Taylor series T_exp = 1 + (t - 1) rho / 2 + (t**2 - 1) rho**2 / 12 + O((rho t)**3) instead,
    # whose truncation error there is below the noise of the closed form.
    series = (t - 1.0) / 2.0 + (t - 1.0) / 6.0 * ((t + 1.0) * rho)
    return np.where(rho * t < _SERIES_BELOW, series, exact)


_SERIES_BELOW = 1e-5
"""``rho t`` under which :func:`tokens_per_expert_derivative` uses its Taylor series."""


@finite_results
def appendix_b_f(rho, t):
    """``F(rho; T) = (1 - rho)**(T - 1) (rho T + 1 - rho)`` (Appendix B, Eq. 13).

    Eq. 12 is positive exactly when ``F < 1``. ``F`` tends to 1 as ``rho`` tends to 0 and
    falls with ``rho`` for ``T > 1`` (Eq. 14: ``dF/drho = -rho T (T - 1)(1 - rho)**(T - 2)``),
    so ``F < 1`` on (0, 1].

    Parameters
    ----------
    rho : array_like
        Sparsity in (0, 1].
    t : array_like
        Tokens ``T`` (>= 1).

    Returns
    -------
    numpy.ndarray or float
        The dimensionless ``F``.
    """
    rho = as_array("rho", rho, low=0, high=1, low_open=True)
    t = as_array("t", t, low=1)
    broadcast(rho=rho, t=t)
    return np.exp(_log_miss(t - 1.0, rho)) * (rho * t + 1.0 - rho)


@finite_results
def expected_active_experts_from_popularity(t, p):
    """Expected activated experts for ``t`` tokens with non-uniform routing.

    ``N(t) = sum_i 1 - (1 - p_i)**t``, where ``p_i`` is the probability that one token
    selects expert ``i``. With ``p_i = K / E`` for all ``i`` this is Eq. 8; for ``t >= 1``
    any other ``p`` with the same sum ``K`` activates fewer experts (each term is concave
    in ``p_i`` there).
    Tokens are still independent: correlation between consecutive tokens lowers the
    count further (see :mod:`moesd.routing.unions`).

    Parameters
    ----------
    t : array_like
        Tokens (>= 0). Broadcast against ``p`` without its last axis.
    p : array_like
        Per-token selection probabilities, shape ``(..., E)``, each in [0, 1], summing to
        ``K`` over the last axis (a whole number >= 1), e.g. measured expert popularity.

    Returns
    -------
    numpy.ndarray or float
        Expected activated experts, shape ``broadcast(t, p[..., 0])``.

    Raises
    ------
    UsageError
        Also where the work would need more than :data:`moesd._checks.MEMORY_LIMIT` bytes (three float arrays
        of ``t.size x E`` values): Eq. 8 (:func:`expected_active_experts`) needs no array of ``E``.
    """
    t = as_array("t", t, low=0)
    p = as_array("p", p, low=0, high=1)
    if p.ndim == 0 or p.shape[-1] == 0:
        raise UsageError(f"p must have a last axis over the experts (at least one), got shape {p.shape}")
    total = p.sum(axis=-1)
    wrong = (total < 1 - 1e-6) | (np.abs(total - np.round(total)) > 1e-6 * total)
    if wrong.any():
        raise UsageError(f"p must sum to a whole number K >= 1 over its last axis, "
                         f"got a sum of {total[wrong].flat[0] if total.ndim else total.item():.6g}")
    shape = broadcast(t=t, **{"p[..., 0]": p[..., 0]})
    within_memory(f"expected_active_experts_from_popularity over E = {p.shape[-1]} experts x {math.prod(shape)} "
                  f"token counts", 3 * math.prod(shape) * p.shape[-1])  # three temporaries of that size
    return np.sum(_activation_probability(np.expand_dims(t, -1), p), axis=-1)


@finite_results
def most_loaded_share(active, E, parts):
    """Expected activated experts on the most loaded of ``parts`` GPUs that each hold ``E / parts`` experts.

    Expert parallelism deals whole experts to GPUs, and a forward pass waits for the GPU that loads
    the most activated experts. Under uniform routing every set of ``m`` activated experts is equally
    likely, so the chance that no GPU holds more than ``k`` of them is a count of placements,
    ``[x^m] (sum_{j<=k} C(n, j) x^j)^parts / C(E, m)`` with ``n = E / parts``, and the expected
    maximum is ``sum_k [1 - P(max <= k)]``: exact for a whole ``m``. For an expected count ``active``
    (e.g. ``N(t)`` of Eq. 8) it is interpolated linearly between the neighbouring whole counts (the
    spread of the count around its mean is left out). With ``parts = 1`` it returns ``active``; it lies
    between ``active / parts`` and ``min(active, E / parts)``.

    Parameters
    ----------
    active : array_like
        Expected activated experts (0 <= active <= E).
    E : int
        Experts per layer (at most 1000).
    parts : int
        GPUs the experts are dealt to (divides ``E``).

    Returns
    -------
    numpy.ndarray or float
        Expected activated experts on the most loaded GPU, shape of ``active``.
    """
    E = int(as_array("E", E, low=1, whole=True))
    parts = int(as_array("parts", parts, low=1, high=E, whole=True))
    if E % parts:
        raise UsageError(f"parts must divide E = {E}, got {parts}")
    if E > 1000:
        raise UsageError(f"E must be at most 1000 (the placement counts overflow a float beyond), got {E}")
    active = as_array("active", active, low=0, high=E)
    if parts == 1:
        return active * 1.0
    return np.interp(active, np.arange(E + 1), _expected_busiest(E, parts))


@functools.lru_cache(maxsize=32)
def _expected_busiest(E: int, parts: int) -> np.ndarray:
    """Expected maximum over ``parts`` groups of ``E / parts`` of the activated experts, for m = 0 ... E activated."""
    n = E // parts
    choose = np.array([math.comb(n, j) for j in range(n + 1)], dtype=float)
    total = np.array([math.comb(E, m) for m in range(E + 1)], dtype=float)
    expected = np.zeros(E + 1)
    for k in range(n):  # P(max > k) summed over k
        power = np.ones(1)
        for _ in range(parts):  # placements with at most k activated experts in each group
            power = np.convolve(power, choose[:k + 1])
        at_most = np.zeros(E + 1)
        at_most[:len(power)] = power[:E + 1]
        expected += 1.0 - at_most / total
    return expected


def uniform_routing(tokens: int, E: int, K: int, seed: int = 0) -> np.ndarray:
    """Experts picked by each token under uniform routing: ``K`` distinct of ``E`` per token.

    Returns
    -------
    numpy.ndarray
        Shape ``(tokens, K)``, expert indices.
    """
    rng = np.random.default_rng(seed)
    return np.stack([rng.choice(E, size=K, replace=False) for _ in range(tokens)]) if tokens else np.empty((0, K), int)
