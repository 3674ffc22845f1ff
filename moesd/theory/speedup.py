"""Speculative decoding time and speedup (the paper's Section 3.1, Eqs. 2-5).

One SD round drafts ``gamma`` tokens with the draft model, verifies them in one target
forward pass of ``gamma`` tokens per sequence, and runs rejection sampling:

``T_SD = R (gamma T_D(B, 1) + T_T(B, gamma) + T_reject)``                      (Eq. 2)

Autoregressive decoding of ``S`` tokens takes ``T_AR = S T_T(B, 1)``, and since
``S / R = sigma (gamma + 1)``,

``speedup = sigma (gamma + 1) / (gamma T_D/T_T(B,1) + T_T(B,gamma)/T_T(B,1) + T_reject/T_T(B,1))``  (Eqs. 3-4)

where ``sigma`` is the fraction of the ``gamma + 1`` possible tokens a round emits
(Eq. 5). The ratio ``T_T(B, 1) / T_T(B, gamma)`` is the paper's *target efficiency*: 1
when verification costs no more than a decode step, ``1 / gamma`` when cost grows with the
gamma tokens the paper counts (``1 / (gamma + 1)`` for the gamma + 1 positions that
:mod:`moesd.engine.sd` and vLLM score, where the speedup falls to at most ``sigma``). Leviathan
et al.'s walltime factor is Eq. 4 with target efficiency 1 and free rejection sampling
(:func:`leviathan_speedup`).

Time arguments may be in any unit, the same for all of them (seconds, typically).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from moesd._checks import UsageError, as_array, broadcast, finite_results
from moesd._numeric import increasing_root


def _draft_length(gamma) -> np.ndarray:
    return as_array("gamma", gamma, low=1, whole=True)


def _emitted_fraction(sigma, gamma: np.ndarray) -> np.ndarray:
    sigma = as_array("sigma", sigma, low=0, high=1, low_open=True)
    broadcast(sigma=sigma, gamma=gamma)
    floor = 1.0 / (gamma + 1.0)
    low = sigma < (1 - 1e-12) * floor
    if low.any():
        s, f = (np.broadcast_to(a, low.shape)[low].flat[0] for a in (sigma, floor))
        raise UsageError(f"sigma must be in [1 / (gamma + 1), 1] (a round emits at least one token), "
                         f"got {s:g} where 1 / (gamma + 1) = {f:g}")
    return sigma


@finite_results
def expected_tokens_per_round(alpha, gamma):
    """Expected tokens one SD round emits, ``(1 - alpha**(gamma+1)) / (1 - alpha)``.

    Leviathan et al.'s count: accepted draft tokens plus the one token the target always
    adds (the correction or the bonus token), when each draft token is accepted
    independently with probability ``alpha``.

    Parameters
    ----------
    alpha : array_like
        Per-token acceptance probability in [0, 1].
    gamma : array_like
        Draft length (whole number >= 1).

    Returns
    -------
    numpy.ndarray or float
        Tokens per round, between 1 and ``gamma + 1``.
    """
    alpha = as_array("alpha", alpha, low=0, high=1)
    gamma = _draft_length(gamma)
    broadcast(alpha=alpha, gamma=gamma)
    return _power_sum_closed(alpha, gamma)


def _power_sum_closed(alpha: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    """``sum_{i=0..gamma} alpha**i = (1 - alpha**(gamma+1)) / (1 - alpha)``, in a time independent of ``gamma``."""
    with np.errstate(divide="ignore", invalid="ignore"):
        tokens = -np.expm1((gamma + 1.0) * np.log(alpha)) / (1.0 - alpha)
    return np.where(alpha == 1.0, gamma + 1.0, tokens)


@finite_results
def sigma(alpha, gamma):
    """Fraction of the ``gamma + 1`` possible tokens a round emits (Eq. 5).

    ``sigma = (1 - alpha**(gamma+1)) / ((1 - alpha)(gamma + 1))``; vLLM logs it as
    "system efficiency".

    Parameters
    ----------
    alpha : array_like
        Per-token acceptance probability in [0, 1].
    gamma : array_like
        Draft length (whole number >= 1).

    Returns
    -------
    numpy.ndarray or float
        ``sigma`` in [1 / (gamma + 1), 1].
    """
    return expected_tokens_per_round(alpha, gamma) / (_draft_length(gamma) + 1.0)


_HORNER_MAX = 64
"""Longest draft inverted by Horner's rule, whose cost grows with ``gamma``; longer ones are bisected."""


def _power_sum(alpha: np.ndarray, gamma: int) -> tuple[np.ndarray, np.ndarray]:
    """``sum_{i=0..gamma} alpha**i`` and its derivative in ``alpha``, by Horner's rule."""
    value, slope = np.ones_like(alpha), np.zeros_like(alpha)
    for _ in range(gamma):
        slope = slope * alpha + value
        value = value * alpha + 1.0
    return value, slope


@functools.lru_cache(maxsize=64)
def _inverse_power_sum_table(gamma: int, size: int = 4097) -> np.ndarray:
    """``alpha`` at which ``sum_{i=0..gamma} alpha**i`` takes ``size`` evenly spaced values in [1, gamma+1]."""
    wanted = np.linspace(1.0, gamma + 1.0, size)
    alpha = np.ones(size)
    for _ in range(200):  # Newton from the right of a convex increasing function: monotone
        value, slope = _power_sum(alpha, gamma)
        alpha = np.clip(alpha - (value - wanted) / slope, 0.0, 1.0)
    return alpha


def _bisect_power_sum(wanted: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    """``alpha`` in [0, 1] with ``sum_{i=0..gamma} alpha**i = wanted``, by 64 halvings (any ``gamma``)."""
    return increasing_root(lambda alpha: _power_sum_closed(alpha, gamma), wanted)


@finite_results
def alpha_from_sigma(sigma, gamma):
    """Invert Eq. 5: the acceptance probability that yields ``sigma`` at draft length ``gamma``.

    Solves ``sum_{i=0..gamma} alpha**i = sigma (gamma + 1)``, whose left side increases on
    [0, 1]: for ``gamma <= 64`` by interpolation in a table of the inverse followed by Newton's
    method, for longer drafts by bisection on the closed form (a time independent of ``gamma``).

    Parameters
    ----------
    sigma : array_like
        Observed ``sigma`` in [1 / (gamma + 1), 1].
    gamma : array_like
        Draft length (whole number >= 1).

    Returns
    -------
    numpy.ndarray or float
        ``alpha`` in [0, 1].

    Raises
    ------
    ValueError
        If ``sigma`` lies outside [1 / (gamma + 1), 1] (no acceptance rate produces it).
    """
    gamma = _draft_length(gamma)
    sigma_ = _emitted_fraction(sigma, gamma)
    shape = np.broadcast_shapes(sigma_.shape, gamma.shape)
    target = np.broadcast_to(sigma_ * (gamma + 1.0), shape).ravel()
    gamma = np.broadcast_to(gamma, shape).ravel()
    alpha = np.empty(target.shape)
    long_draft = gamma > _HORNER_MAX
    if long_draft.any():
        alpha[long_draft] = _bisect_power_sum(target[long_draft], gamma[long_draft])
    draft_lengths = np.unique(gamma[~long_draft])
    for draft_length in draft_lengths:
        chosen = slice(None) if not long_draft.any() and draft_lengths.size == 1 else gamma == draft_length
        wanted = target[chosen]
        # Start within ~1e-7 of the root from a table of the inverse on a uniform grid of
        # sum_i alpha**i in [1, gamma + 1], then take three quadratically convergent steps.
        table = _inverse_power_sum_table(int(draft_length))
        position = (wanted - 1.0) / draft_length * (table.size - 1)
        index = np.minimum(position.astype(np.int64), table.size - 2)
        fraction = position - index
        estimate = table[index] * (1.0 - fraction) + table[index + 1] * fraction
        for _ in range(3):
            value, slope = _power_sum(estimate, int(draft_length))
            estimate = np.clip(estimate - (value - wanted) / slope, 0.0, 1.0)  # slope >= 1
        alpha[chosen] = estimate
    alpha = alpha.reshape(shape)
    return alpha if alpha.ndim else float(alpha)


@finite_results
def target_efficiency(t_target_1, t_target_gamma):
    """Target efficiency ``T_T(B, 1) / T_T(B, gamma)`` (Section 3.1).

    Parameters
    ----------
    t_target_1 : array_like
        Time of one target forward with one token per sequence (seconds, > 0).
    t_target_gamma : array_like
        Time of one target forward that verifies ``gamma`` tokens per sequence (seconds, > 0).

    Returns
    -------
    numpy.ndarray or float
        Near 1 when verification is memory-bound, near ``1 / gamma`` when compute-bound (``1 / (gamma + 1)``
        when the pass scores gamma + 1 positions per sequence).
    """
    t_target_1 = as_array("t_target_1", t_target_1, low=0, low_open=True)
    t_target_gamma = as_array("t_target_gamma", t_target_gamma, low=0, low_open=True)
    broadcast(t_target_1=t_target_1, t_target_gamma=t_target_gamma)
    with np.errstate(over="ignore"):  # a ratio beyond the largest float: inf
        return t_target_1 / t_target_gamma


@finite_results
def sd_time(rounds, gamma, t_draft, t_target_gamma, t_reject):
    """Wall time of speculative decoding (Eq. 2).

    Parameters
    ----------
    rounds : array_like
        SD rounds ``R`` (>= 0).
    gamma : array_like
        Draft length (whole number >= 1).
    t_draft : array_like
        One draft forward with one token per sequence, ``T_D(B, 1)`` (seconds, >= 0).
    t_target_gamma : array_like
        One verification forward, ``T_T(B, gamma)`` (seconds, >= 0).
    t_reject : array_like
        Rejection sampling of one round (seconds, >= 0).

    Returns
    -------
    numpy.ndarray or float
        ``R (gamma T_D + T_T(B, gamma) + T_reject)`` in seconds.
    """
    rounds = as_array("rounds", rounds, low=0)
    gamma = _draft_length(gamma)
    t_draft = as_array("t_draft", t_draft, low=0)
    t_target_gamma = as_array("t_target_gamma", t_target_gamma, low=0)
    t_reject = as_array("t_reject", t_reject, low=0)
    broadcast(rounds=rounds, gamma=gamma, t_draft=t_draft, t_target_gamma=t_target_gamma, t_reject=t_reject)
    return rounds * (gamma * t_draft + t_target_gamma + t_reject)


@dataclass(frozen=True)
class SpeedupTerms:
    """The four factors of Eq. 4, ``speedup = tokens_per_round / (verify + draft + reject)``.

    Attributes
    ----------
    tokens_per_round : numpy.ndarray
        ``sigma (gamma + 1)``: the algorithmic gain, what acceptance buys.
    verify : numpy.ndarray
        ``T_T(B, gamma) / T_T(B, 1)``: one over the target efficiency, the systemic cost.
    draft : numpy.ndarray
        ``gamma T_D(B, 1) / T_T(B, 1)``: drafting cost in target decode steps.
    reject : numpy.ndarray
        ``T_reject / T_T(B, 1)``: rejection sampling cost in target decode steps.
    """

    tokens_per_round: np.ndarray
    verify: np.ndarray
    draft: np.ndarray
    reject: np.ndarray

    @property
    def target_efficiency(self) -> np.ndarray:
        """``T_T(B, 1) / T_T(B, gamma)``."""
        with np.errstate(over="ignore", divide="ignore"):  # verify below the smallest float: inf
            return 1.0 / self.verify

    @property
    def speedup(self) -> np.ndarray:
        """Eq. 4: ``tokens_per_round / (verify + draft + reject)``; 0 where the sum passes the largest float
        (about 1.8e308 target decode steps, where the speedup is below the smallest normal float)."""
        with np.errstate(over="ignore"):
            return self.tokens_per_round / (self.verify + self.draft + self.reject)


@finite_results
def speedup_terms(sigma, gamma, t_target_1, t_target_gamma, t_draft, t_reject=0.0) -> SpeedupTerms:
    """Split the SD speedup of Eq. 4 into its acceptance, verification, draft and rejection terms.

    Parameters
    ----------
    sigma : array_like
        Emitted fraction of the ``gamma + 1`` possible tokens per round, in [1/(gamma+1), 1].
    gamma : array_like
        Draft length (whole number >= 1).
    t_target_1 : array_like
        Target decode step ``T_T(B, 1)`` (seconds, > 0).
    t_target_gamma : array_like
        Target verification step ``T_T(B, gamma)`` (seconds, > 0).
    t_draft : array_like
        Draft decode step ``T_D(B, 1)`` (seconds, >= 0).
    t_reject : array_like, default 0
        Rejection sampling per round (seconds, >= 0).

    Returns
    -------
    SpeedupTerms
        The terms; ``.speedup`` recombines them.
    """
    gamma = _draft_length(gamma)
    sigma_ = _emitted_fraction(sigma, gamma)
    t_target_1 = as_array("t_target_1", t_target_1, low=0, low_open=True)
    t_target_gamma = as_array("t_target_gamma", t_target_gamma, low=0, low_open=True)
    t_draft = as_array("t_draft", t_draft, low=0)
    t_reject = as_array("t_reject", t_reject, low=0)
    broadcast(sigma=sigma_, gamma=gamma, t_target_1=t_target_1, t_target_gamma=t_target_gamma, t_draft=t_draft,
              t_reject=t_reject)
    with np.errstate(over="ignore"):  # only a ratio beyond float range overflows: inf, and the speedup 0
        return SpeedupTerms(
            tokens_per_round=sigma_ * (gamma + 1.0),
            verify=t_target_gamma / t_target_1,
            draft=gamma * (t_draft / t_target_1),  # times near the float maximum: divide first
            reject=t_reject / t_target_1,
        )


@finite_results
def speedup(sigma, gamma, t_target_1, t_target_gamma, t_draft, t_reject=0.0):
    """SD speedup over autoregressive decoding from stage times (Eqs. 3-4).

    Parameters are those of :func:`speedup_terms`.

    Returns
    -------
    numpy.ndarray or float
        ``T_AR / T_SD`` (dimensionless).
    """
    return speedup_terms(sigma, gamma, t_target_1, t_target_gamma, t_draft, t_reject).speedup


@finite_results
def leviathan_speedup(alpha, gamma, cost_ratio):
    """Leviathan et al.'s expected walltime improvement factor (their Theorem 3.8).

    ``(1 - alpha**(gamma+1)) / ((1 - alpha)(gamma c + 1))`` with ``c = T_D / T_T``. It
    equals Eq. 4 with target efficiency 1 and no rejection cost: it assumes verifying
    ``gamma`` tokens costs one decode step, which is what MoE at small batch violates.

    Parameters
    ----------
    alpha : array_like
        Per-token acceptance probability in [0, 1].
    gamma : array_like
        Draft length (whole number >= 1).
    cost_ratio : array_like
        ``c``, draft step time over target step time (>= 0).

    Returns
    -------
    numpy.ndarray or float
        The expected speedup.
    """
    cost_ratio = as_array("cost_ratio", cost_ratio, low=0)
    broadcast(alpha=alpha, gamma=gamma, cost_ratio=cost_ratio)
    with np.errstate(over="ignore"):  # gamma c beyond the largest float: a speedup of 0
        return expected_tokens_per_round(alpha, gamma) / (_draft_length(gamma) * cost_ratio + 1.0)


@finite_results
def min_target_efficiency(observed_speedup, sigma, gamma):
    """Smallest target efficiency consistent with an observed speedup (Eq. 4 rearranged).

    Eq. 4 gives ``1 / target_efficiency = sigma (gamma + 1) / speedup - draft - reject``; with
    drafting and rejection free this is largest, so ``speedup / (sigma (gamma + 1))`` bounds
    the target efficiency from below. It lets a table that prints only speedup and ``sigma``
    (the paper's Tables 1-2) say how cheap verification must have been.

    Parameters
    ----------
    observed_speedup : array_like
        ``T_AR / T_SD`` (> 0).
    sigma : array_like
        Emitted fraction of the ``gamma + 1`` possible tokens per round.
    gamma : array_like
        Draft length (whole number >= 1).

    Returns
    -------
    numpy.ndarray or float
        Lower bound on ``T_T(B, 1) / T_T(B, gamma)``, in (0, 1].

    Raises
    ------
    ValueError
        If the bound exceeds 1, i.e. ``observed_speedup > sigma (gamma + 1)``: Eq. 4 cannot
        produce such a speedup, since verifying ``gamma`` tokens costs at least one decode step
        (target efficiency <= 1) and drafting is not negative. The three inputs then disagree
        (a misread table, sigma of another gamma, or a noisy measurement): check them rather
        than read a "bound" above 1.
    """
    observed_speedup = as_array("observed_speedup", observed_speedup, low=0, low_open=True)
    gamma = _draft_length(gamma)
    ceiling = _emitted_fraction(sigma, gamma) * (gamma + 1.0)
    broadcast(observed_speedup=observed_speedup, sigma=sigma, gamma=gamma)
    bound = observed_speedup / ceiling
    impossible = bound > 1.0 + 1e-12
    if impossible.any():
        x, c = (np.broadcast_to(a, bound.shape)[impossible].flat[0] for a in (observed_speedup, ceiling))
        raise UsageError(f"observed_speedup must be <= sigma (gamma + 1), Eq. 4's ceiling, got {x:g} "
                         f"where sigma (gamma + 1) = {c:g}: no target efficiency <= 1 explains it")
    return bound
