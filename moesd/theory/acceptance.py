"""Acceptance that changes with the draft position (beyond the paper): tokens per round and their inverse.

Eq. 5 takes one acceptance probability ``alpha`` for every draft position. Draft heads (EAGLE, DeepSeek's
multi-token prediction) are trained for the first positions and lose acceptance further out, and serving
engines report a *mean acceptance length*: the tokens one round emits, the accepted drafts plus the one
token the target always adds. With the ``i``-th draft token accepted (given the ones before it were)
with probability ``alpha_i``, a round of ``gamma`` drafts emits

    ``E[tokens] = 1 + sum_{i=1..gamma} prod_{j=1..i} alpha_j``

tokens, which is Eq. 5's ``(1 - alpha**(gamma + 1)) / (1 - alpha)`` when every ``alpha_i = alpha``.
:func:`position_acceptance` builds the geometric profile ``alpha_i = alpha decay**(i - 1)``,
:func:`tokens_per_round` counts a profile's tokens, and :func:`alpha_for_acceptance_length` finds the
first position's ``alpha`` from a published acceptance length at a given ``gamma``.

Pure numpy.
"""

from __future__ import annotations

import numpy as np

from moesd._checks import as_array, finite_results
from moesd._numeric import increasing_root

__all__ = ["position_acceptance", "tokens_per_round", "alpha_for_acceptance_length"]


@finite_results
def position_acceptance(alpha, gamma: int, decay=1.0) -> np.ndarray:
    """Acceptance of each draft position, ``alpha_i = alpha decay**(i - 1)`` for ``i = 1..gamma``.

    Parameters
    ----------
    alpha : array_like
        Acceptance of the first draft position, in [0, 1].
    gamma : int
        Draft positions (>= 1).
    decay : array_like, default 1.0
        Factor from one position to the next, in [0, 1] (1: Eq. 5's constant acceptance).

    Returns
    -------
    numpy.ndarray
        Shape ``broadcast(alpha, decay).shape + (gamma,)``, each in [0, 1].
    """
    alpha = as_array("alpha", alpha, low=0, high=1)
    decay = as_array("decay", decay, low=0, high=1)
    gamma = int(as_array("gamma", gamma, low=1, high=4096, whole=True))
    return np.asarray(alpha)[..., None] * np.asarray(decay)[..., None] ** np.arange(gamma)


@finite_results
def tokens_per_round(acceptance) -> np.ndarray:
    """Expected tokens one SD round emits, ``1 + sum_i prod_{j <= i} alpha_j``.

    Parameters
    ----------
    acceptance : array_like
        Acceptance of each draft position along the last axis (each in [0, 1]): ``gamma`` values for a
        round of ``gamma`` drafts.

    Returns
    -------
    numpy.ndarray or float
        Tokens per round (dimensionless), between 1 and ``gamma + 1``.
    """
    acceptance = as_array("acceptance", acceptance, low=0, high=1)
    if acceptance.ndim == 0 or acceptance.shape[-1] == 0:
        raise ValueError("acceptance must hold one value per draft position (at least one)")
    return 1.0 + np.cumprod(acceptance, axis=-1).sum(axis=-1)



def rounds_to_generate(alpha: float, gamma: int, tokens: int, batch_size: int, draws: int,
                       rng: np.random.Generator) -> np.ndarray:
    """Rounds each sequence of a batch takes to emit ``tokens`` tokens, drawn under synthetic acceptance.

    A round emits its accepted prefix, geometric (each draft accepted with probability ``alpha``) and capped at
    ``gamma``, plus one token; a sequence is done in the round its total reaches ``tokens``.

    Parameters
    ----------
    alpha : float
        Per-token acceptance probability, in [0, 1).
    gamma : int
        Draft tokens per round (>= 1).
    tokens : int
        Tokens each sequence emits (>= 1).
    batch_size, draws : int
        Sequences per batch, and batches drawn.
    rng : numpy.random.Generator
        The draws' source (one ``geometric`` call of shape ``(draws, batch_size, tokens)``).

    Returns
    -------
    numpy.ndarray
        Shape ``(draws, batch_size)``: the rounds each sequence needs, between ``ceil(tokens / (gamma + 1))``
        and ``tokens``.
    """
    alpha = float(as_array("alpha", alpha, low=0, high=1, high_open=True))
    shape = (draws, batch_size, tokens)
    emitted = np.minimum(rng.geometric(1 - alpha, shape) - 1, gamma) + 1
    return (np.cumsum(emitted, axis=2) < tokens).sum(axis=2) + 1


@finite_results
def alpha_for_acceptance_length(length, gamma: int, decay=1.0) -> np.ndarray:
    """The first position's acceptance ``alpha`` at which a round of ``gamma`` drafts emits ``length`` tokens.

    Inverts :func:`tokens_per_round` of :func:`position_acceptance` (``alpha_i = alpha decay**(i - 1)``),
    which rises strictly with ``alpha``, by bisection (:func:`moesd._numeric.increasing_root`).

    Parameters
    ----------
    length : array_like
        Mean acceptance length as engines report it: tokens per round including the target's own token,
        in ``[1, tokens_per_round(position_acceptance(1, gamma, decay))]``.
    gamma : int
        Draft positions the length was measured with (>= 1).
    decay : array_like, default 1.0
        Factor from one position to the next, in (0, 1].

    Returns
    -------
    numpy.ndarray or float
        ``alpha`` in [0, 1].

    Raises
    ------
    ValueError
        If ``length`` is outside what ``gamma`` drafts with that decay can emit.
    """
    gamma = int(as_array("gamma", gamma, low=1, high=4096, whole=True))
    decay = as_array("decay", decay, low=0, high=1, low_open=True)
    longest = tokens_per_round(position_acceptance(1.0, gamma, decay))
    length = as_array("length", length, low=1)
    length, longest = np.broadcast_arrays(length, longest)
    if (length > longest + 1e-12).any():
        raise ValueError(f"length must be at most {float(np.min(longest)):.6g} tokens for gamma {gamma} "
                         f"(every draft accepted), got {float(np.max(length)):.6g}")
    return increasing_root(lambda alpha: tokens_per_round(position_acceptance(alpha, gamma, decay)), length)
