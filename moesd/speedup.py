"""Speculative decoding time and speedup (the paper's Section 3.1, Eqs. 2-5).

One SD round drafts ``gamma`` tokens with the draft model, verifies them in one target
forward pass of ``gamma`` tokens per sequence, and runs rejection sampling:

``T_SD = R (gamma T_D(B, 1) + T_T(B, gamma) + T_reject)``                      (Eq. 2)

Autoregressive decoding of ``S`` tokens takes ``T_AR = S T_T(B, 1)``, and since
``S / R = sigma (gamma + 1)``,

``speedup = sigma (gamma + 1) / (gamma T_D/T_T(B,1) + T_T(B,gamma)/T_T(B,1) + T_reject/T_T(B,1))``  (Eqs. 3-4)

where ``sigma`` is the fraction of the ``gamma + 1`` possible tokens a round emits
(Eq. 5). The ratio ``T_T(B, 1) / T_T(B, gamma)`` is the paper's *target efficiency*: 1
when verification costs no more than a decode step, ``1 / gamma`` when cost grows with
tokens. Leviathan et al.'s walltime factor is Eq. 4 with target efficiency 1 and free
rejection sampling (:func:`leviathan_speedup`).

Time arguments may be in any unit, the same for all of them (seconds, typically).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moesd._checks import as_array


def _draft_length(gamma) -> np.ndarray:
    return as_array("gamma", gamma, low=1, whole=True)


def _emitted_fraction(sigma, gamma: np.ndarray) -> np.ndarray:
    sigma = as_array("sigma", sigma, high=1)
    if (sigma < (1 - 1e-12) / (gamma + 1.0)).any():
        raise ValueError("sigma must be >= 1 / (gamma + 1): a round emits at least one token")
    return sigma


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
    with np.errstate(divide="ignore", invalid="ignore"):
        tokens = -np.expm1((gamma + 1.0) * np.log(alpha)) / (1.0 - alpha)
    return np.where(alpha == 1.0, gamma + 1.0, tokens)


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


def alpha_from_sigma(sigma, gamma):
    """Invert Eq. 5: the acceptance probability that yields ``sigma`` at draft length ``gamma``.

    Solves ``sum_{i=0..gamma} alpha**i = sigma (gamma + 1)`` by Newton's method from
    ``alpha = 1``; the left side is convex and increasing on [0, 1], so the iterates fall
    monotonically onto the root.

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
    target = np.broadcast_to(sigma_ * (gamma + 1.0), np.broadcast_shapes(sigma_.shape, gamma.shape))
    gamma = np.broadcast_to(gamma, target.shape)
    alpha = np.ones(target.shape)
    for _ in range(100):
        value, slope = np.zeros(target.shape), np.zeros(target.shape)
        for power in range(int(gamma.max()), -1, -1):  # Horner, each element to its own gamma
            used = power <= gamma
            slope = np.where(used, slope * alpha + value, slope)
            value = np.where(used, value * alpha + 1.0, value)
        step = np.where(slope > 0, (value - target) / np.where(slope > 0, slope, 1.0), 0.0)
        alpha = np.clip(alpha - step, 0.0, 1.0)
        if np.all(np.abs(step) < 1e-15):
            break
    return alpha if alpha.ndim else float(alpha)


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
        Near 1 when verification is memory-bound, near ``1 / gamma`` when compute-bound.
    """
    t_target_1 = as_array("t_target_1", t_target_1, low=0, low_open=True)
    t_target_gamma = as_array("t_target_gamma", t_target_gamma, low=0, low_open=True)
    return t_target_1 / t_target_gamma


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
        return 1.0 / self.verify

    @property
    def speedup(self) -> np.ndarray:
        """Eq. 4: ``tokens_per_round / (verify + draft + reject)``."""
        return self.tokens_per_round / (self.verify + self.draft + self.reject)


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
    efficiency = target_efficiency(t_target_1, t_target_gamma)
    t_draft = as_array("t_draft", t_draft, low=0)
    t_reject = as_array("t_reject", t_reject, low=0)
    return SpeedupTerms(
        tokens_per_round=sigma_ * (gamma + 1.0),
        verify=1.0 / efficiency,
        draft=gamma * t_draft / t_target_1,
        reject=t_reject / t_target_1,
    )


def speedup(sigma, gamma, t_target_1, t_target_gamma, t_draft, t_reject=0.0):
    """SD speedup over autoregressive decoding from stage times (Eqs. 3-4).

    Parameters are those of :func:`speedup_terms`.

    Returns
    -------
    numpy.ndarray or float
        ``T_AR / T_SD`` (dimensionless).
    """
    return speedup_terms(sigma, gamma, t_target_1, t_target_gamma, t_draft, t_reject).speedup


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
    return expected_tokens_per_round(alpha, gamma) / (_draft_length(gamma) * cost_ratio + 1.0)
