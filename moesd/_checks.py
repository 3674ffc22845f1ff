"""Input checks shared by the theory modules.

Every public theory function turns its inputs into float arrays with :func:`as_array`
and rejects values outside their domain with a ``ValueError`` that names the argument.
"""

from __future__ import annotations

import numpy as np


def as_array(name: str, value, *, low=None, high=None, low_open=False, high_open=False,
             whole=False) -> np.ndarray:
    """Return ``value`` as a float array after checking it lies in its domain.

    Parameters
    ----------
    name : str
        The argument's name, used in the error message.
    value : array_like
        The value to check.
    low, high : float, optional
        Bounds of the domain; ``None`` means unbounded on that side.
    low_open, high_open : bool
        Whether the bound itself is excluded.
    whole : bool
        Require whole numbers (counts such as ``E`` or ``gamma``).

    Raises
    ------
    ValueError
        If any element is NaN, outside the bounds, or not whole when ``whole`` is set.
    """
    try:
        array = np.asarray(value, dtype=float)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name} must be numeric, got {value!r}") from error
    if np.isnan(array).any():
        raise ValueError(f"{name} must not be NaN")
    if low is not None:
        bad = array <= low if low_open else array < low
        if bad.any():
            relation = ">" if low_open else ">="
            raise ValueError(f"{name} must be {relation} {low}, got {array[bad].flat[0]!r}")
    if high is not None:
        bad = array >= high if high_open else array > high
        if bad.any():
            relation = "<" if high_open else "<="
            raise ValueError(f"{name} must be {relation} {high}, got {array[bad].flat[0]!r}")
    if whole and (np.isinf(array).any() or (array != np.round(array)).any()):
        raise ValueError(f"{name} must be a whole number")
    return array
