"""Small numerical helpers the theory modules share."""

from __future__ import annotations

import numpy as np


def increasing_root(function, wanted, halvings: int = 64) -> np.ndarray:
    """``x`` in [0, 1] with ``function(x) = wanted``, by bisection, for a ``function`` increasing on [0, 1].

    Parameters
    ----------
    function : callable
        Maps an array of ``x`` (the shape of ``wanted``) to values, element by element, increasing in ``x``.
    wanted : array_like
        The values to reach, between ``function(0)`` and ``function(1)``.
    halvings : int, default 64
        Bisection steps; 64 take the bracket below the spacing of float64 in [0.5, 1].

    Returns
    -------
    numpy.ndarray
        The midpoints of the final brackets, shaped as ``wanted``.
    """
    wanted = np.asarray(wanted, dtype=float)
    low, high = np.zeros_like(wanted), np.ones_like(wanted)
    for _ in range(halvings):
        middle = 0.5 * (low + high)
        below = function(middle) < wanted
        low, high = np.where(below, middle, low), np.where(below, high, middle)
    return 0.5 * (low + high)
