"""The smooth roofline of the paper's fitted model: ``G(t; lambda RP, s)`` (Eq. 11).

Time grows like ``s**t`` while a kernel is memory-bound, up to the transition ``lambda RP`` (tokens), then
along the tangent line (compute-bound); the hard corner of :mod:`moesd.theory.roofline` made smooth, with its
derivatives for Algorithm 1's fit (:mod:`moesd.model.algorithm1`).
"""

from __future__ import annotations

import math

import numpy as np

from moesd._checks import UsageError, as_array, broadcast, finite_results


@finite_results
def G(t, lam_rp, s):
    """Roofline-shaped growth of time with tokens, the paper's ``G(t; lambda RP, s)`` (Eq. 11).

    ``G = s**t`` up to the transition ``lam_rp`` (memory-bound: slow growth), then the tangent
    line ``s**lam_rp (1 + ln(s) (t - lam_rp))`` (compute-bound: linear growth). ``G`` and its
    first derivative are continuous at ``lam_rp``.

    Parameters
    ----------
    t : array_like
        Tokens (>= 0, real values allowed).
    lam_rp : array_like
        Transition point ``lambda RP`` in tokens (> 0): the empirical ridge point.
    s : array_like
        Growth base (>= 1; the paper bounds it to [1, 2]).

    Returns
    -------
    numpy.ndarray or float
        Dimensionless growth factor, ``G(0) = 1``.
    """
    t = as_array("t", t, low=0)
    lam_rp = as_array("lam_rp", lam_rp, low=0, low_open=True)
    s = as_array("s", s, low=1)
    broadcast(t=t, lam_rp=lam_rp, s=s)
    with np.errstate(over="ignore", invalid="ignore"):
        growth = unchecked_G(t, lam_rp, s)
    overflow = ~np.isfinite(growth)
    if overflow.any():
        t_, lam_, s_ = (np.broadcast_to(a, overflow.shape)[overflow].flat[0] for a in (t, lam_rp, s))
        raise UsageError(f"t, lam_rp and s must keep G within float64 (s**lam_rp and the line after it), "
                         f"got t = {t_:g}, lam_rp = {lam_:g}, s = {s_:g}")
    return growth


def unchecked_G(t, lam_rp, s, derivatives: bool = False):
    """Eq. 11's ``G(t; lam_rp, s)`` without :func:`G`'s input checks, and, if asked, its derivatives.

    The one home of Eq. 11's formulas: :func:`G` checks its inputs and calls it, and Algorithm 1's
    fit (:class:`moesd.model.algorithm1.SpeedupInputs`) calls it directly in its hot loop, with the
    derivatives for its analytic Jacobian. Below the transition ``L = lam_rp``: ``G = s**t``,
    ``dG/dL = 0``, ``dG/ds = t s**(t - 1)``. Above it: ``G = s**L (1 + ln s (t - L))``,
    ``dG/dL = s**L (ln s)**2 (t - L)``, ``dG/ds = s**(L - 1) (L (1 + ln s (t - L)) + t - L)``. Both
    derivatives are continuous at ``t = L`` (0 and ``L s**(L - 1)`` from either side).

    Parameters
    ----------
    t : array_like
        Tokens (>= 0).
    lam_rp : float or numpy.ndarray
        Transition point ``lambda RP`` in tokens (> 0).
    s : float or numpy.ndarray
        Growth base (>= 1). A Python or numpy scalar takes ``ln s`` from :func:`math.log` (the fit's
        scalar parameters), an array from :func:`numpy.log` (:func:`G`'s checked inputs); the two can
        differ in the last bit, and each caller keeps the digits it always had.
    derivatives : bool, default False
        Also return ``dG/dL`` and ``dG/ds``.

    Returns
    -------
    numpy.ndarray or tuple of numpy.ndarray
        ``G`` (dimensionless, ``G(0) = 1``), or ``(G, dG/dL, dG/ds)`` with ``dG/dL`` per token and
        ``dG/ds`` dimensionless, broadcast over the arguments. Overflow is not caught (see :func:`G`).
    """
    log_s = np.log(s) if isinstance(s, np.ndarray) else math.log(s)
    at_transition = s ** lam_rp
    excess = t - lam_rp
    below = t <= lam_rp
    linear = 1.0 + log_s * excess
    value = np.where(below, np.power(s, np.minimum(t, lam_rp)), at_transition * linear)
    if not derivatives:
        return value
    d_transition = np.where(below, 0.0, (at_transition * log_s * log_s) * excess)
    d_s = np.where(below, t * value / s, (at_transition / s) * (lam_rp * linear + excess))
    return value, d_transition, d_s
