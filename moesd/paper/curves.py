"""Curves with their noise, and the shapes the criteria ask of them.

A claim's parts are judged on *curves*: a quantity against batch size with its noise. This module holds
the noise model, the curves, and the shape tests (a rise then fall, a monotone fall, a peak region, a
width, one curve tracking another, a quantity growing along a sequence). Each shape test takes a
``tolerance``: the fraction of the curve's own move (its rise or fall) that a counter-move must also
exceed to count, besides the noise margin. ``tolerance = 0`` is the *strict* reading (any departure
beyond noise counts); :data:`moesd.paper.criteria.FLUCTUATION_TOLERANCE` the *material* one. Which
reading a claim takes, and why, is in :mod:`moesd.paper.criteria`. No sentence is written here
(:mod:`moesd.narration`).

The noise thresholds were written before the re-measured data existed, and none was chosen by looking at
measured data. Every one is a multiple of the measurement noise, estimated as follows (the *noise model*, shared
by all claims).

Curves and their noise
----------------------
A curve is one quantity (speedup, target efficiency) against batch size B: the **mean over repeats**
at each B (the paper averages its runs the same way). Its standard error at B is

* ``s / sqrt(n_B)`` when every B has at least two repeats, where ``s`` is the pooled standard
  deviation of the repeats about their B's mean (all B together) and ``n_B`` the repeats at B. A
  repeat that strays (a straggler, a busy machine) widens ``s``: more of a curve's wiggle then
  counts as noise, and a shape must be larger to count;
* otherwise (one repeat) the **neighbour scatter**: each interior point is compared with the
  straight line through its two neighbours (in B, so a non-uniform grid is handled), and the
  pseudo-residuals ``(y_line - y_i) / sqrt(1 + a**2 + b**2)`` (``a``, ``b`` the interpolation
  weights) have the noise's standard deviation when the curve is locally straight (Gasser, Sroka
  and Jennen-Steinmetz, Biometrika 73, 1986). Their robust scale ``1.4826 * median |.|`` ignores
  the few points where the curve really bends. With one repeat, drifts that move neighbouring
  points together are invisible to this estimate: the sentence says which estimate was used.

Two points of curves differ *beyond noise* when their difference exceeds ``NOISE_Z`` standard
errors of that difference, ``NOISE_Z * sqrt(se_i**2 + se_j**2)`` (the *margin*). ``NOISE_Z = 3`` was
fixed by simulation on synthetic curves before any new data existed (``tests/test_verdicts.py``
repeats a smaller version of it). With the paper's 19 batch sizes, Gaussian noise and 1, 2, 3 or 5
repeats, a flat curve passed the end-point test of :func:`rises_then_falls` (rise and fall beyond
noise) by chance in under 2 % of draws (the peak is the largest of 19 noisy points, so the margin
must cover that selection: at 2 standard errors 6-8 % of flat curves passed). Its unimodality test
(no reversal beyond noise), added later without changing ``NOISE_Z``, lowers that to 1.2 % or less
(1000 draws each; 2-3 % at 2 standard errors), while a hump 10 noise standard deviations high still
passes in 98 % of 300 draws with one repeat and in all of them with two or more. A curve that truly
falls (a straight fall, or flat up to B = 16 and falling after) is called non-monotone by
:func:`falls_monotonically` in at most 5.5 % of draws (the flat-then-falling curve with one repeat;
2.3 % or less with three or more repeats; at 2.5 standard errors it is 8-13 %).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

NOISE_Z = 3.0
"""Standard errors of a difference that make it *beyond noise* (see the module docstring)."""


MIN_BATCH_SIZES = 5
"""Fewest batch sizes a curve needs: a peak with points on both sides, and three pseudo-residuals
for the neighbour scatter when there is only one repeat."""


@dataclass(frozen=True)
class Curve:
    """A quantity against batch size: means over repeats and their standard errors.

    Attributes
    ----------
    batch_size : numpy.ndarray
        Sorted batch sizes (sequences).
    value : numpy.ndarray
        Mean over repeats at each batch size (the quantity's unit: a speedup or an efficiency).
    se : numpy.ndarray
        Standard error of each mean (same unit).
    noise : str
        Which noise estimate ``se`` comes from, in words.
    """

    batch_size: np.ndarray
    value: np.ndarray
    se: np.ndarray
    noise: str

    def margin(self, i, j) -> np.ndarray:
        """Smallest difference between points ``i`` and ``j`` that is beyond noise."""
        return NOISE_Z * np.sqrt(self.se[i] ** 2 + self.se[j] ** 2)

    @property
    def peak_index(self) -> int:
        return int(np.argmax(self.value))


def neighbour_scatter(batch_size, value) -> float:
    """Noise standard deviation of a single-repeat curve from its neighbour-to-neighbour scatter.

    Gasser-Sroka-Jennen-Steinmetz pseudo-residuals on the (possibly non-uniform) batch-size grid,
    scaled robustly (``1.4826 * median |residual|``); NaN with fewer than three interior points.
    """
    x, y = np.asarray(batch_size, dtype=float), np.asarray(value, dtype=float)
    if len(x) < 5:
        return float("nan")
    a = (x[2:] - x[1:-1]) / (x[2:] - x[:-2])
    b = 1 - a
    residuals = (a * y[:-2] + b * y[2:] - y[1:-1]) / np.sqrt(1 + a ** 2 + b ** 2)
    return float(1.4826 * np.median(np.abs(residuals)))


def curve(rows: pd.DataFrame, column: str) -> Curve:
    """The curve of ``column`` against ``batch_size`` over the repeats in ``rows``.

    Parameters
    ----------
    rows : pandas.DataFrame
        Rows of one curve (one gamma, one K, ...): columns ``batch_size`` and ``column``, one row
        per repeat.
    column : str
        The quantity (``"speedup"``, ``"target_efficiency"``, ...).
    """
    rows = rows.dropna(subset=[column])
    groups = rows.groupby("batch_size")[column]
    mean, count = groups.mean(), groups.count()
    x, y, n = mean.index.to_numpy(float), mean.to_numpy(float), count.to_numpy(float)
    if len(n) and (n >= 2).all():
        deviations = rows[column] - groups.transform("mean")
        s = math.sqrt(float((deviations ** 2).sum()) / float((n - 1).sum()))
        low, high = int(n.min()), int(n.max())
        repeats = f"{low}" if low == high else f"{low}-{high}"
        return Curve(x, y, s / np.sqrt(n), f"repeats ({repeats} per batch size)")
    return Curve(x, y, np.full(len(x), neighbour_scatter(x, y)), "neighbour scatter (1 repeat)")


def rises_then_falls(c: Curve, tolerance: float = 0.0) -> dict:
    """Whether a curve rises to an interior peak and falls after it, each beyond noise, with no reversal that counts.

    The peak is the largest mean. The *rise* is peak minus the value at the smallest batch size,
    the *fall* peak minus the value at the largest; each must exceed its margin. A peak at either
    end has a rise or fall of zero and fails. The curve must also be unimodal: up to the peak no
    later point lies below an earlier one, and from the peak on no later point lies above an earlier
    one, by more than their noise margin **and** by more than ``tolerance`` times the move it
    interrupts (the rise for a reversal before the peak, the fall for one after it). With
    ``tolerance = 0`` any reversal beyond noise counts (the pairwise test of
    :func:`falls_monotonically`, mirrored): a U or a sawtooth whose ends lie below its largest point
    then fails on its *reversal* (the largest such difference, reported with its batch sizes and as
    a share of the move it interrupts).

    Parameters
    ----------
    c : Curve
    tolerance : float
        Fraction of the rise or fall, >= 0, that a reversal must exceed besides its noise margin.

    Returns
    -------
    dict
        ``first``, ``peak_batch_size``, ``peak``, ``last``, ``rise``, ``fall``, ``rise_margin``,
        ``fall_margin``, ``largest_reversal`` (0 if none), ``largest_reversal_from`` / ``_to`` (batch
        sizes), ``largest_reversal_share`` (over the move it interrupts; NaN without a move),
        ``unimodal`` and ``rises_then_falls``.
    """
    first, last, peak = 0, len(c.value) - 1, c.peak_index
    rise, fall = c.value[peak] - c.value[first], c.value[peak] - c.value[last]
    rise_margin, fall_margin = float(c.margin(first, peak)), float(c.margin(peak, last))
    i, j = np.triu_indices(len(c.value), k=1)
    size = np.where(j <= peak, c.value[i] - c.value[j], np.where(i >= peak, c.value[j] - c.value[i], -np.inf))
    move = np.where(j <= peak, rise, fall)
    threshold = np.maximum(c.margin(i, j), tolerance * move)
    worst = int(np.argmax(size - threshold))
    unimodal = bool(size[worst] - threshold[worst] <= 0)
    reversal = float(max(size[worst], 0.0))
    return {"first": float(c.value[first]), "peak_batch_size": float(c.batch_size[peak]),
            "peak": float(c.value[peak]), "last": float(c.value[last]), "rise": float(rise),
            "fall": float(fall), "rise_margin": rise_margin, "fall_margin": fall_margin,
            "largest_reversal": reversal,
            "largest_reversal_from": float(c.batch_size[i[worst]]),
            "largest_reversal_to": float(c.batch_size[j[worst]]),
            "largest_reversal_share": reversal / float(move[worst]) if move[worst] > 0 else float("nan"),
            "unimodal": unimodal,
            "rises_then_falls": bool(rise > rise_margin and fall > fall_margin and unimodal)}


def falls_monotonically(c: Curve, tolerance: float = 0.0) -> dict:
    """Whether a curve falls from its smallest to its largest batch size with no rise that counts.

    No later point may exceed an earlier one by more than their noise margin **and** by more than
    ``tolerance`` times the curve's own fall (first minus last value; every pair, not only
    neighbours, so a slow climb over several points counts too), and the value at the largest batch
    size must lie below the value at the smallest by more than their margin. ``tolerance = 0``
    allows noise-sized bumps only.

    Returns
    -------
    dict
        ``first``, ``last``, ``fall``, ``fall_margin``, ``largest_rise`` (the rise that exceeds its
        threshold most, or comes closest), ``largest_rise_from`` / ``_to``, ``largest_rise_share``
        (over the fall; NaN when the curve does not fall), ``rises_beyond_noise`` (a rise that counts)
        and ``falls_monotonically``.
    """
    i, j = np.triu_indices(len(c.value), k=1)
    fall = float(c.value[0] - c.value[-1])
    threshold = np.maximum(c.margin(i, j), tolerance * max(fall, 0.0))
    excess = c.value[j] - c.value[i] - threshold
    worst = int(np.argmax(excess))
    fall_margin = float(c.margin(0, len(c.value) - 1))
    largest_rise = float(c.value[j[worst]] - c.value[i[worst]])
    return {"first": float(c.value[0]), "last": float(c.value[-1]), "fall": fall,
            "fall_margin": fall_margin, "largest_rise": largest_rise,
            "largest_rise_from": float(c.batch_size[i[worst]]),
            "largest_rise_to": float(c.batch_size[j[worst]]),
            "largest_rise_share": max(largest_rise, 0.0) / fall if fall > 0 else float("nan"),
            "rises_beyond_noise": bool(excess[worst] > 0),
            "falls_monotonically": bool(excess[worst] <= 0 and fall > fall_margin)}


def peak_region(c: Curve) -> tuple[float, float]:
    """Smallest and largest batch size whose value is within noise of the peak."""
    peak = c.peak_index
    near = c.value >= c.value[peak] - c.margin(np.arange(len(c.value)), peak)
    return float(c.batch_size[near].min()), float(c.batch_size[near].max())


def width_above(c: Curve, level) -> float:
    """Width (in batch sizes, ``B_hi - B_lo``) of the run of points around the peak at or above ``level``.

    ``level`` is a number or one number per point; 0 when the peak itself is below it.
    """
    above = c.value >= np.broadcast_to(level, c.value.shape)
    lo = hi = c.peak_index
    if not above[lo]:
        return 0.0
    while lo > 0 and above[lo - 1]:
        lo -= 1
    while hi < len(above) - 1 and above[hi + 1]:
        hi += 1
    return float(c.batch_size[hi] - c.batch_size[lo])


def half_power_width(c: Curve) -> tuple[float, float, float]:
    """Width of the range with value >= x/sqrt(2) (x the peak), and its noise interval.

    Returns ``(width, narrowest, widest)``: the width at the level ``x/sqrt(2)``, at that level
    raised by the noise of comparing a point with ``x/sqrt(2)`` (``NOISE_Z * sqrt(se_B**2 +
    se_peak**2 / 2)``) and at that level lowered by it. When the range at the lowered level reaches
    the largest batch size measured, the true range may go on beyond it: ``widest`` is then infinite.
    """
    level = c.value[c.peak_index] / math.sqrt(2)
    noise = NOISE_Z * np.sqrt(c.se ** 2 + c.se[c.peak_index] ** 2 / 2)
    widest = width_above(c, level - noise)
    if (c.value[c.peak_index:] >= level - noise[c.peak_index:]).all():
        widest = math.inf
    return width_above(c, level), width_above(c, level + noise), widest


def reverses_beyond_noise(intervals) -> bool:
    """Whether a quantity known up to an interval shrinks beyond noise at some step of a sequence.

    ``intervals`` are ``(low, high)`` pairs in order (densest K first); a step reverses when an
    interval's ``high`` lies below the previous one's ``low``.
    """
    return any(after[1] < before[0] for before, after in zip(intervals, intervals[1:]))


def grows_beyond_noise(intervals) -> bool:
    """Whether a quantity known up to an interval grows along a sequence, allowing noise.

    ``intervals`` are ``(low, high)`` pairs in order (densest K first). It grows when no step
    :func:`reverses_beyond_noise` and the last interval lies wholly above the first (the overall
    growth is beyond noise).
    """
    return bool(not reverses_beyond_noise(intervals) and intervals[-1][0] > intervals[0][1])


def growth_detectable(intervals) -> float:
    """The smallest growth from the first to the last interval that :func:`grows_beyond_noise` could show.

    The last interval must lie wholly above the first: a true growth of the centres must exceed the
    first interval's upper half-width plus the last one's lower half-width, taken here as half of
    each interval's width (the same unit as the intervals).
    """
    (first_low, first_high), (last_low, last_high) = intervals[0], intervals[-1]
    return float((first_high - first_low) / 2 + (last_high - last_low) / 2)


def tracks(leader: Curve, follower: Curve) -> dict:
    """Whether ``follower`` tracks ``leader`` over batch size.

    Both conditions must hold: the rank correlation (Spearman) of the two curves' means over their
    common batch sizes is positive at the one-sided 5 % level (a permutation-free t approximation,
    ``scipy.stats.spearmanr``), and their peak regions (:func:`peak_region`) overlap, so they peak
    at batch sizes that noise cannot tell apart. Rank correlation alone would pass a follower that
    only falls (both curves fall over most of the grid); overlapping peaks alone would pass a flat
    follower (its peak region is the whole grid).
    """
    from scipy.stats import spearmanr

    common = np.intersect1d(leader.batch_size, follower.batch_size)
    a = leader.value[np.isin(leader.batch_size, common)]
    b = follower.value[np.isin(follower.batch_size, common)]
    result = spearmanr(a, b, alternative="greater")
    correlation, p_value = float(result.statistic), float(result.pvalue)
    (lead_lo, lead_hi), (follow_lo, follow_hi) = peak_region(leader), peak_region(follower)
    overlap = lead_lo <= follow_hi and follow_lo <= lead_hi
    return {"rank_correlation": correlation, "p_value": p_value,
            "detectable_correlation": spearman_detectable(len(common)), "follower_peak_low": follow_lo,
            "follower_peak_high": follow_hi, "leader_peak_low": lead_lo, "leader_peak_high": lead_hi,
            "tracks": bool(p_value < 0.05 and overlap)}


def spearman_detectable(points: int, level: float = 0.05) -> float:
    """The smallest rank correlation of ``points`` pairs that the one-sided test of :func:`tracks` calls positive.

    Inverts scipy's t approximation, ``t = r sqrt((n - 2) / (1 - r^2))``, at the ``level`` quantile.
    """
    from scipy.stats import t as student

    if points < 3:
        return float("nan")
    critical = float(student.ppf(1 - level, points - 2))
    return critical / math.sqrt(points - 2 + critical ** 2)


