"""Which measurements a fit sees: the stride samples of Appendix C.2-C.3 and their fractional-stride kin.

:func:`stride_sample` is the paper's ``df[begin::stride]`` of the measurements sorted by K, gamma, B;
:func:`spread_sample` takes ``m`` rows at a fractional stride, for a design of other than the paper's
228 points, where whole strides give few sample sizes. :func:`stride_coverage` rebuilds the batch sizes
each stride covers (Table 3's "B covered" column). The rows keep their index labels, so the rows held
back from a fit can be found again (:mod:`moesd.model.diagnostics`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from moesd._checks import UsageError, as_array

__all__ = ["PAPER_STRIDES", "PAPER_CURVES", "stride_sample", "spread_sample", "stride_coverage", "stride_points"]

PAPER_STRIDES = (25, 22, 20, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1)
"""The 21 strides of Appendix C.3 (m = 10 ... 228 of 228 measurements, Table 3)."""
PAPER_CURVES = 12
"""(K, gamma) curves of the paper's sparsity study: 6 values of K x 2 of gamma, each over 19 batch sizes
(Appendix C.2: 228 measurements)."""


def stride_sample(frame: pd.DataFrame, stride: int, begin: int = 0) -> pd.DataFrame:
    """Rows ``begin::stride`` of the measurements sorted by K, gamma, B (Appendix C.2's ``df[::11]``).

    The rows keep their index labels, so the rows not sampled can be found again.
    """
    stride = int(as_array("stride", stride, low=1, whole=True))
    begin = int(as_array("begin", begin, low=0, whole=True))
    ordered = frame.sort_values(["K", "gamma", "B"], kind="stable")
    return ordered.iloc[begin::stride]


def spread_sample(frame: pd.DataFrame, m: int, begin: int = 0) -> pd.DataFrame:
    """``m`` rows spread evenly over the measurements sorted by K, gamma, B: a fractional stride ``n / m``.

    Row ``begin + floor(i n / m)`` for ``i = 0 ... m - 1`` of the ``n`` sorted rows. Where ``n / m`` is a
    whole number this is :func:`stride_sample` with that stride (Appendix C.2's ``df[begin::stride]``);
    in between, it keeps the paper's rule (every so many rows of the sorted table) for sample sizes
    that no whole stride gives, as a design of other than 228 points needs.

    Parameters
    ----------
    frame : pandas.DataFrame
        Measurements with columns ``K``, ``gamma``, ``B``.
    m : int
        Rows in the sample, 1 to ``n``.
    begin : int
        Offset of the first row, ``0 <= begin < n / m``.

    Returns
    -------
    pandas.DataFrame
        The rows, with their index labels (so the rows not sampled can be found again).
    """
    ordered = frame.sort_values(["K", "gamma", "B"], kind="stable")
    n = len(ordered)
    m = int(as_array("m", m, low=1, high=max(n, 1), whole=True))
    begin = int(as_array("begin", begin, low=0, whole=True))
    if begin * m >= n:
        raise UsageError(f"begin must lie below n / m = {n} / {m}, got {begin}", "begin")
    return ordered.iloc[begin + (np.arange(m) * n) // m]


def stride_coverage(batch_sizes, curves: int, strides=PAPER_STRIDES) -> pd.Series:
    """The batch sizes each stride sample covers in a design of ``curves`` curves over ``batch_sizes``.

    The design's rows sorted by K, gamma, B (as :func:`stride_sample` sorts them) run through the batch
    sizes once per curve, so row ``i`` has batch size ``batch_sizes[i % len(batch_sizes)]``. For the
    paper's design (:data:`PAPER_CURVES` curves over its 19 batch sizes, :data:`PAPER_STRIDES`) this is
    Table 3's "B covered" column.

    Returns
    -------
    pandas.Series
        Indexed by stride: the batch sizes covered, sorted and space-separated (as the ``batch_sizes``
        column of :func:`moesd.model.diagnostics.robustness_study`).
    """
    grid = np.sort(as_array("batch_sizes", batch_sizes, low=1, whole=True))
    if grid.size == 0:
        raise UsageError("batch_sizes must name at least one batch size", "batch_sizes")
    curves = int(as_array("curves", curves, low=1, whole=True))
    rows = np.tile(grid, curves)
    covered = {}
    for stride in strides:
        stride = int(as_array("stride", stride, low=1, whole=True))
        covered[stride] = " ".join(str(int(b)) for b in np.unique(rows[::stride]))
    return pd.Series(covered, name="batch_sizes").rename_axis("stride")


def stride_points(batch_sizes, curves: int, strides=PAPER_STRIDES) -> pd.Series:
    """The points each stride sample holds in a design of ``curves`` curves over ``batch_sizes``.

    As :func:`stride_coverage`, but keeping which curve each point lies on: the points as ``"c/0/B"`` strings,
    ``c`` the curve's index (0 to ``curves - 1``) in the place of K and 0 in the place of gamma (the paper does not
    state its K and gamma values; the coverage per curve of
    :func:`moesd.paper.sparsity_verdicts.curve_coverage` needs only which points share a curve).

    Returns
    -------
    pandas.Series
        Indexed by stride: the points, space-separated (as the ``points`` column of
        :func:`moesd.model.diagnostics.robustness_study`).
    """
    grid = np.sort(as_array("batch_sizes", batch_sizes, low=1, whole=True))
    if grid.size == 0:
        raise ValueError("batch_sizes must name at least one batch size")
    curves = int(as_array("curves", curves, low=1, whole=True))
    rows = [f"{curve}/0/{int(b)}" for curve in range(curves) for b in grid]
    points = {}
    for stride in strides:
        stride = int(as_array("stride", stride, low=1, whole=True))
        points[stride] = " ".join(rows[::stride])
    return pd.Series(points, name="points").rename_axis("stride")


def missing_batch_sizes(sample_batch_sizes: str, grid) -> list:
    """The batch sizes of ``grid`` a sample leaves out, in the grid's order.

    ``sample_batch_sizes`` is a sample's ``batch_sizes`` as a robustness table writes it (whole numbers separated
    by spaces, :func:`moesd.model.diagnostics.robustness_study`).
    """
    return [b for b in grid if str(b) not in sample_batch_sizes.split()]
